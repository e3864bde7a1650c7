package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// One envtest kube-apiserver + etcd per package run, started by the first
// test that needs it and stopped by TestMain; the render-only tests never
// start it.
var apiServer struct {
	once sync.Once
	env  *envtest.Environment
	cfg  *rest.Config
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if apiServer.env != nil {
		if err := apiServer.env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stop envtest: %v\n", err)
		}
	}
	os.Exit(code)
}

// assetsMissing says why envtest cannot start here ("" when it can).
func assetsMissing() string {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		return "KUBEBUILDER_ASSETS is not set: run KUBEBUILDER_ASSETS=\"$(bash hack/kube-test-assets.sh)\" go test ./test/kube/ (or make unit)"
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return fmt.Sprintf("KUBEBUILDER_ASSETS=%s has no %s: run bash hack/kube-test-assets.sh", assets, b)
		}
	}
	return ""
}

// realAPIServer returns a REST config for the shared envtest API server.
// Without assets it skips, or fails under CI=true so a CI machine without
// them is noticed.
func realAPIServer(t *testing.T) *rest.Config {
	t.Helper()
	if why := assetsMissing(); why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("kube-apiserver tests cannot run: %s", why)
		}
		t.Skip(why)
	}
	apiServer.once.Do(func() {
		env := &envtest.Environment{BinaryAssetsDirectory: os.Getenv("KUBEBUILDER_ASSETS")}
		cfg, err := env.Start()
		if err != nil {
			apiServer.err = fmt.Errorf("start envtest (KUBEBUILDER_ASSETS=%s): %w", os.Getenv("KUBEBUILDER_ASSETS"), err)
			return
		}
		apiServer.env, apiServer.cfg = env, cfg
	})
	if apiServer.err != nil {
		t.Fatal(apiServer.err)
	}
	return rest.CopyConfig(apiServer.cfg)
}

// warnings collects the API server's Warning headers.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.list
	w.list = nil
	return l
}
