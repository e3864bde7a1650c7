#!/usr/bin/env bash
# Repeated bursts against one fresh all-in-one Cube: what the adaptive warm
# pool is for (docs/capacity.md, docs/benchmarks.md).
#
#   test/bench/bursts.sh CUBE_BINARY [BURSTS] [SIZE] [GAP_S] [-- cube up flags...]
#
# Starts `CUBE up` with its own data dir, run dir, netns name, host veth, nft
# tables, ports 32500-32767, transit and cgroup parent (override with the
# CUBE_BENCH_* variables of run.sh), waits 20 s for the pool's floor, then
# BURSTS times (default 3): SIZE (default 50) concurrent REST creates through
# `cube bench --only concurrent`, then GAP_S (default 30) idle seconds. Cube
# stops without --keep-sandboxes at the end: sandboxes and dataplane go.
# With CUBE_BENCH_METRICS=FILE, Cube also serves its Prometheus metrics and
# the last scrape (after the last burst) is written to FILE: the API's
# request durations, the cubelet's create steps, the store's queries.
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 CUBE_BINARY [BURSTS] [SIZE] [GAP_S] [-- cube up flags...]" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] || { echo "bursts: must run as root" >&2; exit 2; }
CUBE="$(readlink -f "$1")"
shift
BURSTS=3 SIZE=50 GAP=30
for v in BURSTS SIZE GAP; do
	[[ $# -gt 0 && "$1" != "--" ]] || break
	printf -v "$v" '%s' "$1"
	shift
done
[[ "${1:-}" == "--" ]] && shift
export CUBE_CACHE_DIR="${CUBE_CACHE_DIR:-/var/cache/cube}"
TMP="$(mktemp -d /tmp/cube-bursts.XXXXXX)"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
KEY="bursts_$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
PORT="$(free_port)"
URL="http://127.0.0.1:$PORT"
METRICS=()
if [[ -n "${CUBE_BENCH_METRICS:-}" ]]; then
	MPORT="$(free_port)"
	METRICS=(--metrics-listen "127.0.0.1:$MPORT")
fi
"$CUBE" up --listen "127.0.0.1:$PORT" --data-dir "$TMP/data" --run-dir "$TMP/run" --api-key "$KEY" \
	--dp-name "${CUBE_BENCH_DP:-cubebursts-dp}" --host-veth "${CUBE_BENCH_VETH:-cubebursts0}" \
	--table-prefix "${CUBE_BENCH_TABLES:-cubebursts}" --port-range "${CUBE_BENCH_PORTS:-32500-32767}" \
	--transit "${CUBE_BENCH_TRANSIT:-169.254.250.24/30}" --cgroup-parent "${CUBE_BENCH_CGROUP:-cubebursts}" \
	--node-cidr "${CUBE_BENCH_NODE_CIDR:-10.233.0.0/20}" --pool-templates= "${METRICS[@]}" "$@" >"$TMP/up.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid; rm -rf "$TMP"' EXIT
until [[ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$URL/health" || true)" == 200 ]]; do
	kill -0 "$pid" 2>/dev/null || { echo "bursts: cube up exited:" >&2; tail -20 "$TMP/up.log" >&2; exit 1; }
	sleep 0.3
done
sleep 20
for ((i = 1; i <= BURSTS; i++)); do
	echo "-- burst $i (load $(cut -d' ' -f1 /proc/loadavg))"
	"$CUBE" bench --server "$URL" --api-key "$KEY" --only concurrent --n-concurrent "$SIZE" --concurrency "$SIZE" 2>/dev/null |
		grep "concurrent"
	((i == BURSTS)) || sleep "$GAP"
done
if [[ -n "${CUBE_BENCH_METRICS:-}" ]]; then
	curl -sf -m 5 "http://127.0.0.1:$MPORT/metrics" >"$CUBE_BENCH_METRICS"
fi
