#!/usr/bin/env bash
# Builds the `candle_ssl` Python package into a fresh virtual environment and tests it: the
# pytest suite (python/tests) and `mypy --strict` over the examples (examples/python).
#
#   python/test.sh            # from the repository root (or from anywhere)
#
# The wheel is built by `pip install ./python` (maturin's build backend, which runs cargo) into
# the workspace's target/ directory, so an earlier `cargo test --workspace --release` build is
# reused. The environment lives in a temporary directory and is removed afterwards; set
# KEEP_VENV=1 to keep it (its path is printed). Needs Python ≥ 3.9 with the venv module, and
# network access to PyPI for maturin, NumPy, pytest and mypy (or a pip configured with a
# mirror or a wheelhouse).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

python="${PYTHON:-}"
if [[ -z "$python" ]]; then
    for candidate in python3 python; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
            python="$candidate"
            break
        fi
    done
fi
if [[ -z "$python" ]]; then
    echo "=====================================================================" >&2
    echo "SKIPPED: no Python 3 on this machine; the Python package was not tested" >&2
    echo "=====================================================================" >&2
    exit 0
fi

# Pinned test tools (the build backend's own pin is python/pyproject.toml's).
PYTEST_VERSION="9.2.0"
MYPY_VERSION="2.4.1"
# mypy 2.x runs on Python ≥ 3.10; older interpreters get the last 1.x.
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    MYPY_VERSION="1.14.1"
    PYTEST_VERSION="8.3.5"
fi

venv="$(mktemp -d "${TMPDIR:-/tmp}/candle-ssl-venv.XXXXXX")"
cleanup() {
    if [[ "${KEEP_VENV:-0}" == "1" ]]; then
        echo "kept the virtual environment in $venv"
    else
        rm -rf "$venv"
    fi
}
trap cleanup EXIT

echo "== $("$python" --version) in a fresh virtual environment ($venv)"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install --quiet --upgrade pip || echo "(pip not upgraded; going on with $("${pip[@]}" --version))"

echo "== pip install ./python (maturin, cargo build --release into $root/target)"
started=$(date +%s)
log="$venv/pip-install.log"
if ! CARGO_TARGET_DIR="$root/target" "${pip[@]}" install ./python >"$log" 2>&1; then
    tail -n 80 "$log" >&2
    echo "pip install ./python failed; the end of its log is above ($log)" >&2
    KEEP_VENV=1
    exit 1
fi
echo "   built and installed in $(($(date +%s) - started)) s"

"${pip[@]}" install --quiet "pytest==$PYTEST_VERSION" "mypy==$MYPY_VERSION"

echo "== pytest python/tests"
# From the repository root, `import candle_ssl` is the installed package (not ./python/candle_ssl).
"$venv/bin/python" -m pytest python/tests -q -p no:cacheprovider

echo "== mypy --strict examples/python"
"$venv/bin/python" -m mypy --strict --cache-dir "$venv/mypy-cache" examples/python

echo "== the Python package passed"
