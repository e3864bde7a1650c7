#!/usr/bin/env bash
# Density (issue 18 item 5): N idle sandboxes on one fresh all-in-one Cube at
# default settings, beside the floor, in one run (docs/benchmarks.md).
#
#   test/bench/density.sh CUBE_BINARY [N] [OUT_JSON] [more cube bench flags...]
#
# Runs test/bench/run.sh (own data dir, run dir, dataplane names, ports,
# transit, cgroup parent and node CIDR: nothing of a default Cube) with
# `cube bench --only floor,density`: the floor; serial create p50/p99 with 0
# sandboxes resident; N (default 2000) idle sandboxes, 4 creates in flight;
# memory per sandbox (shim + envd PSS + kernel objects); serial create p50/p99
# with N resident; SIGKILL of cube up and restart to /health and to every
# envd answering, with N resident; then every sandbox killed (kill latency
# with N up). run.sh tears everything down at the end (a last start without
# --keep-sandboxes reaps what is left and removes the dataplane).
# Needs root; the floor responder benchfloor must sit next to CUBE_BINARY.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[[ $# -ge 1 ]] || { echo "usage: $0 CUBE_BINARY [N] [OUT_JSON] [cube bench flags...]" >&2; exit 2; }
CUBE="$1"
N="${2:-2000}"
OUT="${3:-density-results.json}"
shift $(($# >= 3 ? 3 : $#))
export CUBE_BENCH_VETH="${CUBE_BENCH_VETH:-cubedens0}"
export CUBE_BENCH_TABLES="${CUBE_BENCH_TABLES:-cubedens}"
# Below the ephemeral range (the API port is one), clear of run.sh's and
# bursts.sh's defaults; 3000 ports for N sandboxes plus the probes.
export CUBE_BENCH_PORTS="${CUBE_BENCH_PORTS:-12000-14999}"
export CUBE_BENCH_TRANSIT="${CUBE_BENCH_TRANSIT:-169.254.250.32/30}"
export CUBE_BENCH_CGROUP="${CUBE_BENCH_CGROUP:-cubedens}"
# A /20 holds 4093 sandboxes.
export CUBE_BENCH_UP_FLAGS="--dp-name ${CUBE_BENCH_DP:-cubedens-dp} --node-cidr ${CUBE_BENCH_NODE_CIDR:-10.234.0.0/20} ${CUBE_BENCH_UP_FLAGS:-}"
exec bash "$HERE/run.sh" "$CUBE" "$OUT" --only floor,density --floor-n 100 \
	--density-cap "$N" --density-probe-n 50 --density-restart --restart-signal kill "$@"
