#!/usr/bin/env bash
# Proves the README's prerequisites are enough: in a fresh Debian 12 root file
# system (debootstrap minbase + the README's prerequisites, with this machine's
# Go and Node and its CA/apt/npm/Go client settings copied in, as a new machine
# of this kind has them), a fresh clone of this repository runs
#
#   make deps && make check-generate && make build
#
# as root in a chroot. This is the check that would have caught a build step
# relying on a package someone once installed by hand (issue 19: the protobuf
# well-known types).
#
# The minbase root is cached by date in ${CUBE_CACHE_DIR:-/var/cache/cube}/fresh-root/
# (one debootstrap a day, ~1 min); the Go module download cache of this machine
# is shared read-only (as a file:// GOPROXY in front of the real one); the Go
# build cache is not shared, so every Go build in the chroot is cold.
#
# Usage: bash hack/fresh-machine-check.sh [COMMIT] (default HEAD; the clone is
# of the committed tree, so commit before you run it). Needs root, debootstrap.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMMIT="${1:-HEAD}"
CACHE="${CUBE_CACHE_DIR:-/var/cache/cube}/fresh-root"
SUITE=bookworm
# What the README says a new machine has besides Go and Node: git and make.
PREREQS=git,make,ca-certificates

die() {
	echo "fresh-machine-check: $*" >&2
	exit 1
}

[[ "$(id -u)" == 0 ]] || die "needs root (debootstrap, chroot, mounts)"
command -v debootstrap >/dev/null || die "debootstrap missing: run make deps"
command -v go >/dev/null || die "go is not on PATH"
command -v node >/dev/null || die "node is not on PATH"

# debian_mirror prints the machine's Debian archive URL (not security/updates),
# read from its apt sources like the base template does (internal/template).
debian_mirror() {
	local f u
	for f in /etc/apt/sources.list.d/*.sources; do
		[[ -f "$f" ]] || continue
		for u in $(sed -n 's/^URIs:[[:space:]]*//p' "$f"); do
			[[ "$u" == *security* ]] || { echo "${u%/}"; return 0; }
		done
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[[ -f "$f" ]] || continue
		u="$(awk '$1=="deb" {for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' "$f" | grep -v security | head -n1)"
		[[ -n "$u" ]] && { echo "${u%/}"; return 0; }
	done
	echo "http://deb.debian.org/debian"
}

# minbase_tar builds (once a day) and prints the cached minbase tarball.
minbase_tar() {
	local tar="$CACHE/$SUITE-minbase-$(date +%F).tar"
	mkdir -p "$CACHE"
	exec 8>"$CACHE/.lock"
	flock 8
	if [[ ! -f "$tar" ]]; then
		local tmp log mirror
		mirror="$(debian_mirror)"
		tmp="$(mktemp -d "$CACHE/.build.XXXXXX")"
		log="$tmp.log"
		echo "fresh-machine-check: debootstrap --variant=minbase $SUITE from $mirror (once a day)" >&2
		if ! debootstrap --variant=minbase --include="$PREREQS" "$SUITE" "$tmp/root" "$mirror" >"$log" 2>&1; then
			tail -n 30 "$log" >&2
			rm -rf "$tmp" "$log"
			die "debootstrap failed (output above)"
		fi
		rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"*_Packages
		tar -C "$tmp/root" -cf "$tar.tmp" .
		mv -f "$tar.tmp" "$tar"
		rm -rf "$tmp" "$log"
		find "$CACHE" -maxdepth 1 -name "$SUITE-minbase-*.tar" ! -name "${tar##*/}" -delete
	fi
	exec 8>&-
	echo "$tar"
}

TAR="$(minbase_tar)"
WORK="$(mktemp -d /var/tmp/cube-fresh.XXXXXX)"
RFS="$WORK/root"
MOUNTS=()
cleanup() {
	local i
	for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
		umount -l "${MOUNTS[$i]}" 2>/dev/null || true
	done
	# Only after every mount is gone: never delete through a bind mount.
	if ! grep -q " $WORK/" /proc/self/mountinfo; then
		rm -rf "$WORK"
	else
		echo "fresh-machine-check: mounts left under $WORK; not removing it" >&2
	fi
}
trap cleanup EXIT
mkdir -p "$RFS"
tar -C "$RFS" -xf "$TAR"

bind() { # bind SRC DST [ro]
	mkdir -p "$RFS$2"
	mount --bind "$1" "$RFS$2"
	MOUNTS+=("$RFS$2")
	if [[ "${3:-}" == ro ]]; then
		mount -o remount,bind,ro "$RFS$2"
	fi
}

# The machine's own tools and client settings, as a new machine has them.
GOROOT_HOST="$(go env GOROOT)"
bind "$GOROOT_HOST" /usr/local/go ro
NODE_BIN="$(command -v node)"
cp -a "$NODE_BIN" "$RFS/usr/bin/node"
NODE_MODULES="$(dirname "$(readlink -f "$(command -v npm)")")/../.."
[[ -d "$NODE_MODULES/npm" ]] || NODE_MODULES=/usr/lib/node_modules
mkdir -p "$RFS/usr/lib/node_modules"
cp -a "$NODE_MODULES/npm" "$RFS/usr/lib/node_modules/"
ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$RFS/usr/bin/npm"
ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$RFS/usr/bin/npx"
copy_if() { # copy_if PATH...: copy host files/dirs into the root when they exist
	local p
	for p in "$@"; do
		[[ -e "$p" ]] || continue
		mkdir -p "$RFS$(dirname "$p")"
		cp -a "$p" "$RFS$(dirname "$p")/"
	done
}
rm -f "$RFS/etc/apt/sources.list"
copy_if /etc/apt/sources.list /etc/apt/sources.list.d /etc/apt/apt.conf.d \
	/usr/local/share/ca-certificates /etc/ssl/certs /usr/sbin/policy-rc.d \
	/root/.npmrc /root/.config/go/env /etc/npmrc /usr/etc/npmrc
cp -L /etc/resolv.conf "$RFS/etc/resolv.conf"
cp /etc/hosts "$RFS/etc/hosts"

bind /proc /proc
bind /dev /dev
bind /sys /sys ro
MODCACHE="$(go env GOMODCACHE)/cache/download"
HOST_GOPROXY="$(go env GOPROXY)"
if [[ -d "$MODCACHE" ]]; then
	bind "$MODCACHE" /mnt/host-gomodcache ro
	CHROOT_GOPROXY="file:///mnt/host-gomodcache,$HOST_GOPROXY"
else
	CHROOT_GOPROXY="$HOST_GOPROXY"
fi

# A fresh clone of the committed tree.
git clone -q --no-local "$ROOT" "$RFS/root/cube"
git -C "$RFS/root/cube" checkout -q "$(git -C "$ROOT" rev-parse "$COMMIT")"

echo "fresh-machine-check: in a fresh $SUITE root: make deps, make check-generate, make build" >&2
start=$SECONDS
env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
	PATH=/usr/local/go/bin:/root/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	GOPROXY="$CHROOT_GOPROXY" NODE_EXTRA_CA_CERTS="${NODE_EXTRA_CA_CERTS:-}" \
	CUBE_CACHE_DIR=/var/cache/cube CI=true \
	chroot "$RFS" /bin/bash -euo pipefail -c '
		cd /root/cube
		make deps
		make check-generate
		make build
		./bin/cube version
	' || die "failed in the fresh root (output above); reproduce: bash hack/fresh-machine-check.sh"
echo "fresh-machine-check: passed in $((SECONDS - start)) s" >&2
