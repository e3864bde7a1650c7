#!/usr/bin/env bash
# Builds the envtest control plane (kube-apiserver and etcd) from the Go module proxy and prints the
# folder that holds them, for KUBEBUILDER_ASSETS:
#
#   KUBEBUILDER_ASSETS="$(bash hack/kube-test-assets.sh)" go test ./internal/nodecontroller/
#
# No prebuilt binaries are downloaded: both are compiled from source modules (kube-apiserver from
# k8s.io/kubernetes with every k8s.io staging module replaced by its published v0 version, the way
# hack/kube-assets-lib.sh resolves it for every Kubernetes binary).
# The result is cached in ${CUBE_CACHE_DIR:-/var/cache/cube}/kube/<version>/, keyed by version, so a
# rerun only checks that the binaries are there. Cold build on 2 cores: 6-13 min, ~2.4 GB (docs/kubernetes/testing.md).
# Quiet unless failing: the build log is printed only when a step fails.
#
# Environment: KUBE_VERSION (v1.37.2), ETCD_VERSION (v3.7.3), KUBE_ASSETS_TIMEOUT (build bound, 45m).
set -euo pipefail

# shellcheck source=hack/kube-assets-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/kube-assets-lib.sh"
ETCD_VERSION="${ETCD_VERSION:-v3.7.3}"

have_assets() {
	[[ -x "$OUT/kube-apiserver" && -x "$OUT/etcd" ]]
}

if have_assets; then
	echo "$OUT"
	exit 0
fi

kube_assets_lock kube-test-assets
if have_assets; then # another run finished while this one waited
	echo "$OUT"
	exit 0
fi
kube_assets_workdir

# etcd: its server module carries relative replace directives, so build it inside a throwaway module.
if [[ ! -x "$OUT/etcd" ]]; then
	mkdir -p "$WORK/etcd"
	cat >"$WORK/etcd/go.mod" <<-EOM
		module cube.local/etcdbuild

		go 1.25
	EOM
	step "resolve etcd $ETCD_VERSION" bash -c "cd '$WORK/etcd' && go get go.etcd.io/etcd/server/v3@$ETCD_VERSION"
	step "build etcd" bash -c "cd '$WORK/etcd' && go build -trimpath -ldflags='-s -w' -o '$WORK/bin/etcd' go.etcd.io/etcd/server/v3"
fi

if [[ ! -x "$OUT/kube-apiserver" ]]; then
	kube_build kube-apiserver
fi

kube_install "$OUT" etcd kube-apiserver
have_assets || { echo "kube-test-assets: binaries missing in $OUT after build" >&2; exit 1; }
echo "$OUT"
