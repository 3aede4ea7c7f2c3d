#!/usr/bin/env bash
# The README's test command beside CPU-bound jobs (issue 36, "steady under load"): no verdict
# may depend on how busy the machine is, so the default suite must pass with busy loops
# competing for the cores. Starts HOGS (default 2) processes that spin at normal priority,
# runs pytest with the arguments given (none: the default suite), stops the hogs, and exits
# with pytest's status.
#
#   tests/run_beside_hog.sh                                # the default suite beside 2 hogs
#   HOGS=3 tests/run_beside_hog.sh tests/integration/emulator -n 2
#
# PYTEST (default .venv/bin/pytest) and PYTHON (default python3) choose the interpreters.
set -euo pipefail
cd "$(dirname "$0")/.."

hogs=${HOGS:-2}
pytest=${PYTEST:-.venv/bin/pytest}
python=${PYTHON:-python3}
pids=()
stop_hogs() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}
trap stop_hogs EXIT

for _ in $(seq "$hogs"); do
  "$python" -c 'while True: pass' &
  pids+=("$!")
done
echo "== pytest $* beside $hogs CPU-bound processes (pids ${pids[*]}); load: $(cut -d' ' -f1-3 /proc/loadavg)"
started=$SECONDS
status=0
"$pytest" "$@" || status=$?
echo "== beside $hogs CPU hogs: exit $status in $((SECONDS - started)) s; load: $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$status"
