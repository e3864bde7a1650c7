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
#
# CUBE_E2E_MODE=cluster runs the same suite against cluster mode instead:
# `cube server` and two `cube cubelet`s on this host (host netns, distinct
# dataplane names, port ranges in 30000-32767, transit and sandbox subnets,
# cgroup parents and run dirs; both build the `base` template from the
# debootstrap cache). Afterwards it kills what the suite left through the API,
# stops the processes, runs the leak check, purges both dataplanes (nft
# tables, host veths, netns pins, cgroup parents) and checks the purge.
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
MODE="${CUBE_E2E_MODE:-allinone}"
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
[[ "$MODE" == allinone || "$MODE" == cluster ]] || { echo "e2e: CUBE_E2E_MODE must be allinone or cluster, not $MODE" >&2; exit 2; }
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
free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
PORT="$(free_port)"
URL="http://127.0.0.1:$PORT"
CUBE_PID=""
FAILED=0

CUBELET_PIDS=()
NODES=()
# Run dirs and dataplane netns names to check (one per node).
RUN_DIRS=("$RUN")
DP_NAMES=("$DP_NETNS_NAME")
if [[ "$MODE" == cluster ]]; then
	R="$(head -c 2 /dev/urandom | od -An -tx1 | tr -d ' \n')"
	NODES=(a b)
	# Random sub-ranges keep parallel runs apart; nothing here is routed
	# outside this host (sandbox subnets live inside the dataplane netns).
	PORT_BASE=$((30000 + (RANDOM % 7) * 390))
	OCT=$((1 + RANDOM % 250))
	RUN_DIRS=()
	DP_NAMES=()
	CGROUP_PARENTS=()
	for i in "${!NODES[@]}"; do
		n="${NODES[$i]}"
		RUN_DIRS+=("$TMP/run-$n")
		DP_NAMES+=("dp-e2e-$R-$n")
		for c in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
			CGROUP_PARENTS+=("${c%/}/cube-e2e-$R-$n" "${c%/}/cube-e2e-$R-$n-shims")
		done
	done
	# A stopped cubelet keeps its dataplane and its warm-pool slots (owned by
	# the pool, not by a sandbox); `cube node cleanup` removes them after.
	ALLOWED_NETNS_PINS_RE="^(dp-e2e-$R-[ab]|pool-[0-9a-f]+)\$"
	SANDBOX_LINK_RE='^(cv|cs|cube-sb|vcube)[0-9a-z-]*$'
	POOL_LINK_RE='^cvpool-'
	LOG="$TMP/server.log"
fi
node_flags() { # node index -> cubelet dataplane and placement flags
	local i=$1 n="${NODES[$1]}"
	local lo=$((PORT_BASE + i * 190))
	echo --run-dir "$TMP/run-$n" --data-dir "$DATA/node-$n" --cgroup-parent "cube-e2e-$R-$n" \
		--host-veth "ce$R$n" --table-prefix "ce$R$n" --dp-name "dp-e2e-$R-$n" \
		--port-range "$lo-$((lo + 189))" --transit "10.252.$OCT.$((i * 4))/30" \
		--node-cidr "172.28.$OCT.$((i * 128))/25"
}

fail() {
	echo "e2e: FAIL: $*" >&2
	FAILED=1
}

LOG_SHOWN=0
log_tail() {
	((LOG_SHOWN == 0)) || return 0
	LOG_SHOWN=1
	local f
	for f in "$LOG" "$TMP"/cubelet-*.log; do
		[[ -f "$f" ]] || continue
		echo "---- last 60 lines of $f ----" >&2
		tail -n 60 "$f" >&2 || true
		echo "-------------------------------" >&2
	done
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

# stop_pid PID NAME: SIGTERM, wait, SIGKILL after STOP_TIMEOUT_S.
stop_pid() {
	local pid=$1 name=$2
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		local i
		for ((i = 0; i < STOP_TIMEOUT_S * 10; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			fail "$name did not exit within ${STOP_TIMEOUT_S}s of SIGTERM; killing it"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	local rc=0
	wait "$pid" 2>/dev/null || rc=$?
	if ((rc != 0 && rc != 143)); then
		fail "$name exited with status $rc"
		log_tail
	fi
}

stop_cube() {
	[[ -n "$CUBE_PID" ]] || return 0
	stop_pid "$CUBE_PID" cube
	CUBE_PID=""
}

# stop_cluster kills the sandboxes the suite left through the API (what
# `cube up` does on SIGTERM; a stopping cubelet leaves its sandboxes
# running), then stops the cubelets and the server.
stop_cluster() {
	local id ids pid n
	if [[ -n "$CUBE_PID" ]] && kill -0 "$CUBE_PID" 2>/dev/null; then
		ids="$(curl -s -m 10 -H "X-API-Key: $API_KEY" "$URL/v2/sandboxes" |
			node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{try{for(const x of JSON.parse(s))console.log(x.sandboxID)}catch{}})' || true)"
		for id in $ids; do
			echo "e2e: killing sandbox $id left by the suite"
			curl -s -m 60 -o /dev/null -X DELETE -H "X-API-Key: $API_KEY" "$URL/sandboxes/$id" || true
		done
	fi
	for n in "${NODES[@]}"; do
		echo "e2e: node $n created $(grep -c 'msg="sandbox created"' "$TMP/cubelet-$n.log" || true) sandboxes"
	done
	for pid in "${CUBELET_PIDS[@]}"; do
		stop_pid "$pid" "cubelet (pid $pid)"
	done
	CUBELET_PIDS=()
	stop_cube
}

# purge_cluster removes what each stopped cubelet leaves in place on
# purpose (its dataplane and warm-pool slots) with the uninstall tool,
# `cube node cleanup`, then checks that nothing of them is left: host nft
# table and veth, netns pins, cgroup parents.
purge_cluster() {
	local i n run dp veth c bad=0
	for i in "${!NODES[@]}"; do
		n="${NODES[$i]}" run="$TMP/run-$n" dp="dp-e2e-$R-$n" veth="ce$R$n"
		# shellcheck disable=SC2046 # node_flags prints flags without spaces in values
		if ! "$CUBE" node cleanup --purge-state $(node_flags "$i") >>"$TMP/cleanup-$n.log" 2>&1; then
			fail "purge: cube node cleanup for node $n failed: $(tail -3 "$TMP/cleanup-$n.log")"
			bad=1
		fi
		nft delete table ip "$veth" 2>/dev/null || true
		ip link del "$veth" 2>/dev/null || true
		if [[ -e "$run/netns/$dp" ]]; then
			umount "$run/netns/$dp" 2>/dev/null || true
			rm -f "$run/netns/$dp" 2>/dev/null || true
		fi
		for c in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
			rmdir "${c%/}/cube-e2e-$R-$n-shims" 2>/dev/null || true
			rmdir "${c%/}/cube-e2e-$R-$n" 2>/dev/null || true
		done
		if nft list table ip "$veth" >/dev/null 2>&1; then
			fail "purge: nft table $veth left"
			bad=1
		fi
		if ip link show dev "$veth" >/dev/null 2>&1; then
			fail "purge: host veth $veth left"
			bad=1
		fi
		if [[ -e "$run/netns/$dp" ]]; then
			fail "purge: dataplane pin $run/netns/$dp left"
			bad=1
		fi
		for c in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
			if [[ -d "${c%/}/cube-e2e-$R-$n" || -d "${c%/}/cube-e2e-$R-$n-shims" ]]; then
				fail "purge: cgroup left under ${c%/}: cube-e2e-$R-$n(-shims)"
				bad=1
			fi
		done
	done
	return "$bad"
}

# leak_check_netns: netns pins other than the dataplane's, and sandbox
# links inside a still-pinned dataplane.
leak_check_netns() {
	local leaks=0 p name new
	# netns pins under the run dir(s).
	local k run dp
	for k in "${!RUN_DIRS[@]}"; do
		run="${RUN_DIRS[$k]}" dp="${DP_NAMES[$k]}"
		if [[ -d "$run/netns" ]]; then
			for p in "$run"/netns/*; do
				[[ -e "$p" ]] || continue
				name="$(basename "$p")"
				if [[ -n "$ALLOWED_NETNS_PINS_RE" && "$name" =~ $ALLOWED_NETNS_PINS_RE ]]; then
					continue
				fi
				fail "netns pin left: $p"
				leaks=1
			done
			# Per-sandbox links inside the dataplane netns, if it is still pinned.
			if [[ -e "$run/netns/$dp" ]]; then
				new="$(nsenter --net="$run/netns/$dp" ip -o -d link show 2>/dev/null |
					awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "$SANDBOX_LINK_RE" | grep -Ev "${POOL_LINK_RE:-^\$}" || true)"
				if [[ -n "$new" ]]; then
					fail "sandbox links left in $dp: $(echo $new)"
					leaks=1
				fi
				if nsenter --net="$run/netns/$dp" ip -o -d link show 2>/dev/null | grep -Eq "$SANDBOX_ALIAS_RE"; then
					fail "links with a sandbox alias left in $dp:"
					nsenter --net="$run/netns/$dp" ip -o -d link show | grep -E "$SANDBOX_ALIAS_RE" >&2 || true
					leaks=1
				fi
			fi
		fi
	done
	return "$leaks"
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

	leak_check_netns || leaks=1

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
		for p in "${RUN_DIRS[@]/%//netns/$id}" "${CGROUP_PARENTS[@]/%//$id}"; do
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
	local clean=1
	if [[ "$MODE" == cluster ]]; then
		stop_cluster
		# Sandbox links live in the dataplanes: look before purging them.
		leak_check_netns || clean=0
		purge_cluster || clean=0
	else
		stop_cube
	fi
	leak_check || clean=0
	if ((clean)); then
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

if [[ "$MODE" == cluster ]]; then
	echo "e2e: cluster mode: cube server on $URL, cubelets ${NODES[*]} (data dir $DATA, logs in $TMP)"
	"$CUBE" server --listen "127.0.0.1:$PORT" --data-dir "$DATA/server" --api-key "$API_KEY" >"$LOG" 2>&1 &
	CUBE_PID=$!
	for i in "${!NODES[@]}"; do
		n="${NODES[$i]}"
		# shellcheck disable=SC2046 # node_flags prints flags without spaces in values
		"$CUBE" cubelet --server "$URL" --node-id "e2e-$R-$n" --listen "127.0.0.1:$(free_port)" --advertise-ip 127.0.0.1 \
			$(node_flags "$i") >"$TMP/cubelet-$n.log" 2>&1 &
		CUBELET_PIDS+=("$!")
	done
else
	echo "e2e: starting $CUBE up on $URL (data dir $DATA, log $LOG)"
	"$CUBE" up --listen "127.0.0.1:$PORT" --data-dir "$DATA" --run-dir "$RUN" --api-key "$API_KEY" >"$LOG" 2>&1 &
	CUBE_PID=$!
fi

# healthy: the API answers; in cluster mode every node is also Ready.
healthy() {
	[[ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$URL/health" || true)" == 200 ]] || return 1
	[[ "$MODE" == cluster ]] || return 0
	local ready
	ready="$("$CUBE" node ls --json --server "$URL" --api-key "$API_KEY" 2>/dev/null |
		node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{try{console.log(JSON.parse(s).filter(n=>n.state==="Ready").length)}catch{console.log(0)}})' || true)"
	[[ "$ready" == "${#NODES[@]}" ]]
}
alive() {
	kill -0 "$CUBE_PID" 2>/dev/null || return 1
	local pid
	for pid in "${CUBELET_PIDS[@]}"; do
		kill -0 "$pid" 2>/dev/null || return 1
	done
}

deadline=$((SECONDS + HEALTH_TIMEOUT_S))
until healthy; do
	if ! alive; then
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
if [[ "$MODE" == cluster ]]; then
	"$CUBE" node ls --server "$URL" --api-key "$API_KEY" || true
fi
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
