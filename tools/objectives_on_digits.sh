#!/usr/bin/env bash
# Every objective's default run on the digits for EPOCHS epochs (default 5), one after the
# other: its name, ok or FAIL, wall seconds, training seconds (data wait, forward, loss,
# backward and optimiser from results.json's phases) and the trained encoder's k-NN accuracy.
# A failed run's last lines are in OUT/NAME.log.
#
#   cargo build --release --bin ssl
#   tools/objectives_on_digits.sh [OUT]      # EPOCHS=5 SSL=target/release/ssl
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ssl=${SSL:-$root/target/release/ssl}
out=${1:-$(mktemp -d)}
epochs=${EPOCHS:-5}
mkdir -p "$out"
for objective in $("$ssl" list | awk '/^[a-z]/ {print $1}'); do
  started=$(date +%s.%N)
  status=ok
  "$ssl" run --objective "$objective" --epochs "$epochs" --out "$out/$objective" --overwrite \
    >"$out/$objective.log" 2>&1 || status=FAIL
  wall=$(echo "$(date +%s.%N) - $started" | bc)
  read -r train knn < <(python3 - "$out/$objective/results.json" <<'EOF' 2>/dev/null || true
import json, sys
r = json.load(open(sys.argv[1]))
p = r["phases"]
train = sum(p[k] for k in ("data_wait", "forward", "loss", "backward", "optimiser"))
print(round(train, 2), round(r["rows"][-1]["metrics"]["knn_accuracy"], 3))
EOF
  ) || true  # a refused run has no results.json: `read` meets EOF, which must not end the pass
  printf '%s %s %.1f %s %s\n' "$objective" "$status" "$wall" "${train:--}" "${knn:--}"
done
