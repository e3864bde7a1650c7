#!/usr/bin/env bash
# Builds what the local Kubernetes cluster (make kube-up, hack/kubelocal) runs besides envtest's
# kube-apiserver and etcd (hack/kube-test-assets.sh, which this calls first) and prints where they
# are, one NAME=path line each:
#
#   KUBE_BIN_DIR  kube-apiserver, etcd, kubelet, kube-controller-manager, kube-scheduler, kube-proxy,
#                 kubectl (k8s.io/kubernetes KUBE_VERSION, version-stamped)
#   HELM          helm (helm.sh/helm/v3 HELM_VERSION)
#   COREDNS       coredns (github.com/coredns/coredns COREDNS_VERSION with the plugins the cluster uses,
#                 hack/kubelocal/coredns), the cluster DNS
#   PAUSE         the Pod sandbox binary, hack/kubelocal/pause (keyed by its source's hash)
#
# No prebuilt binary is downloaded: everything is compiled from the Go module proxy, CGO off, and
# cached in ${CUBE_CACHE_DIR:-/var/cache/cube}/kube/ by version, so a rerun only checks the files.
# Cold build on 2 busy cores: see docs/kubernetes/local-cluster.md. Quiet unless failing.
#
# Environment: KUBE_VERSION (v1.37.2), HELM_VERSION (v3.22.0), COREDNS_VERSION (v1.15.0),
# KUBE_ASSETS_TIMEOUT (bound of each build step, 45m).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/kube-assets-lib.sh
source "$ROOT/hack/kube-assets-lib.sh"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"

NODE_BINS=(kubelet kube-controller-manager kube-scheduler kube-proxy kubectl)
HELM_DIR="$CACHE/helm-$HELM_VERSION"
coredns_key="$(cat "$ROOT"/hack/kubelocal/coredns/main.go | sha256sum | cut -c1-12)"
COREDNS_DIR="$CACHE/coredns-$COREDNS_VERSION-$coredns_key"
pause_key="$(cat "$ROOT"/hack/kubelocal/pause/*.go "$ROOT/go.mod" | sha256sum | cut -c1-16)"
PAUSE_DIR="$CACHE/pause-$pause_key"

have_assets() {
	local b
	for b in "${NODE_BINS[@]}"; do [[ -x "$OUT/$b" ]] || return 1; done
	[[ -x "$HELM_DIR/helm" && -x "$COREDNS_DIR/coredns" && -x "$PAUSE_DIR/pause" ]]
}

report() {
	printf 'KUBE_BIN_DIR=%s\nHELM=%s\nCOREDNS=%s\nPAUSE=%s\n' "$OUT" "$HELM_DIR/helm" "$COREDNS_DIR/coredns" "$PAUSE_DIR/pause"
}

# The control plane first (it holds and releases the same lock).
bash "$ROOT/hack/kube-test-assets.sh" >/dev/null

if have_assets; then
	report
	exit 0
fi
kube_assets_lock kube-node-assets
if have_assets; then # another run finished while this one waited
	report
	exit 0
fi
kube_assets_workdir

missing=()
for b in "${NODE_BINS[@]}"; do [[ -x "$OUT/$b" ]] || missing+=("$b"); done
if ((${#missing[@]} > 0)); then
	kube_build "${missing[@]}"
	kube_install "$OUT" "${missing[@]}"
fi

# helm and CoreDNS: each in its own throwaway module, so their dependency graphs never meet
# Kubernetes' or Cube's.
module() { # module DIR: an empty throwaway module
	mkdir -p "$1"
	printf 'module cube.local/build\n\ngo 1.25\n' >"$1/go.mod"
}
if [[ ! -x "$HELM_DIR/helm" ]]; then
	module "$WORK/helm"
	step "resolve helm $HELM_VERSION" bash -c "cd '$WORK/helm' && go get helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
	step "build helm" bash -c "cd '$WORK/helm' && go build -trimpath \
		-ldflags='-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean' \
		-o '$WORK/bin/helm' helm.sh/helm/v3/cmd/helm"
	kube_install "$HELM_DIR" helm
fi
# CoreDNS: only the plugins the Corefile uses (a fifth of the full build's compile time).
if [[ ! -x "$COREDNS_DIR/coredns" ]]; then
	mkdir -p "$WORK/coredns"
	cp "$ROOT/hack/kubelocal/coredns/main.go" "$ROOT/hack/kubelocal/coredns/go.mod" "$WORK/coredns/"
	step "resolve coredns $COREDNS_VERSION" bash -c "cd '$WORK/coredns' && go get github.com/coredns/coredns@$COREDNS_VERSION"
	step "build coredns" bash -c "cd '$WORK/coredns' && go build -trimpath -ldflags='-s -w' -o '$WORK/bin/coredns' ."
	rm -rf "$CACHE"/coredns-* # other versions' and plugin sets' builds
	kube_install "$COREDNS_DIR" coredns
fi
if [[ ! -x "$PAUSE_DIR/pause" ]]; then
	step "build pause" bash -c "cd '$ROOT' && GOWORK=off GOFLAGS=-mod=readonly go build -trimpath -ldflags='-s -w' -o '$WORK/bin/pause' ./hack/kubelocal/pause"
	rm -rf "$CACHE"/pause-* # older sources' builds
	kube_install "$PAUSE_DIR" pause
fi

have_assets || { echo "kube-node-assets: binaries missing after build" >&2; exit 1; }
report
