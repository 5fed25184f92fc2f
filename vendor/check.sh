#!/usr/bin/env bash
# Checks that vendor/candle-core is the published candle-core package plus vendor/candle-core.patch,
# byte for byte (vendor/README.md, "Reproducing the vendored tree").
set -euo pipefail

readonly CRATE=candle-core
readonly VERSION=0.11.1
# The crates.io checksum of candle-core-0.11.1.crate, as in the registry index (and in the
# Cargo.lock of any project that depends on the published package).
readonly CRATE_SHA256=d11c8be87cfbaef9ebb62fb3f850d1fc8e00cc1d11d393fdbe55a4d5c2cdb325
# Paths of the published package that the vendored tree leaves out on purpose: cargo's packaging
# metadata, the package's lock file, and its tests, benches and examples (whose target sections
# and dev-dependencies the patch removes from Cargo.toml). Each must exist in the package; any
# other file missing from the vendored tree is a difference.
readonly DROPPED=(.cargo_vcs_info.json Cargo.lock Cargo.toml.orig benches examples tests)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
self="$here/$(basename "${BASH_SOURCE[0]}")"
vendor_dir="$here/$CRATE"
patch_file="$here/$CRATE.patch"
mode=check

usage() {
  cat <<EOF
Usage: vendor/check.sh [MODE] [--vendor DIR] [--patch FILE]

Rebuilds $CRATE $VERSION from the published package (the cargo registry cache, else
downloaded by \`cargo fetch\`, checked against its sha256) plus the patch, and compares the
result with the vendored tree byte for byte.

Modes:
  (none)          check; exit 0 if they agree, 1 if they differ, 2 on any other error
  --write-patch   rewrite the patch from the vendored tree (the published package against
                  DIR), then check
  --self-test     check that a one-byte change, an added file and a removed file in a copy of
                  the vendored tree are each caught, and that the unchanged copy passes

Options:
  --vendor DIR    the vendored tree [default: vendor/$CRATE]
  --patch FILE    the patch [default: vendor/$CRATE.patch]
  -h, --help      print this help
EOF
}

die() {
  echo "vendor/check.sh: error: $*" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --vendor) [ $# -ge 2 ] || die "--vendor needs a directory"; vendor_dir=$2; shift 2 ;;
    --patch) [ $# -ge 2 ] || die "--patch needs a file"; patch_file=$2; shift 2 ;;
    --write-patch) mode=write-patch; shift ;;
    --self-test) mode=self-test; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -d "$vendor_dir" ] || die "no vendored tree at '$vendor_dir' (pass --vendor DIR)"
vendor_dir=$(cd "$vendor_dir" && pwd)
for tool in sha256sum tar patch diff cmp; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed; it is needed to rebuild the package"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Prints the path of the published .crate file, fetching it with cargo if no registry cache
# holds a copy with the pinned checksum.
crate_file() {
  local registry="${CARGO_HOME:-$HOME/.cargo}/registry/cache"
  local name="$CRATE-$VERSION.crate" f
  find_cached() {
    for f in "$registry"/*/"$name"; do
      [ -f "$f" ] || continue
      if [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$CRATE_SHA256" ]; then
        echo "$f"
        return 0
      fi
      echo "vendor/check.sh: ignoring $f: its sha256 is not the published package's" >&2
    done
    return 1
  }
  find_cached && return 0
  command -v cargo >/dev/null || die "$name is not in $registry and cargo is not installed to fetch it"
  # A throwaway project that depends on the published package (no [patch]), its own workspace.
  local probe="$work/fetch"
  mkdir -p "$probe/src"
  : >"$probe/src/lib.rs"
  cat >"$probe/Cargo.toml" <<EOF
[package]
name = "vendor-check-fetch"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
$CRATE = "=$VERSION"

[workspace]
EOF
  echo "vendor/check.sh: fetching $CRATE $VERSION from the registry" >&2
  local host
  host=$(rustc -vV | sed -n 's/^host: //p') || die "rustc is needed to name the host for cargo fetch"
  cargo fetch --quiet --manifest-path "$probe/Cargo.toml" --target "$host" >&2 ||
    die "cargo could not fetch $CRATE $VERSION (is the registry reachable? CARGO_NET_OFFLINE set?)"
  # The index's checksum, which cargo checked the download against, must be the pinned one.
  local locked
  locked=$(grep -A3 "^name = \"$CRATE\"$" "$probe/Cargo.lock" | sed -n 's/^checksum = "\(.*\)"$/\1/p')
  [ "$locked" = "$CRATE_SHA256" ] ||
    die "the registry's checksum of $CRATE $VERSION is '$locked', the script pins $CRATE_SHA256"
  find_cached ||
    die "cargo fetched $CRATE $VERSION but no copy in $registry has sha256 $CRATE_SHA256 (cargo does not download a crate again while a copy is cached: delete the copies named above and run again)"
}

# Unpacks the published package into $work/published, without the DROPPED paths.
unpack_published() {
  local crate
  crate=$(crate_file)
  mkdir -p "$work/unpacked"
  tar -xzf "$crate" -C "$work/unpacked" --no-same-owner || die "could not unpack $crate"
  mv "$work/unpacked/$CRATE-$VERSION" "$work/published"
  local path
  for path in "${DROPPED[@]}"; do
    [ -e "$work/published/$path" ] ||
      die "'$path' is on the list of dropped paths but the published package has no such path; remove it from DROPPED"
    rm -rf "${work:?}/published/$path"
  done
}

# Lists the regular files under $1, relative to it, sorted.
files_of() {
  (cd "$1" && find . -type f | sed 's|^\./||' | LC_ALL=C sort)
}

check() {
  unpack_published
  [ -f "$patch_file" ] || die "no patch at '$patch_file' (pass --patch FILE)"
  cp -R "$work/published" "$work/expected"
  if ! patch -d "$work/expected" -p1 --batch --fuzz=0 --no-backup-if-mismatch --reject-file=- \
    <"$patch_file" >"$work/patch.log" 2>&1; then
    cat "$work/patch.log" >&2
    echo "vendor/check.sh: $patch_file does not apply exactly to the published $CRATE $VERSION." >&2
    echo "If vendor/$CRATE holds the intended change, rewrite the patch: vendor/check.sh --write-patch" >&2
    exit 1
  fi
  local only_expected only_vendored differing f
  only_expected=$(LC_ALL=C comm -23 <(files_of "$work/expected") <(files_of "$vendor_dir"))
  only_vendored=$(LC_ALL=C comm -13 <(files_of "$work/expected") <(files_of "$vendor_dir"))
  differing=$(LC_ALL=C comm -12 <(files_of "$work/expected") <(files_of "$vendor_dir") |
    while IFS= read -r f; do cmp -s "$work/expected/$f" "$vendor_dir/$f" || echo "$f"; done)
  if [ -z "$only_expected$only_vendored$differing" ]; then
    echo "vendor/check.sh: $vendor_dir is $CRATE $VERSION (sha256 $CRATE_SHA256) plus $(basename "$patch_file"), byte for byte ($(files_of "$vendor_dir" | wc -l) files; left out on purpose: ${DROPPED[*]})"
    return 0
  fi
  {
    echo "vendor/check.sh: $vendor_dir is not $CRATE $VERSION plus $(basename "$patch_file"):"
    [ -z "$differing" ] || sed 's/^/  differs: /' <<<"$differing"
    [ -z "$only_vendored" ] || sed 's/^/  only in the vendored tree: /' <<<"$only_vendored"
    [ -z "$only_expected" ] || sed 's/^/  missing from the vendored tree: /' <<<"$only_expected"
    if [ -n "$differing" ]; then
      echo "The first lines of the differences (published + patch -> vendored):"
      while IFS= read -r f; do
        diff -u --label "expected/$f" --label "vendored/$f" "$work/expected/$f" "$vendor_dir/$f" || true
      done <<<"$differing" | head -n 40
    fi
    echo "If the vendored tree holds the intended change, rewrite the patch from it with"
    echo "  vendor/check.sh --write-patch"
    echo "and describe the change in vendor/README.md; a published file the tree leaves out on purpose"
    echo "goes on the DROPPED list in vendor/check.sh. Otherwise restore the tree:"
    echo "  git checkout -- vendor/$CRATE"
  } >&2
  exit 1
}

write_patch() {
  unpack_published
  local out="$patch_file.tmp" f rc
  : >"$out"
  while IFS= read -r f; do
    if [ ! -e "$vendor_dir/$f" ]; then
      rm -f "$out"
      die "the vendored tree lacks '$f' of the published package: restore it, or add it to DROPPED in vendor/check.sh"
    fi
    rc=0
    diff -u --label "a/$f" --label "b/$f" "$work/published/$f" "$vendor_dir/$f" >>"$out" || rc=$?
    [ "$rc" -le 1 ] || { rm -f "$out"; die "diff failed on '$f' (a binary file cannot go in the patch)"; }
  done < <(files_of "$work/published")
  while IFS= read -r f; do
    rc=0
    diff -u --label /dev/null --label "b/$f" /dev/null "$vendor_dir/$f" >>"$out" || rc=$?
    [ "$rc" -le 1 ] || { rm -f "$out"; die "diff failed on '$f' (a binary file cannot go in the patch)"; }
  done < <(LC_ALL=C comm -13 <(files_of "$work/published") <(files_of "$vendor_dir"))
  mv "$out" "$patch_file"
  echo "vendor/check.sh: wrote $patch_file ($(wc -l <"$patch_file") lines)"
  rm -rf "${work:?}"/*
  check
}

# Runs the check on a copy of the vendored tree after `change` ($1, a function of the copy's
# path) and asserts its exit status ($2) and, on failure, that its message names $3.
expect() {
  local change=$1 want_rc=$2 want_name=$3 copy="$work/self-test/$CRATE" rc=0
  rm -rf "$work/self-test"
  mkdir -p "$work/self-test"
  cp -R "$vendor_dir" "$copy"
  "$change" "$copy"
  bash "$self" --vendor "$copy" --patch "$patch_file" >"$work/self-test.log" 2>&1 || rc=$?
  if [ "$rc" != "$want_rc" ] || { [ -n "$want_name" ] && ! grep -qF "$want_name" "$work/self-test.log"; }; then
    cat "$work/self-test.log" >&2
    echo "vendor/check.sh: self-test FAILED: after '$change' the check exited $rc (expected $want_rc${want_name:+, reporting '$want_name'})" >&2
    exit 1
  fi
  echo "vendor/check.sh: self-test: $change: exit $rc${want_name:+, reports '$want_name'}, as expected"
}

# Flips the lowest bit of the byte in the middle of file $1.
flip_middle_byte() {
  local size offset byte
  size=$(wc -c <"$1")
  offset=$((size / 2))
  byte=$(od -An -tu1 -j"$offset" -N1 "$1" | tr -d ' ')
  printf "\\$(printf '%03o' $((byte ^ 1)))" | dd of="$1" bs=1 seek="$offset" conv=notrunc status=none
}
unchanged() { :; }
flip_byte_in_patched_file() { flip_middle_byte "$1/src/backprop.rs"; }
flip_byte_in_unpatched_file() { flip_middle_byte "$1/src/shape.rs"; }
flip_byte_in_manifest() { flip_middle_byte "$1/Cargo.toml"; }
add_file() { echo "// stray" >"$1/src/stray.rs"; }
remove_file() { rm "$1/src/shape.rs"; }

self_test() {
  expect unchanged 0 ""
  expect flip_byte_in_patched_file 1 "differs: src/backprop.rs"
  expect flip_byte_in_unpatched_file 1 "differs: src/shape.rs"
  expect flip_byte_in_manifest 1 "differs: Cargo.toml"
  expect add_file 1 "only in the vendored tree: src/stray.rs"
  expect remove_file 1 "missing from the vendored tree: src/shape.rs"
  echo "vendor/check.sh: self-test passed"
}

case "$mode" in
  check) check ;;
  write-patch) write_patch ;;
  self-test) self_test ;;
esac
