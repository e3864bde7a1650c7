# Shared by hack/kube-test-assets.sh (envtest: kube-apiserver, etcd) and
# hack/kube-node-assets.sh (the local cluster: kubelet, ..., helm, CoreDNS):
# the cache layout, the lock, the quiet build steps and the ONE way the
# k8s.io/kubernetes throwaway module is resolved. Source it; it builds nothing.
#
# Environment: KUBE_VERSION (v1.37.2), KUBE_ASSETS_TIMEOUT (bound of each build step, 45m),
# CUBE_CACHE_DIR (/var/cache/cube).

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
TIMEOUT="${KUBE_ASSETS_TIMEOUT:-45m}"
CACHE="${CUBE_CACHE_DIR:-/var/cache/cube}/kube"
OUT="$CACHE/$KUBE_VERSION"
# v1.37.2 -> v0.37.2: the staging modules (k8s.io/api, client-go, ...) are published as v0.
STAGING_VERSION="v0.${KUBE_VERSION#v1.}"

# kube_assets_lock NAME: creates the cache and holds its lock (fd 9) until the script exits. Every
# build of this version's cache takes the same lock, so two runs never build the same thing twice.
kube_assets_lock() {
	ASSETS_NAME="$1"
	command -v go >/dev/null || { echo "$ASSETS_NAME: go is not on PATH" >&2; exit 1; }
	mkdir -p "$CACHE"
	exec 9>"$CACHE/.$KUBE_VERSION.lock"
	flock 9
}

# kube_assets_workdir: a fresh build directory (WORK, with WORK/bin) removed on exit, and the build
# environment. Call with the lock held: it removes what a killed run left.
kube_assets_workdir() {
	rm -rf "$CACHE/.build-$KUBE_VERSION".*
	WORK="$(mktemp -d "$CACHE/.build-$KUBE_VERSION.XXXXXX")"
	LOG="$WORK/build.log"
	trap 'rm -rf "$WORK"' EXIT
	mkdir -p "$WORK/bin"
	export GOWORK=off GOFLAGS=-mod=mod GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0
}

# step DESCRIPTION CMD...: runs quietly (bounded by TIMEOUT); on failure prints the log's tail and exits.
step() {
	local what="$1"
	shift
	echo "== $what: $*" >>"$LOG"
	if ! timeout "$TIMEOUT" "$@" >>"$LOG" 2>&1; then
		echo "$ASSETS_NAME: $what failed (log follows)" >&2
		tail -n 60 "$LOG" >&2
		exit 1
	fi
}

# kube_module: the throwaway module in WORK/kube that builds commands of k8s.io/kubernetes.
# k8s.io/kubernetes points every staging module at ./staging/...; each is replaced with the
# published module at the matching v0 version. Sets KUBE_LDFLAGS (version stamp).
kube_module() {
	[[ -f "$WORK/kube/go.mod" ]] && return 0
	mkdir -p "$WORK/kube"
	step "fetch k8s.io/kubernetes $KUBE_VERSION go.mod" bash -c \
		"cd '$WORK/kube' && go mod download -json k8s.io/kubernetes@$KUBE_VERSION >'$WORK/kube/module.json' || { cat '$WORK/kube/module.json'; exit 1; }"
	local gomod
	gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' "$WORK/kube/module.json")"
	[[ -f "$gomod" ]] || { echo "$ASSETS_NAME: no go.mod for k8s.io/kubernetes@$KUBE_VERSION" >&2; exit 1; }
	local staging
	mapfile -t staging < <(grep -oE '^[[:space:]]*k8s\.io/[a-zA-Z0-9._/-]+[[:space:]]+=>[[:space:]]+\./staging' "$gomod" |
		awk '{print $1}' | sort -u)
	((${#staging[@]} > 10)) || { echo "$ASSETS_NAME: found only ${#staging[@]} staging modules in $gomod" >&2; exit 1; }
	{
		echo "module cube.local/kubebuild"
		echo
		echo "go 1.25"
		echo
		for m in "${staging[@]}"; do echo "replace $m => $m $STAGING_VERSION"; done
	} >"$WORK/kube/go.mod"
	# Stamp the version as Kubernetes' own build does, so /version says v1.37.2, not v0.0.0-master.
	local minor="${KUBE_VERSION#v1.}"
	minor="${minor%%.*}"
	KUBE_LDFLAGS="-s -w"
	local pkg
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		KUBE_LDFLAGS+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	done
}

# kube_build CMD...: builds k8s.io/kubernetes/cmd/<CMD> for each CMD into WORK/bin/<CMD>.
kube_build() {
	kube_module
	local c pkgs=()
	for c in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$c@$KUBE_VERSION"); done
	step "resolve $* $KUBE_VERSION" bash -c "cd '$WORK/kube' && go get ${pkgs[*]}"
	for c in "$@"; do
		step "build $c" bash -c \
			"cd '$WORK/kube' && go build -trimpath -ldflags='$KUBE_LDFLAGS' -o '$WORK/bin/$c' k8s.io/kubernetes/cmd/$c"
	done
}

# kube_install DIR NAME...: moves each built WORK/bin/<NAME> to DIR/<NAME> atomically (a reader never
# sees half a binary).
kube_install() {
	local dir="$1" b
	shift
	mkdir -p "$dir"
	for b in "$@"; do
		if [[ -x "$WORK/bin/$b" ]]; then
			mv -f "$WORK/bin/$b" "$dir/$b.tmp"
			mv -f "$dir/$b.tmp" "$dir/$b"
		fi
	done
}
