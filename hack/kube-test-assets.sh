#!/usr/bin/env bash
# Builds the envtest control plane (kube-apiserver and etcd) from the Go module proxy and prints the
# folder that holds them, for KUBEBUILDER_ASSETS:
#
#   KUBEBUILDER_ASSETS="$(bash hack/kube-test-assets.sh)" go test ./internal/nodecontroller/
#
# No prebuilt binaries are downloaded: both are compiled from source modules (kube-apiserver from
# k8s.io/kubernetes with every k8s.io staging module replaced by its published v0 version).
# The result is cached in ${CUBE_CACHE_DIR:-/var/cache/cube}/kube/<version>/, keyed by version, so a
# rerun only checks that the binaries are there. Cold build on 2 cores: 6-13 min, ~2.4 GB (docs/kubernetes/testing.md).
# Quiet unless failing: the build log is printed only when a step fails.
#
# Environment: KUBE_VERSION (v1.37.2), ETCD_VERSION (v3.7.3), KUBE_ASSETS_TIMEOUT (build bound, 45m).
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.7.3}"
TIMEOUT="${KUBE_ASSETS_TIMEOUT:-45m}"
CACHE="${CUBE_CACHE_DIR:-/var/cache/cube}/kube"
OUT="$CACHE/$KUBE_VERSION"

# v1.37.2 -> v0.37.2: the staging modules (k8s.io/api, client-go, ...) are published as v0.
STAGING_VERSION="v0.${KUBE_VERSION#v1.}"

have_assets() {
	[[ -x "$OUT/kube-apiserver" && -x "$OUT/etcd" ]]
}

if have_assets; then
	echo "$OUT"
	exit 0
fi

command -v go >/dev/null || { echo "kube-test-assets: go is not on PATH" >&2; exit 1; }
mkdir -p "$CACHE"
exec 9>"$CACHE/.$KUBE_VERSION.lock"
flock 9
if have_assets; then # another run finished while this one waited
	echo "$OUT"
	exit 0
fi

rm -rf "$CACHE/.build-$KUBE_VERSION".* # left by a run that was killed (we hold the lock)
WORK="$(mktemp -d "$CACHE/.build-$KUBE_VERSION.XXXXXX")"
LOG="$WORK/build.log"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/bin"

export GOWORK=off GOFLAGS=-mod=mod GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0
step() { # step DESCRIPTION CMD...: run quietly, dump the log and fail on error
	local what="$1"
	shift
	echo "== $what: $*" >>"$LOG"
	if ! timeout "$TIMEOUT" "$@" >>"$LOG" 2>&1; then
		echo "kube-test-assets: $what failed (log follows)" >&2
		tail -n 60 "$LOG" >&2
		exit 1
	fi
}

# etcd: its server module carries relative replace directives, so build it inside a throwaway module.
if [[ ! -x "$OUT/etcd" ]]; then
	mkdir -p "$WORK/etcd"
	cat >"$WORK/etcd/go.mod" <<-EOF
		module cube.local/etcdbuild

		go 1.25
	EOF
	step "resolve etcd $ETCD_VERSION" bash -c "cd '$WORK/etcd' && go get go.etcd.io/etcd/server/v3@$ETCD_VERSION"
	step "build etcd" bash -c "cd '$WORK/etcd' && go build -trimpath -ldflags='-s -w' -o '$WORK/bin/etcd' go.etcd.io/etcd/server/v3"
fi

# kube-apiserver: k8s.io/kubernetes points every staging module at ./staging/...; replace each with
# the published module at the matching v0 version.
if [[ ! -x "$OUT/kube-apiserver" ]]; then
	mkdir -p "$WORK/kube"
	step "fetch k8s.io/kubernetes $KUBE_VERSION go.mod" bash -c \
		"cd '$WORK/kube' && go mod download -json k8s.io/kubernetes@$KUBE_VERSION >'$WORK/kube/module.json' || { cat '$WORK/kube/module.json'; exit 1; }"
	gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' "$WORK/kube/module.json")"
	[[ -f "$gomod" ]] || { echo "kube-test-assets: no go.mod for k8s.io/kubernetes@$KUBE_VERSION" >&2; exit 1; }
	mapfile -t staging < <(grep -oE '^[[:space:]]*k8s\.io/[a-zA-Z0-9._/-]+[[:space:]]+=>[[:space:]]+\./staging' "$gomod" |
		awk '{print $1}' | sort -u)
	((${#staging[@]} > 10)) || { echo "kube-test-assets: found only ${#staging[@]} staging modules in $gomod" >&2; exit 1; }
	{
		echo "module cube.local/kubebuild"
		echo
		echo "go 1.25"
		echo
		for m in "${staging[@]}"; do echo "replace $m => $m $STAGING_VERSION"; done
	} >"$WORK/kube/go.mod"
	step "resolve kube-apiserver $KUBE_VERSION" bash -c \
		"cd '$WORK/kube' && go get k8s.io/kubernetes/cmd/kube-apiserver@$KUBE_VERSION"
	# Stamp the version as Kubernetes' own build does, so /version says v1.37.2, not v0.0.0-master.
	minor="${KUBE_VERSION#v1.}"
	minor="${minor%%.*}"
	ldflags="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	done
	step "build kube-apiserver" bash -c \
		"cd '$WORK/kube' && go build -trimpath -ldflags='$ldflags' -o '$WORK/bin/kube-apiserver' k8s.io/kubernetes/cmd/kube-apiserver"
fi

mkdir -p "$OUT"
for b in etcd kube-apiserver; do
	if [[ -x "$WORK/bin/$b" ]]; then
		mv -f "$WORK/bin/$b" "$OUT/$b.tmp"
		mv -f "$OUT/$b.tmp" "$OUT/$b" # atomic: a reader never sees half a binary
	fi
done
have_assets || { echo "kube-test-assets: binaries missing in $OUT after build" >&2; exit 1; }
echo "$OUT"
