#!/usr/bin/env bash
# Runs the unit and integration tests as an unprivileged user (nobody), the
# way a contributor without root runs `go test ./...`: pure tests must run
# and pass, tests that need root must report SKIP with a reason (never a
# silent "ok" from a TestMain that exits early).
#
#   hack/unit-nonroot.sh [go test args...]   (default: -count=1 ./internal/... ./test/...)
#
# Needs root to set up: a copy of the tree readable by nobody, a private
# GOCACHE, and the module cache bound read-only (root's home is 0700), with
# GOPROXY=off so nothing is fetched. Prints the SKIP reasons at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ "$(id -u)" == 0 ]] || { echo "unit-nonroot: run as root (it drops to nobody itself)" >&2; exit 2; }
(($# > 0)) || set -- -count=1 ./internal/... ./test/...
WORK="$(mktemp -d /tmp/cube-nonroot.XXXXXX)"
MOD="$WORK/modcache"
cleanup() {
	umount "$MOD" 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/tree" "$WORK/home" "$MOD"
tar -C "$ROOT" --exclude=.git --exclude=./bin --exclude='node_modules' -cf - . | tar -xf - -C "$WORK/tree"
mount --bind "$(go env GOMODCACHE)" "$MOD"
mount -o remount,bind,ro "$MOD"
chown -R nobody: "$WORK/tree" "$WORK/home"
chmod 755 "$WORK"
LOG="$WORK/home/test.log"
set +e
(cd "$WORK/tree" && runuser -u nobody -- env HOME="$WORK/home" GOCACHE="$WORK/home/go-build" GOMODCACHE="$MOD" \
	GOPROXY=off GOFLAGS=-buildvcs=false GOTOOLCHAIN=local PATH="$PATH" go test -v "$@") >"$LOG" 2>&1
RC=$?
set -e
grep -E '^(ok|FAIL|---)|^\s+--- FAIL' "$LOG" | grep -vE '^\s*--- (PASS|SKIP)' || true
echo "unit-nonroot: $(grep -c -- '--- PASS' "$LOG") passed, $(grep -c -- '--- SKIP' "$LOG") skipped, $(grep -c -- '--- FAIL' "$LOG") failed"
echo "unit-nonroot: skip reasons:"
grep -B1 -- '--- SKIP' "$LOG" | grep -vE -- '^\s*---|^--$' | sed 's/^ *[a-z_]*\.go:[0-9]*: //' | sort | uniq -c | sort -rn | head -20 || true
if ((RC != 0)); then
	echo "unit-nonroot: output before each failure:"
	grep -B15 -E -- '^\s*--- FAIL' "$LOG" || tail -40 "$LOG"
fi
exit $RC
