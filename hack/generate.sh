#!/usr/bin/env bash
# Generates Go code from the protobuf definitions under api/.
# Single entry point for `make generate`; idempotent and deterministic.
#
# Needs nothing from the system but Go: the compiler is buf (which carries the
# protobuf well-known types, google/protobuf/*.proto, inside its binary) and
# the plugins are protoc-gen-go and protoc-gen-connect-go, all pinned and
# built from the Go module proxy into a per-version cache. So the output does
# not depend on which protoc or libprotobuf-dev a machine happens to have.
#
# The tree is never left half-generated: everything is generated into a
# temporary directory and swapped into api/gen only when every step succeeded.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BUF_VERSION="v1.75.0"
PROTOC_GEN_GO_VERSION="v1.36.12"
PROTOC_GEN_CONNECT_GO_VERSION="v1.21.1"

# Pinned tools live in a per-version cache dir so re-runs are fast.
CACHE="${CUBE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cube-tools}"
BIN="$CACHE/buf-$BUF_VERSION-protoc-gen-go-$PROTOC_GEN_GO_VERSION-connect-$PROTOC_GEN_CONNECT_GO_VERSION"

install_tool() { # install_tool NAME MODULE@VERSION: go install into $BIN unless already there
	local name="$1" pkg="$2"
	[[ -x "$BIN/$name" ]] && return 0
	mkdir -p "$BIN"
	local tmp log
	tmp="$(mktemp -d "$CACHE/.install-$name.XXXXXX")"
	log="$tmp/log"
	echo "generate: building $pkg (once; cached in $BIN)" >&2
	# Built into a temporary dir and renamed: a killed build never leaves a
	# half-written binary that later runs would take as installed.
	if ! GOBIN="$tmp" GOFLAGS=-mod=mod go install "$pkg" >"$log" 2>&1; then
		tail -n 30 "$log" >&2
		rm -rf "$tmp"
		echo "generate: go install $pkg failed (output above)" >&2
		exit 1
	fi
	mv -f "$tmp/$name" "$BIN/$name"
	rm -rf "$tmp"
}

mkdir -p "$CACHE"
install_tool buf "github.com/bufbuild/buf/cmd/buf@$BUF_VERSION"
install_tool protoc-gen-go "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
install_tool protoc-gen-connect-go "connectrpc.com/connect/cmd/protoc-gen-connect-go@$PROTOC_GEN_CONNECT_GO_VERSION"
# buf finds the "local" plugins on PATH; only ours may be found.
export PATH="$BIN:$PATH"
# buf keeps a cache of its own; keep it next to the tools, not in $HOME/.cache/buf.
export BUF_CACHE_DIR="$CACHE/buf-cache"

WORK="$(mktemp -d "$ROOT/api/.gen.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# gen MODULE_DIR OUT: every .proto under MODULE_DIR (the import root) into OUT.
gen() {
	local module="$1" out="$2"
	mkdir -p "$out"
	local template
	template="$(printf '{"version":"v2","plugins":[%s,%s]}' \
		"{\"local\":\"protoc-gen-go\",\"out\":\"$out\",\"opt\":\"paths=source_relative\"}" \
		"{\"local\":\"protoc-gen-connect-go\",\"out\":\"$out\",\"opt\":\"paths=source_relative\"}")"
	buf generate "$module" --template "$template"
}

gen api/envd "$WORK/envd"
gen api/node "$WORK/node"

# Every step succeeded: swap the new trees in. Only directories that differ
# are touched, so an unchanged tree keeps its files (and their mtimes).
for name in envd node; do
	if diff -r -q "$WORK/$name" "api/gen/$name" >/dev/null 2>&1; then
		continue
	fi
	mkdir -p api/gen
	if [[ -e "api/gen/$name" ]]; then
		mv "api/gen/$name" "$WORK/$name.old"
	fi
	mv "$WORK/$name" "api/gen/$name"
done
