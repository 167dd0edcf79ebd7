#!/usr/bin/env bash
# Runs C test programs: exit 0 = pass, 77 = skip, anything else = fail.
# Each runs from the repository root with a time limit; sanitizer reports
# make a test fail. CHM_CTEST_JOBS programs run at once (default: the CPUs
# this process may use); the reports come in the order given, whatever
# order the programs end in.
set -uo pipefail
cd "$(dirname "$0")/.."

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
LIMIT=${CHM_CTEST_TIMEOUT:-600}
JOBS=${CHM_CTEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
if ! [[ $JOBS =~ ^[1-9][0-9]*$ ]]; then
	echo "run-c-tests.sh: CHM_CTEST_JOBS=$JOBS is not a positive number" >&2
	exit 2
fi

if [ $# -eq 0 ]; then
	echo "c tests: none found"
	exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One program: its output in $work/N.log, "rc seconds" in $work/N.rc.
run_one() {
	local i=$1 bin=$2 log=$work/$1.log start rc secs
	start=$EPOCHREALTIME
	timeout -k 10 "$LIMIT" "$bin" >"$log" 2>&1
	rc=$?
	# TSan cannot start on kernels with high ASLR entropy ("unexpected memory
	# mapping"): rerun without address randomisation rather than report it
	if [ $rc -ne 0 ] && grep -q "ThreadSanitizer: unexpected memory mapping" "$log"; then
		echo "== ${bin#build/c/}: TSan needs ASLR off on this kernel; rerunning under setarch -R" >"$work/$i.note"
		timeout -k 10 "$LIMIT" setarch "$(uname -m)" -R "$bin" >"$log" 2>&1
		rc=$?
	fi
	secs=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
	echo "$rc $secs" >"$work/$i.rc"
}

bins=("$@")
running=0
for i in "${!bins[@]}"; do
	if ((running >= JOBS)); then
		wait -n
		running=$((running - 1))
	fi
	run_one "$i" "${bins[$i]}" &
	running=$((running + 1))
done
wait

pass=0 fail=0 skip=0
failed=()
for i in "${!bins[@]}"; do
	name=${bins[$i]#build/c/}
	[ -f "$work/$i.note" ] && cat "$work/$i.note"
	read -r rc secs <"$work/$i.rc" 2>/dev/null || { rc=1 secs=0; }
	case $rc in
	0) pass=$((pass + 1)); status=PASS ;;
	77) skip=$((skip + 1)); status=SKIP ;;
	124) fail=$((fail + 1)); status="FAIL (timeout ${LIMIT}s)"; failed+=("$name") ;;
	*) fail=$((fail + 1)); status="FAIL (exit $rc)"; failed+=("$name") ;;
	esac
	echo "== $name: $status ${secs}s"
	if [ "$status" != PASS ]; then
		sed 's/^/   | /' "$work/$i.log" | tail -n 60
	else
		sed 's/^/   | /' "$work/$i.log" | tail -n 8
	fi
done
if ((fail)); then
	echo "failed: ${failed[*]}"
fi
echo "c tests: $pass passed, $fail failed, $skip skipped ($JOBS at a time)"
((fail == 0))
