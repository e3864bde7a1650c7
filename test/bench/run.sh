#!/usr/bin/env bash
# Benchmarks a fresh all-in-one Cube: `make bench` runs this.
#
#   test/bench/run.sh CUBE_BINARY [OUT_JSON] [cube bench flags...]
#
# Starts `CUBE up --keep-sandboxes` on a free loopback port with its own data
# dir, run dir, host veth, nft tables, port range, transit subnet and cgroup
# parent (so it does not collide with another Cube on this host), runs
# `CUBE bench` against it (all phases; the restart phase restarts that
# cube up), writes OUT_JSON (default bench-results.json), then tears
# everything down: the last cube up is stopped, and one more start without
# --keep-sandboxes reaps whatever is left and removes the dataplane.
# CUBE_BENCH_KEEP_LOGS=1 keeps the cube up logs (not the data) in the temp dir.
# Needs root, node and npm; the floor responder must sit next to CUBE
# (benchfloor, built by `make bench`).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[[ $# -ge 1 ]] || { echo "usage: $0 CUBE_BINARY [OUT_JSON] [cube bench flags...]" >&2; exit 2; }
CUBE="$(readlink -f "$1")"
OUT="${2:-bench-results.json}"
shift $(($# >= 2 ? 2 : 1))
[[ "$(id -u)" == 0 ]] || { echo "bench: must run as root" >&2; exit 2; }
export CUBE_CACHE_DIR="${CUBE_CACHE_DIR:-/var/cache/cube}"

TMP="$(mktemp -d /tmp/cube-bench.XXXXXX)"
DATA="$TMP/data"
RUN="$TMP/run"
mkdir -p "$DATA" "$RUN"
API_KEY="bench_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
source "$HERE/lib.sh"
PORT="$(free_port)"
URL="http://127.0.0.1:$PORT"
# Its Prometheus /metrics: the metrics phase creates with it scraped and not.
METRICS_PORT="$(free_port)"
# Names and ranges of this Cube; override to run two benches at once. The
# host-port range must stay clear of the API port (an ephemeral one, >= 32768):
# the host DNATs the whole range to the dataplane.
UP_FLAGS=(
	--listen "127.0.0.1:$PORT" --data-dir "$DATA" --run-dir "$RUN" --api-key "$API_KEY"
	--host-veth "${CUBE_BENCH_VETH:-cubebench0}" --table-prefix "${CUBE_BENCH_TABLES:-cubebench}"
	--port-range "${CUBE_BENCH_PORTS:-30000-32499}" --transit "${CUBE_BENCH_TRANSIT:-169.254.250.8/30}"
	--cgroup-parent "${CUBE_BENCH_CGROUP:-cubebench}"
	# The bench measures capacity, not the per-key policy (a limit set in
	# the environment would stop the density phase with 429s).
	--create-rate-limit off --api-rate-limit off
	--metrics-listen "127.0.0.1:$METRICS_PORT"
)
# More `cube up` flags for the benched Cube (also used by the teardown start),
# e.g. CUBE_BENCH_UP_FLAGS="--pool-size 64 --pool-prestart=false".
read -r -a EXTRA_UP_FLAGS <<<"${CUBE_BENCH_UP_FLAGS:-}"
UP_FLAGS+=("${EXTRA_UP_FLAGS[@]}")

up_pid() { cat "$DATA/cube.pid" 2>/dev/null || true; }

# wait_healthy PID: wait until the cube up PID answers /health.
wait_healthy() {
	local deadline=$((SECONDS + 600))
	until [[ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$URL/health" || true)" == 200 ]]; do
		kill -0 "$1" 2>/dev/null || { echo "bench: cube up exited; see $TMP/*.log" >&2; return 1; }
		((SECONDS < deadline)) || { echo "bench: cube not healthy; see $TMP/*.log" >&2; return 1; }
		sleep 0.2
	done
}

stop_up() {
	local pid i
	pid="$(up_pid)"
	[[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 1200; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	echo "bench: cube up $pid did not stop; killing it" >&2
	kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_up
	# A last start without --keep-sandboxes re-adopts and then kills every
	# sandbox left over and removes the dataplane when it stops.
	"$CUBE" up "${UP_FLAGS[@]}" >>"$TMP/teardown.log" 2>&1 &
	local pid=$!
	if wait_healthy "$pid"; then
		kill -TERM "$pid"
	else
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
	rmdir /sys/fs/cgroup/*/"${CUBE_BENCH_CGROUP:-cubebench}"{,-shims} 2>/dev/null || true
	if grep -qs "$TMP" /proc/self/mountinfo || pgrep -f -- "$TMP" >/dev/null; then
		echo "bench: leaving $TMP (mounts or processes left)" >&2
	elif [[ -n "${CUBE_BENCH_KEEP_LOGS:-}" ]]; then
		rm -rf "$TMP/data" "$TMP/run"
		echo "bench: logs kept in $TMP" >&2
	else
		rm -rf "$TMP"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "bench: starting cube up on $URL (data dir $DATA)"
"$CUBE" up "${UP_FLAGS[@]}" --keep-sandboxes >"$TMP/cube.log" 2>&1 &
wait_healthy $!
# With CUBE_BENCH_POOL_READY=N, wait until the warm pool holds N complete
# slots (each has <data-dir>/node/pool/<id>.img.json), so the phases do not
# race the pool's first fill.
if [[ -n "${CUBE_BENCH_POOL_READY:-}" ]]; then
	deadline=$((SECONDS + 600))
	until (($(find "$DATA/node/pool" -name 'pool-*.json' 2>/dev/null | wc -l) >= CUBE_BENCH_POOL_READY)); do
		((SECONDS < deadline)) || { echo "bench: warm pool not full; see $TMP/cube.log" >&2; exit 1; }
		sleep 0.5
	done
	echo "bench: warm pool has $CUBE_BENCH_POOL_READY slots"
fi
echo "bench: cube healthy; running cube bench"
"$CUBE" bench --server "$URL" --api-key "$API_KEY" --data-dir "$DATA" \
	--metrics-url "http://127.0.0.1:$METRICS_PORT/metrics" \
	--cgroup-parent "${CUBE_BENCH_CGROUP:-cubebench}" --sdk-dir "$HERE" \
	--restart-log "$TMP/cube-restarted.log" --json "$OUT" "$@"
echo "bench: results in $OUT"
