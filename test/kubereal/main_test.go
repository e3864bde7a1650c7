package kubereal

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// clusterEnv is what `make kube-up` wrote to $CUBE_KUBE_DIR/env.
type clusterEnv struct {
	Dir, Namespace, Release, Chart, Values string
	ImageRepo, ImageTag, ImageTagNext      string
	Node, CubeBin                          string
	APIURL, APIKey                         string
	E2EDir                                 string // test/e2e, where `make deps` installed the SDK
}

// envKeys must all be set by the env file.
var envKeys = []string{
	"KUBECONFIG", "PATH", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY",
	"CUBE_KUBE_DIR", "CUBE_KUBE_NAMESPACE", "CUBE_KUBE_RELEASE", "CUBE_KUBE_CHART", "CUBE_KUBE_VALUES",
	"CUBE_KUBE_IMAGE_REPO", "CUBE_KUBE_IMAGE_TAG", "CUBE_KUBE_IMAGE_TAG_NEXT", "CUBE_KUBE_NODE", "CUBE_BIN",
}

var (
	env        clusterEnv
	envMissing string // why the suite cannot run; tests skip (or fail under CI=true)
)

func TestMain(m *testing.M) {
	var err error
	env, err = loadEnv()
	if err != nil {
		envMissing = err.Error()
		if os.Getenv("CI") == "true" {
			// A CI machine without the cluster must not report "ok" for
			// tests that never ran.
			fmt.Fprintf(os.Stderr, "kubereal: cannot run under CI=true: %s\n", envMissing)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

// requireCluster skips the test when there is no local cluster (fails
// under CI=true).
func requireCluster(t *testing.T) {
	t.Helper()
	if envMissing == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("no local cluster: %s", envMissing)
	}
	t.Skip(envMissing)
}

// loadEnv sources the env file with bash (it is a shell file: quoting and
// $PATH expansions are bash's business) and exports its variables into
// this process, so kubectl, helm and node inherit them.
func loadEnv() (clusterEnv, error) {
	if os.Geteuid() != 0 {
		return clusterEnv{}, errors.New("must run as root (host checks: links, nft, mounts, cgroups, cube node mapdump)")
	}
	dir := os.Getenv("CUBE_KUBE_DIR")
	if dir == "" {
		dir = "/var/lib/cube-kube"
	}
	file := filepath.Join(dir, "env")
	if _, err := os.Stat(file); errors.Is(err, fs.ErrNotExist) {
		return clusterEnv{}, fmt.Errorf("%s does not exist: start the local cluster with `make kube-up` (or set CUBE_KUBE_DIR)", file)
	}
	out, err := exec.Command("bash", "-c", `set -a; . "$1" >/dev/null || exit 1; env -0`, "bash", file).Output()
	if err != nil {
		return clusterEnv{}, fmt.Errorf("source %s: %w", file, err)
	}
	vars := map[string]string{}
	for _, kv := range bytes.Split(out, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			vars[k] = v
		}
	}
	var missing []string
	for _, k := range envKeys {
		if vars[k] == "" {
			missing = append(missing, k)
			continue
		}
		os.Setenv(k, vars[k])
	}
	if len(missing) > 0 {
		return clusterEnv{}, fmt.Errorf("%s does not set %s: rerun `make kube-up`", file, strings.Join(missing, ", "))
	}
	wd, err := os.Getwd()
	if err != nil {
		return clusterEnv{}, err
	}
	e := clusterEnv{
		Dir: vars["CUBE_KUBE_DIR"], Namespace: vars["CUBE_KUBE_NAMESPACE"], Release: vars["CUBE_KUBE_RELEASE"],
		Chart: vars["CUBE_KUBE_CHART"], Values: vars["CUBE_KUBE_VALUES"],
		ImageRepo: vars["CUBE_KUBE_IMAGE_REPO"], ImageTag: vars["CUBE_KUBE_IMAGE_TAG"], ImageTagNext: vars["CUBE_KUBE_IMAGE_TAG_NEXT"],
		Node: vars["CUBE_KUBE_NODE"], CubeBin: vars["CUBE_BIN"],
		APIURL: strings.TrimRight(vars["E2B_API_URL"], "/"), APIKey: vars["E2B_API_KEY"],
		E2EDir: filepath.Join(wd, "..", "e2e"),
	}
	for _, p := range []string{e.Chart, e.Values, e.CubeBin, filepath.Join(e.E2EDir, "node_modules", "e2b", "package.json")} {
		if _, err := os.Stat(p); err != nil {
			return clusterEnv{}, fmt.Errorf("%w (the SDK comes from `make deps`; the rest from `make kube-up`)", err)
		}
	}
	for _, tool := range []string{"kubectl", "helm", "node"} {
		if _, err := exec.LookPath(tool); err != nil {
			return clusterEnv{}, fmt.Errorf("%s not on the PATH of %s: %w", tool, file, err)
		}
	}
	return e, nil
}
