#!/usr/bin/env bash
# Runs the e2b SDK end-to-end suite against a fresh all-in-one Cube.
#
#   test/e2e/run.sh CUBE_BINARY [node --test args...]
#
# Starts `CUBE up` on a free loopback port with a throwaway data dir and run
# dir, waits for /health, runs `node --test` here with E2B_API_URL,
# E2B_SANDBOX_URL and E2B_API_KEY set, stops Cube with SIGTERM and checks that
# nothing was leaked (processes, netns pins, links, cgroups, mounts).
# Exits non-zero on any failure. Needs root, node >= 20.18 and npm.
set -euo pipefail

# ---- names the leak check knows (adjust here when the implementation changes) ----
# cgroup parents; any child created during the run and still present is a leak.
CGROUP_PARENTS=(
	/sys/fs/cgroup/memory/cube
	/sys/fs/cgroup/pids/cube
	/sys/fs/cgroup/cpu/cube
	/sys/fs/cgroup/cpuacct/cube
	/sys/fs/cgroup/freezer/cube
	/sys/fs/cgroup/cube
)
# Per-sandbox link names (inside cube-dp: cv<shortid>; the alias carries the id).
SANDBOX_LINK_RE='^(cv|cs|cube-sb|vcube)[0-9a-z-]*$'
# netns pins under <run dir>/netns that may survive a clean shutdown (regex; '' = none).
ALLOWED_NETNS_PINS_RE='^cube-dp$'
# Name of the dataplane netns pin, searched for leaked per-sandbox links.
DP_NETNS_NAME='cube-dp'
# `ip -o -d link` text that marks a link as owned by a sandbox (alias = sandbox id).
SANDBOX_ALIAS_RE=' alias [a-z0-9]{8,}'

HEALTH_TIMEOUT_S="${CUBE_E2E_HEALTH_TIMEOUT:-600}" # first start may debootstrap `base`
TEST_TIMEOUT_S="${CUBE_E2E_TEST_TIMEOUT:-600}"
STOP_TIMEOUT_S=60
# --------------------------------------------------------------------------------

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
	echo "usage: $0 CUBE_BINARY [node --test args...]" >&2
	exit 2
}
[[ $# -ge 1 ]] || usage
CUBE="$(readlink -f "$1")"
shift
[[ -x "$CUBE" ]] || { echo "e2e: $CUBE is not an executable" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] || { echo "e2e: must run as root (sandboxes need namespaces, cgroups, nftables)" >&2; exit 2; }
command -v node >/dev/null || { echo "e2e: node not found (make deps)" >&2; exit 2; }

export CUBE_CACHE_DIR="${CUBE_CACHE_DIR:-/var/cache/cube}"

if [[ ! -f "$HERE/node_modules/.package-lock.json" || "$HERE/package-lock.json" -nt "$HERE/node_modules/.package-lock.json" ]]; then
	echo "e2e: npm ci"
	(cd "$HERE" && npm ci --no-audit --no-fund --loglevel=error)
fi

TMP="$(mktemp -d /tmp/cube-e2e.XXXXXX)"
DATA="$TMP/data"
RUN="$TMP/run"
LOG="$TMP/cube.log"
export CUBE_E2E_IDS_FILE="$TMP/sandbox-ids" # the suite appends every sandbox id it creates
: >"$CUBE_E2E_IDS_FILE"
mkdir -p "$DATA" "$RUN"
API_KEY="e2b_$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
PORT="$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
URL="http://127.0.0.1:$PORT"
CUBE_PID=""
FAILED=0

fail() {
	echo "e2e: FAIL: $*" >&2
	FAILED=1
}

LOG_SHOWN=0
log_tail() {
	((LOG_SHOWN == 0)) || return 0
	LOG_SHOWN=1
	echo "---- last 60 lines of $LOG ----" >&2
	tail -n 60 "$LOG" >&2 || true
	echo "-------------------------------" >&2
}

# Snapshots for diffing: what existed before Cube started is not ours.
list_cgroups() {
	local p
	for p in "${CGROUP_PARENTS[@]}"; do
		[[ -d "$p" ]] && find "$p" -mindepth 1 -maxdepth 1 -type d 2>/dev/null
	done | sort
}
list_host_links() {
	ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | sort
}
CGROUPS_BEFORE="$(list_cgroups || true)"
LINKS_BEFORE="$(list_host_links || true)"

stop_cube() {
	[[ -n "$CUBE_PID" ]] || return 0
	if kill -0 "$CUBE_PID" 2>/dev/null; then
		kill -TERM "$CUBE_PID" 2>/dev/null || true
		local i
		for ((i = 0; i < STOP_TIMEOUT_S * 10; i++)); do
			kill -0 "$CUBE_PID" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$CUBE_PID" 2>/dev/null; then
			fail "cube did not exit within ${STOP_TIMEOUT_S}s of SIGTERM; killing it"
			kill -KILL "$CUBE_PID" 2>/dev/null || true
		fi
	fi
	local rc=0
	wait "$CUBE_PID" 2>/dev/null || rc=$?
	CUBE_PID=""
	if ((rc != 0 && rc != 143)); then
		fail "cube exited with status $rc"
		log_tail
	fi
}

leak_check() {
	local leaks=0 pids p name new

	# Processes mentioning our temp dir (shims, envd, sandbox-init ...).
	pids="$(pgrep -f -- "$TMP" || true)"
	if [[ -n "$pids" ]]; then
		fail "processes left:"
		for p in $pids; do ps -o pid=,ppid=,args= -p "$p" >&2 || true; done
		leaks=1
	fi

	# netns pins under the run dir.
	if [[ -d "$RUN/netns" ]]; then
		for p in "$RUN"/netns/*; do
			[[ -e "$p" ]] || continue
			name="$(basename "$p")"
			if [[ -n "$ALLOWED_NETNS_PINS_RE" && "$name" =~ $ALLOWED_NETNS_PINS_RE ]]; then
				continue
			fi
			fail "netns pin left: $p"
			leaks=1
		done
		# Per-sandbox links inside the dataplane netns, if it is still pinned.
		if [[ -e "$RUN/netns/$DP_NETNS_NAME" ]]; then
			new="$(nsenter --net="$RUN/netns/$DP_NETNS_NAME" ip -o -d link show 2>/dev/null |
				awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "$SANDBOX_LINK_RE" || true)"
			if [[ -n "$new" ]]; then
				fail "sandbox links left in $DP_NETNS_NAME: $(echo $new)"
				leaks=1
			fi
			if nsenter --net="$RUN/netns/$DP_NETNS_NAME" ip -o -d link show 2>/dev/null | grep -Eq "$SANDBOX_ALIAS_RE"; then
				fail "links with a sandbox alias left in $DP_NETNS_NAME:"
				nsenter --net="$RUN/netns/$DP_NETNS_NAME" ip -o -d link show | grep -E "$SANDBOX_ALIAS_RE" >&2 || true
				leaks=1
			fi
		fi
	fi

	# Host links that appeared during the run, look like sandbox links and
	# name one of our sandboxes (other software may add links meanwhile).
	new="$(comm -13 <(echo "$LINKS_BEFORE") <(list_host_links || true) | grep -E "$SANDBOX_LINK_RE" || true)"
	for name in $new; do
		[[ -s "$CUBE_E2E_IDS_FILE" ]] || break
		if ip -o -d link show dev "$name" 2>/dev/null | grep -qFf <(grep . "$CUBE_E2E_IDS_FILE"); then
			fail "sandbox link left in the host netns: $name"
			leaks=1
		fi
	done
	# Anything still named after one of our sandboxes: netns pins, cgroups.
	local id
	while read -r id; do
		[[ -n "$id" ]] || continue
		for p in "$RUN/netns/$id" "${CGROUP_PARENTS[@]/%//$id}"; do
			if [[ -e "$p" ]]; then
				fail "left behind for sandbox $id: $p"
				leaks=1
			fi
		done
	done <"$CUBE_E2E_IDS_FILE"

	# cgroups created during the run.
	new="$(comm -13 <(echo "$CGROUPS_BEFORE") <(list_cgroups || true))"
	if [[ -n "$new" ]]; then
		fail "cgroups left: $(echo $new)"
		leaks=1
	fi

	# Mounts under the temp dir (overlays, netns pins, ...).
	new="$(awk -v d="$TMP" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo)"
	if [[ -n "$new" ]]; then
		fail "mounts left under $TMP: $(echo $new)"
		leaks=1
	fi
	return "$leaks"
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_cube
	if leak_check; then
		rm -rf "$TMP"
	else
		# Never rm -rf across leftover mounts; keep everything for inspection.
		echo "e2e: leaving $TMP for inspection (leaks found)" >&2
		FAILED=1
	fi
	if ((rc != 0 || FAILED != 0)); then
		echo "e2e: FAILED" >&2
		exit 1
	fi
	echo "e2e: PASS"
	exit 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "e2e: starting $CUBE up on $URL (data dir $DATA, log $LOG)"
"$CUBE" up --listen "127.0.0.1:$PORT" --data-dir "$DATA" --run-dir "$RUN" --api-key "$API_KEY" >"$LOG" 2>&1 &
CUBE_PID=$!

deadline=$((SECONDS + HEALTH_TIMEOUT_S))
until [[ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$URL/health" || true)" == 200 ]]; do
	if ! kill -0 "$CUBE_PID" 2>/dev/null; then
		fail "cube exited before becoming healthy"
		log_tail
		exit 1
	fi
	if ((SECONDS > deadline)); then
		fail "cube not healthy after ${HEALTH_TIMEOUT_S}s"
		log_tail
		exit 1
	fi
	sleep 0.5
done
echo "e2e: cube healthy after ${SECONDS}s; running the suite"

set +e
(
	cd "$HERE" &&
		E2B_API_URL="$URL" E2B_SANDBOX_URL="$URL" E2B_API_KEY="$API_KEY" \
			timeout --kill-after=10 "$TEST_TIMEOUT_S" \
			node --test --test-concurrency=4 --test-timeout=180000 "$@"
)
TEST_RC=$?
set -e
if ((TEST_RC != 0)); then
	fail "node --test exited with $TEST_RC"
	log_tail
fi
# cleanup (EXIT trap) stops Cube, checks for leaks and sets the exit status.
exit "$TEST_RC"
