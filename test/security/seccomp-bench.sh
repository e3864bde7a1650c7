#!/usr/bin/env bash
# Prices the seccomp allowlist against the deny list it replaced, in one
# run on one machine (root; not part of any suite; docs/benchmarks.md):
# sandbox create latency (BenchmarkStart/unlimited) and syscalls inside a
# sandbox (BenchmarkSyscallLoop), each with cube-shim (the shim and
# sandbox-init, which installs the filter) built from this tree and from
# REF, alternating ROUNDS times.
#   bash test/security/seccomp-bench.sh [REF] [ROUNDS]
# REF defaults to 44c321c, the last commit with the deny list.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REF="${1:-44c321c}"
ROUNDS="${2:-2}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/old"
git -C "$ROOT" archive "$REF" | tar -x -C "$tmp/old"
(cd "$tmp/old" && CGO_ENABLED=0 go build -o "$tmp/cube-shim-denylist" ./cmd/cube-shim)
(cd "$ROOT" && CGO_ENABLED=0 go build -o "$tmp/cube-shim-allowlist" ./cmd/cube-shim)
cd "$ROOT/test/security"
go test -c -o "$tmp/security.test" .
for round in $(seq "$ROUNDS"); do
	for filter in denylist allowlist; do
		echo "# round $round: $filter ($([[ $filter == denylist ]] && echo "$REF" || echo "working tree"))"
		CUBE_BENCH_EXE="$tmp/cube-shim-$filter" "$tmp/security.test" -test.run '^$' \
			-test.bench 'Start/unlimited$' -test.benchtime 30x | grep -E '^Benchmark'
		CUBE_BENCH_EXE="$tmp/cube-shim-$filter" "$tmp/security.test" -test.run '^$' \
			-test.bench 'SyscallLoop' -test.benchtime 3x | grep -E '^Benchmark'
	done
done
