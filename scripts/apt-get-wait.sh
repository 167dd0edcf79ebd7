# shellcheck shell=bash
# Sourced by scripts/setup.sh. apt_get ARGS... runs `apt-get ARGS...` (with
# $SUDO when set), and while another package manager holds the dpkg or the
# apt lists lock it waits and retries: every CHM_APT_LOCK_STEP seconds
# (default 5), for at most CHM_APT_LOCK_WAIT seconds (default 300), saying
# so each time. Any other failure, or the lock still held at the end,
# returns apt-get's exit status. CHM_APT_OPTS adds options (e.g. -o Dir=...).
apt_get() {
	local limit=${CHM_APT_LOCK_WAIT:-300} step=${CHM_APT_LOCK_STEP:-5} waited=0 rc err holder
	err=$(mktemp)
	while :; do
		rc=0
		# shellcheck disable=SC2086 # SUDO and CHM_APT_OPTS are lists of words
		${SUDO:-} apt-get ${CHM_APT_OPTS:-} "$@" 2>"$err" || rc=$?
		if [ "$rc" -eq 0 ] ||
			! grep -qE 'Could not get lock|Unable to acquire the dpkg frontend lock|Unable to lock' "$err"; then
			cat "$err" >&2
			rm -f "$err"
			return "$rc"
		fi
		if [ "$waited" -ge "$limit" ]; then
			cat "$err" >&2
			rm -f "$err"
			echo "chm: the package manager lock is still held after ${limit} s" \
				"(CHM_APT_LOCK_WAIT); let the other install finish, then rerun" >&2
			return "$rc"
		fi
		holder=$(grep -m1 -oE 'held by process [0-9]+( \([^)]*\))?' "$err" || echo "held")
		echo "chm: waiting for the package manager lock (${holder}): ${waited} of ${limit} s" >&2
		sleep "$step"
		waited=$((waited + step))
	done
}
