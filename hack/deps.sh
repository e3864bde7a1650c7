#!/usr/bin/env bash
# Installs what building and testing Cube needs on a Debian host.
# Idempotent: installs only what is missing; quiet when nothing is to do.
# Called by `make deps`. Needs root for apt-get (skipped when nothing is missing).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# postgresql: the store, leader and HA tests start throwaway servers from its
# binaries (internal/pgtest); they fail under CI=1 when it is missing.
# containerd .. util-linux: the local Kubernetes cluster (make kube-up,
# hack/kubelocal): the container runtime, the pod network's CNI plugins, the
# packet filter kube-proxy programs, conntrack for its cleanup, and
# nsenter/mount for teardown.
# python3-ipykernel .. python3-matplotlib: internal/interp's tests run the
# code-interpreter server against real Jupyter kernels on this machine.
# gcc, libc6-dev: `make build` compiles the static C programs cube-nsexec and
# cube-reaper (internal/nativebin). gcc .. python3-pip: test/security's
# TestWorkloadsUnderAllowlist also compiles C, runs git and pip (and python3, numpy, ipykernel, node) in a sandbox
# under the seccomp allowlist, from the host's /usr (~45 MB of packages).
APT_PACKAGES=(iproute2 nftables debootstrap busybox-static psmisc ca-certificates procps e2fsprogs postgresql
	containerd runc containernetworking-plugins iptables conntrack util-linux
	python3-ipykernel python3-numpy python3-pandas python3-matplotlib
	gcc libc6-dev git python3-pip)
E2E_DIR="$ROOT/test/e2e"

die() {
	echo "deps: $*" >&2
	exit 1
}

missing_apt_packages() {
	local pkg status
	for pkg in "${APT_PACKAGES[@]}"; do
		status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
		if [[ "$status" != "installed" ]]; then
			printf '%s\n' "$pkg"
		fi
	done
}

install_apt() {
	command -v dpkg-query >/dev/null 2>&1 || die "dpkg-query not found: this script supports Debian/Ubuntu hosts only"
	local missing
	mapfile -t missing < <(missing_apt_packages)
	((${#missing[@]} == 0)) && return 0

	local sudo=()
	if [[ "$(id -u)" != 0 ]]; then
		command -v sudo >/dev/null 2>&1 || die "missing packages (${missing[*]}) and not root; rerun as root"
		sudo=(sudo)
	fi
	echo "deps: installing ${missing[*]}"
	local log
	log="$(mktemp)"
	# One `apt-get update`, then install; retry the install once after the
	# update only if the first attempt failed (stale lists).
	if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
		if ! "${sudo[@]}" apt-get update -q >>"$log" 2>&1 ||
			! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$log" 2>&1; then
			tail -n 30 "$log" >&2
			rm -f "$log"
			die "apt-get install ${missing[*]} failed (output above)"
		fi
	fi
	rm -f "$log"
	mapfile -t missing < <(missing_apt_packages)
	((${#missing[@]} == 0)) || die "still missing after install: ${missing[*]}"
}

install_npm() {
	[[ -f "$E2E_DIR/package-lock.json" ]] || die "$E2E_DIR/package-lock.json missing"
	# node_modules/.package-lock.json is written by npm on every install.
	local stamp="$E2E_DIR/node_modules/.package-lock.json"
	if [[ -f "$stamp" && ! "$E2E_DIR/package-lock.json" -nt "$stamp" ]]; then
		return 0
	fi
	command -v npm >/dev/null 2>&1 || die "npm not found: install Node.js >= 20 (e.g. from nodesource) to run the e2e suite"
	echo "deps: npm ci in test/e2e"
	local log
	log="$(mktemp)"
	if ! (cd "$E2E_DIR" && npm ci --no-audit --no-fund --loglevel=error) >"$log" 2>&1; then
		tail -n 30 "$log" >&2
		rm -f "$log"
		die "npm ci in $E2E_DIR failed (output above)"
	fi
	rm -f "$log"
}

install_apt
install_npm
