package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/mountinfo"
)

// down removes the cluster and what it changed on the host. It keeps going
// past a failed step and returns every error; run again, it finds nothing
// to do. The binary and image caches (CacheDir) stay.
func down(ctx context.Context, c *Config) error {
	start := time.Now()
	rec, recErr := loadHost(c)
	if recErr != nil && !errors.Is(recErr, os.ErrNotExist) {
		slog.Warn("host record unreadable: restoring what the defaults name", "err", recErr)
	}
	var errs []error
	step := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			slog.Warn("kube-down step failed", "step", what, "err", err)
		}
	}
	// 1. Cube, the way a user uninstalls it: helm uninstall (its pre-delete
	// hook releases the Nodes) while the cluster still runs.
	if _, ok := readPid(c, "kube-apiserver"); ok {
		step("helm uninstall", uninstallChart(ctx, c))
	}
	// 2. The node: kubelet first (so nothing restarts containers), then
	// every container (the kubepods cgroups), containerd and its shims.
	for _, n := range []string{"kubelet", "kube-proxy"} {
		step("stop "+n, stopRecorded(c, n, 10*time.Second))
	}
	step("kill Pods", killCgroupTree(ctx, "kubepods"))
	step("stop containerd", stopRecorded(c, "containerd", 10*time.Second))
	// 3. What Cube left on the node (sandboxes outlive the Big Pod by
	// design): `cube node cleanup`, as docs/kubernetes/uninstall.md says.
	step("cube node cleanup", cubeCleanup(ctx, c))
	// 4. The control plane and the database.
	for _, n := range []string{"kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd", "postgres"} {
		step("stop "+n, stopRecorded(c, n, 15*time.Second))
	}
	step("kill the rest of "+clusterCgroup, killCgroupTree(ctx, clusterCgroup))
	// 5. Host state.
	step("unmount", unmountUnder(c.Dir, "/run/containerd", "/var/lib/kubelet", "/run/cube", "/var/lib/cube"))
	step("links", removeLinks(ctx))
	step("iptables", cleanIptables(ctx))
	if rec != nil {
		step("nftables", dropNewEmptyTables(ctx, rec.NftTables))
	}
	step("node address", removeNodeAddress(ctx, c))
	step("cgroups", removeCgroupTree(ctx, "kubepods"))
	step("cgroups", removeCgroupTree(ctx, clusterCgroup))
	if rec != nil {
		step("sysctls", restoreSysctls(rec))
		step("paths", removeCreatedPaths(rec))
	}
	if err := errors.Join(errs...); err != nil {
		slog.Error("kube-down incomplete: state kept for another run", "dir", c.Dir)
		return err
	}
	step("state dir", os.RemoveAll(c.Dir))
	slog.Info("kube-down done", "took", time.Since(start).Round(time.Second))
	return errors.Join(errs...)
}

func uninstallChart(ctx context.Context, c *Config) error {
	if _, err := os.Stat(c.p("bin", "helm")); err != nil {
		return nil // never got as far as installing
	}
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	if _, err := helm(ctx, c, "status", c.Release, "-n", c.Namespace); err != nil {
		slog.Info("no release to uninstall", "release", c.Release, "status", err)
		return nil
	}
	slog.Info("helm uninstall", "release", c.Release, "namespace", c.Namespace)
	if _, err := helm(ctx, c, "uninstall", c.Release, "-n", c.Namespace, "--wait", "--timeout", "3m"); err != nil {
		return err
	}
	_, err := kubectl(ctx, c, "-n", c.Namespace, "wait", "--for=delete", "pod", "-l", "app.kubernetes.io/component=node", "--timeout=90s")
	return err
}

// cubeCleanup runs `cube node cleanup --purge-state` for the cube-node
// Pod's default directories, if Cube left anything there.
func cubeCleanup(ctx context.Context, c *Config) error {
	if !exists("/run/cube") && !exists("/var/lib/cube") {
		return nil
	}
	bin := c.cubeBin()
	if !exists(bin) {
		tmp, err := os.MkdirTemp("", "kubelocal-cube-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		bin = filepath.Join(tmp, "cube")
		if _, err := run(ctx, c.Repo, []string{"CGO_ENABLED=0"}, "go", "build", "-o", bin, "./cmd/cube"); err != nil {
			return err
		}
	}
	out, err := run(ctx, "/", nil, bin, "node", "cleanup", "--purge-state")
	if s := strings.TrimSpace(out); s != "" {
		slog.Info("cube node cleanup", "output", s)
	}
	return err
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// hierarchyDirs returns <mount>/<name> for every mounted cgroup hierarchy.
func hierarchyDirs(name string) ([]string, error) {
	l, err := cgroup.DetectLayout()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var dirs []string
	mounts := []string{l.Unified}
	for _, m := range l.V1 {
		mounts = append(mounts, m)
	}
	for _, m := range mounts {
		if m == "" || seen[m] {
			continue
		}
		seen[m] = true
		dirs = append(dirs, filepath.Join(m, name))
	}
	sort.Strings(dirs)
	return dirs, nil
}

// treePids returns the pids in every cgroup under the cgroup name.
func treePids(name string) (map[int]bool, error) {
	dirs, err := hierarchyDirs(name)
	if err != nil {
		return nil, err
	}
	pids := map[int]bool{}
	for _, d := range dirs {
		filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
					pids[pid] = true
				}
			}
			return nil
		})
	}
	return pids, nil
}

// killCgroupTree SIGKILLs every process under the cgroup name (in every
// hierarchy) until none is left, bounded to 30 s.
func killCgroupTree(ctx context.Context, name string) error {
	deadline := time.Now().Add(30 * time.Second)
	killed := 0
	for {
		pids, err := treePids(name)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			if killed > 0 {
				slog.Info("killed leftover processes", "cgroup", name, "count", killed)
			}
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("cgroup %s: %d processes survive SIGKILL", name, len(pids))
		}
		for pid := range pids {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// removeCgroupTree removes the cgroup name and its descendants in every
// hierarchy, deepest first.
func removeCgroupTree(ctx context.Context, name string) error {
	dirs, err := hierarchyDirs(name)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		var all []string
		filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		sort.Slice(all, func(i, j int) bool { return len(all[i]) > len(all[j]) })
		for _, p := range all {
			var err error
			for range 20 { // a just-killed process leaves its cgroup a moment later
				if err = syscall.Rmdir(p); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", p, err))
			}
		}
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount at or below the given directories,
// deepest first.
func unmountUnder(dirs ...string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 {
			continue
		}
		mp := mountinfo.Unescape(fs[4])
		for _, d := range dirs {
			if mp == d || strings.HasPrefix(mp, d+"/") {
				points = append(points, mp)
				break
			}
		}
	}
	f.Close()
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	if len(points) > 0 {
		slog.Info("unmounted", "count", len(points))
	}
	return errors.Join(errs...)
}

// removeLinks deletes the pod network's bridge and any veth still on it.
func removeLinks(ctx context.Context) error {
	if _, err := os.Stat("/sys/class/net/cni0"); err != nil {
		return nil
	}
	var errs []error
	out, _ := run(ctx, "/", nil, "ip", "-o", "link", "show", "master", "cni0")
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		errs = append(errs, deleteLink(ctx, name))
	}
	errs = append(errs, deleteLink(ctx, "cni0"))
	slog.Info("removed the pod network's bridge cni0")
	return errors.Join(errs...)
}

// deleteLink deletes a network link. A link that is gone is not an error: a
// veth vanishes on its own when the pod namespace holding its peer goes, which
// can happen between listing the bridge's ports and deleting them.
func deleteLink(ctx context.Context, name string) error {
	_, err := run(ctx, "/", nil, "ip", "link", "del", name)
	if err == nil {
		return nil
	}
	if _, statErr := os.Stat("/sys/class/net/" + name); errors.Is(statErr, os.ErrNotExist) {
		return nil
	}
	return err
}

func removeNodeAddress(ctx context.Context, c *Config) error {
	var errs []error
	if out, _ := run(ctx, "/", nil, "ip", "route", "show", c.SvcCIDR.String(), "dev", "lo"); strings.TrimSpace(out) != "" {
		if _, err := run(ctx, "/", nil, "ip", "route", "del", c.SvcCIDR.String(), "dev", "lo"); err != nil {
			errs = append(errs, err)
		}
	}
	ip := c.NodeIP.String() + "/32"
	if out, _ := run(ctx, "/", nil, "ip", "-o", "addr", "show", "dev", "lo"); strings.Contains(out, " "+ip+" ") {
		if _, err := run(ctx, "/", nil, "ip", "addr", "del", ip, "dev", "lo"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
