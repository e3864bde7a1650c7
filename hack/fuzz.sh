#!/usr/bin/env bash
# Runs every go fuzz target in the module for a bounded time each.
#   hack/fuzz.sh [DURATION]   (default 30s per target)
set -euo pipefail
cd "$(dirname "$0")/.."
dur="${1:-30s}"
grep -rl --include='*_test.go' '^func Fuzz' internal | while read -r f; do
	pkg="./$(dirname "$f")"
	for target in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //'); do
		echo "fuzz: $pkg $target ($dur)"
		go test -run '^$' -fuzz "^${target}\$" -fuzztime "$dur" "$pkg"
	done
done
