#!/usr/bin/env bash
# Generates Go code from the protobuf definitions under api/.
# Single entry point for `make generate`; idempotent and deterministic.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PROTOC_GEN_GO_VERSION="v1.36.12"
PROTOC_GEN_CONNECT_GO_VERSION="v1.21.1"
PROTOC="${PROTOC:-protoc}"
PROTO_INCLUDE="${PROTO_INCLUDE:-/usr/include}"

# Pinned plugins live in a per-version cache dir so re-runs are fast.
CACHE="${CUBE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cube-tools}"
BIN="$CACHE/protoc-gen-go-$PROTOC_GEN_GO_VERSION-connect-$PROTOC_GEN_CONNECT_GO_VERSION"
mkdir -p "$BIN"
if [[ ! -x "$BIN/protoc-gen-go" ]]; then
	GOBIN="$BIN" GOFLAGS=-mod=mod go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
fi
if [[ ! -x "$BIN/protoc-gen-connect-go" ]]; then
	GOBIN="$BIN" GOFLAGS=-mod=mod go install "connectrpc.com/connect/cmd/protoc-gen-connect-go@$PROTOC_GEN_CONNECT_GO_VERSION"
fi
export PATH="$BIN:$PATH"

gen_envd() {
	local out="api/gen/envd"
	rm -rf "$out"
	mkdir -p "$out"
	local files=(api/envd/process/process.proto api/envd/filesystem/filesystem.proto)
	"$PROTOC" -I api/envd -I "$PROTO_INCLUDE" \
		--go_out="$out" --go_opt=paths=source_relative \
		--connect-go_out="$out" --connect-go_opt=paths=source_relative \
		"${files[@]}"
}

gen_node() {
	local out="api/gen/node"
	rm -rf "$out"
	mkdir -p "$out"
	"$PROTOC" -I api/node -I "$PROTO_INCLUDE" \
		--go_out="$out" --go_opt=paths=source_relative \
		--connect-go_out="$out" --connect-go_opt=paths=source_relative \
		v1/node.proto
}

gen_envd
gen_node
