#!/usr/bin/env bash
# Runs C test programs: exit 0 = pass, 77 = skip, anything else = fail.
# Each runs from the repository root with a time limit; sanitizer reports
# make a test fail.
set -uo pipefail
cd "$(dirname "$0")/.."

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
LIMIT=${CHM_CTEST_TIMEOUT:-600}

pass=0 fail=0 skip=0
failed=()
if [ $# -eq 0 ]; then
	echo "c tests: none found"
	exit 0
fi
for bin in "$@"; do
	name=${bin#build/c/}
	log=$(mktemp)
	start=$EPOCHREALTIME
	timeout -k 10 "$LIMIT" "$bin" >"$log" 2>&1
	rc=$?
	# TSan cannot start on kernels with high ASLR entropy ("unexpected memory
	# mapping"): rerun without address randomisation rather than report it
	if [ $rc -ne 0 ] && grep -q "ThreadSanitizer: unexpected memory mapping" "$log"; then
		echo "== $name: TSan needs ASLR off on this kernel; rerunning under setarch -R"
		timeout -k 10 "$LIMIT" setarch "$(uname -m)" -R "$bin" >"$log" 2>&1
		rc=$?
	fi
	secs=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
	case $rc in
	0) pass=$((pass + 1)); status=PASS ;;
	77) skip=$((skip + 1)); status=SKIP ;;
	124) fail=$((fail + 1)); status="FAIL (timeout ${LIMIT}s)"; failed+=("$name") ;;
	*) fail=$((fail + 1)); status="FAIL (exit $rc)"; failed+=("$name") ;;
	esac
	echo "== $name: $status ${secs}s"
	if [ "$status" != PASS ]; then
		sed 's/^/   | /' "$log" | tail -n 60
	else
		sed 's/^/   | /' "$log" | tail -n 8
	fi
	rm -f "$log"
done
if ((fail)); then
	echo "failed: ${failed[*]}"
fi
echo "c tests: $pass passed, $fail failed, $skip skipped"
((fail == 0))
