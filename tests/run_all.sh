#!/usr/bin/env bash
# Runs the whole suite: C unit tests (one binary per tests/unit/test_*.c),
# then the Python tests (parity against reference packages, CLI, server).
# Prints one closing summary line from pytest; exits non-zero on any failure.
set -u
cd "$(dirname "$0")/.."
O=${O:-build}
export DELTAFIN_BIN=${DELTAFIN_BIN:-$PWD/$O/deltafin}
fail=0; passed=0; failed=0
for t in "$O"/tests/test_*; do
  [ -x "$t" ] || continue
  if "$t" > "$O/$(basename "$t").log" 2>&1; then passed=$((passed+1)); echo "unit ok   $(basename "$t")"
  else failed=$((failed+1)); fail=1; echo "unit FAIL $(basename "$t")"; tail -20 "$O/$(basename "$t").log"; fi
done
echo "C unit tests: $passed passed, $failed failed"
python3 -m pytest -q -p no:cacheprovider tests/py "$@"
rc=$?
[ $rc -eq 5 ] && rc=0   # no Python tests collected is not a failure of the C suite
[ $fail -ne 0 ] && exit 1
exit $rc
