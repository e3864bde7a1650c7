package cli

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/roles"
)

// clearEnv unsets, for this test, every variable a flag is bound to, so
// the machine's environment does not leak into what the test expects.
func clearEnv(t *testing.T) {
	t.Helper()
	root := newRoot(nil, nil, runners{})
	for _, c := range allCommands(root) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			for _, env := range f.Annotations[envAnnotation] {
				t.Setenv(env, "") // empty is unset for bindEnv
			}
		})
	}
}

// captured runs `cube args...` with roles that record the configuration
// instead of starting anything.
type captured struct {
	code         int
	stderr       string
	allInOne     *roles.AllInOneConfig
	server       *roles.ServerConfig
	cubelet      *roles.CubeletConfig
	startedRoles int
}

func capture(t *testing.T, args ...string) captured {
	t.Helper()
	var c captured
	r := runners{
		allInOne: func(_ context.Context, cfg roles.AllInOneConfig) error {
			c.allInOne = &cfg
			c.startedRoles++
			return nil
		},
		server:  func(_ context.Context, cfg roles.ServerConfig) error { c.server = &cfg; c.startedRoles++; return nil },
		cubelet: func(_ context.Context, cfg roles.CubeletConfig) error { c.cubelet = &cfg; c.startedRoles++; return nil },
	}
	var out, errOut bytes.Buffer
	c.code = run(context.Background(), args, &out, &errOut, r)
	c.stderr = errOut.String()
	return c
}

// TestUpEnvBinding: flag beats environment beats default, on the real
// `cube up` command.
func TestUpEnvBinding(t *testing.T) {
	clearEnv(t)
	c := capture(t, "up")
	if c.code != 0 || c.allInOne == nil {
		t.Fatalf("up: exit %d, %s", c.code, c.stderr)
	}
	def := *c.allInOne
	if def.PoolSize != cubelet.PoolAdaptive || def.PoolMemoryMB <= 0 || !def.PoolPrestart || def.Listen != "127.0.0.1:3000" || def.DataDir != "/var/lib/cube" ||
		def.UserNS != nsrt.UserNSAuto || !def.RateLimits.Creates.Unlimited() || def.Network.PortMin == 0 ||
		def.Capacity == nil || def.Capacity.MaxSandboxes != 0 || def.Capacity.CpuCount != 0 || def.Capacity.MemoryReserveMb <= 0 {
		t.Errorf("defaults: %+v", def)
	}

	t.Setenv("CUBE_POOL_SIZE", "7")
	t.Setenv("CUBE_POOL_PRESTART", "false")
	t.Setenv("CUBE_NODE_CIDR", "10.9.0.0/16")
	t.Setenv("CUBE_PORT_RANGE", "40000-40099")
	t.Setenv("CUBE_USERNS", "off")
	t.Setenv("CUBE_CREATE_RATE_LIMIT", "5:9")
	t.Setenv("CUBE_DATA_DIR", "/srv/cube")
	c = capture(t, "up")
	got := c.allInOne
	if c.code != 0 || got == nil {
		t.Fatalf("up with env: exit %d, %s", c.code, c.stderr)
	}
	if got.PoolSize != 7 || got.PoolPrestart || got.Network.NodeCIDR != netip.MustParsePrefix("10.9.0.0/16") ||
		got.Network.PortMin != 40000 || got.Network.PortMax != 40099 || got.UserNS != nsrt.UserNSOff ||
		got.RateLimits.Creates.Rate != 5 || got.RateLimits.Creates.Burst != 9 || got.DataDir != "/srv/cube" {
		t.Errorf("env not applied: %+v", *got)
	}

	c = capture(t, "up", "--pool-size", "3", "--pool-prestart=true", "--data-dir=/d", "--port-range", "50000-50001")
	if got := c.allInOne; c.code != 0 || got.PoolSize != 3 || !got.PoolPrestart || got.DataDir != "/d" || got.Network.PortMin != 50000 {
		t.Errorf("flags do not beat env: exit %d %s %+v", c.code, c.stderr, c.allInOne)
	}
	if c = capture(t, "up", "-create-parallelism", "-1", "-keep-sandboxes"); c.code != 0 || c.allInOne.CreateParallelism != -1 || !c.allInOne.KeepSandboxes {
		t.Errorf("up -create-parallelism -1 -keep-sandboxes: exit %d %s %+v", c.code, c.stderr, c.allInOne)
	}
	// --pool-templates: one code-interpreter slot by default; the first
	// value replaces it, a repeated flag adds; empty is none.
	interp := []cubelet.PoolTarget{{Template: "code-interpreter-v1", Size: 1}}
	if !slices.Equal(def.PoolTemplates, interp) {
		t.Errorf("default pool templates %v", def.PoolTemplates)
	}
	c = capture(t, "up", "--pool-templates", "a=2, b=0", "--pool-templates", "c=1")
	if want := []cubelet.PoolTarget{{Template: "a", Size: 2}, {Template: "b", Size: 0}, {Template: "c", Size: 1}}; c.code != 0 || !slices.Equal(c.allInOne.PoolTemplates, want) {
		t.Errorf("--pool-templates a=2,b=0 --pool-templates c=1: exit %d %s %v", c.code, c.stderr, c.allInOne)
	}
	c = capture(t, "up", "--pool-templates", "code-interpreter-v1=auto")
	if want := []cubelet.PoolTarget{{Template: "code-interpreter-v1", Size: cubelet.PoolAdaptive}}; c.code != 0 || !slices.Equal(c.allInOne.PoolTemplates, want) {
		t.Errorf("--pool-templates code-interpreter-v1=auto: exit %d %s %v", c.code, c.stderr, c.allInOne)
	}
	if c = capture(t, "up", "--pool-templates", "x=-1"); c.code != 2 || !strings.Contains(c.stderr, "TEMPLATE=auto") {
		t.Errorf("--pool-templates x=-1: exit %d %s", c.code, c.stderr)
	}
	if c = capture(t, "up", "--pool-templates="); c.code != 0 || len(c.allInOne.PoolTemplates) != 0 {
		t.Errorf("--pool-templates= : exit %d %s %v", c.code, c.stderr, c.allInOne)
	}
	t.Setenv("CUBE_POOL_TEMPLATES", "x=3")
	if c = capture(t, "up"); c.code != 0 || !slices.Equal(c.allInOne.PoolTemplates, []cubelet.PoolTarget{{Template: "x", Size: 3}}) {
		t.Errorf("CUBE_POOL_TEMPLATES=x=3: exit %d %s %v", c.code, c.stderr, c.allInOne)
	}
	t.Setenv("CUBE_POOL_TEMPLATES", "")

	// A flag on the command line means the variable is not read at all.
	t.Setenv("CUBE_POOL_SIZE", "abc")
	if c = capture(t, "up", "--pool-size", "2"); c.code != 0 || c.allInOne.PoolSize != 2 {
		t.Errorf("--pool-size 2 with CUBE_POOL_SIZE=abc: exit %d %s", c.code, c.stderr)
	}
}

// TestUpBadEnvFailsFirst: `CUBE_POOL_SIZE=abc cube up` fails at once,
// naming the variable, before anything starts or is written; likewise
// every other bound variable given a malformed value.
func TestUpBadEnvFailsFirst(t *testing.T) {
	for env, val := range map[string]string{
		"CUBE_POOL_SIZE":          "abc",
		"CUBE_POOL_PRESTART":      "maybe",
		"CUBE_CREATE_PARALLELISM": "2.5",
		"CUBE_NODE_CIDR":          "10.0.0.0",
		"CUBE_TRANSIT":            "nope",
		"CUBE_PORT_RANGE":         "9-3",
		"CUBE_USERNS":             "sometimes",
		"CUBE_CREATE_RATE_LIMIT":  "fast",
		"CUBE_API_RATE_LIMIT":     "10:0",
		"CUBE_LOG_LEVEL":          "loud",
		"CUBE_POOL_TEMPLATES":     "code-interpreter-v1",
	} {
		t.Run(env, func(t *testing.T) {
			clearEnv(t)
			t.Setenv(env, val)
			dataDir := filepath.Join(t.TempDir(), "x")
			c := capture(t, "up", "--data-dir", dataDir, "--pprof", "127.0.0.1:0")
			want := "invalid " + env + ` "` + val + `"`
			if c.code != 2 || !strings.Contains(c.stderr, want) {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", c.code, c.stderr, want)
			}
			if c.startedRoles != 0 {
				t.Errorf("cube up started with %s=%q", env, val)
			}
			if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
				t.Errorf("data dir touched: %v", err)
			}
		})
	}
}

func TestServerAndCubeletEnv(t *testing.T) {
	clearEnv(t)
	t.Setenv("CUBE_ROLES", "api, proxy")
	t.Setenv("CUBE_REQUIRE_NODE_KEY", "true")
	t.Setenv("CUBE_LOG_LEVEL", "DEBUG")
	c := capture(t, "server")
	if c.code != 0 || !slices.Equal(c.server.Roles, []string{"api", "proxy"}) || !c.server.RequireNodeKey {
		t.Fatalf("server: exit %d %s %+v", c.code, c.stderr, c.server)
	}
	if !c.server.Logger.Enabled(context.Background(), slog.LevelDebug) {
		t.Error("CUBE_LOG_LEVEL=DEBUG: debug logs disabled")
	}
	t.Setenv("CUBE_REQUIRE_NODE_KEY", "yes")
	if c := capture(t, "server"); c.code != 2 || !strings.Contains(c.stderr, `invalid CUBE_REQUIRE_NODE_KEY "yes"`) || c.startedRoles != 0 {
		t.Errorf("CUBE_REQUIRE_NODE_KEY=yes: exit %d %s", c.code, c.stderr)
	}

	t.Setenv("CUBE_SERVER", "http://a:3000/, http://b:3000")
	t.Setenv("CUBE_NODE_ID", "n7")
	t.Setenv("CUBE_CUBELET_LISTEN", "127.0.0.1:7171")
	c = capture(t, "cubelet", "--pool-size=0", "--max-sandboxes", "9")
	if got := c.cubelet; c.code != 0 || !slices.Equal(got.ServerURLs, []string{"http://a:3000", "http://b:3000"}) ||
		got.NodeID != "n7" || got.Listen != "127.0.0.1:7171" || got.PoolSize != 0 || got.Capacity.MaxSandboxes != 9 {
		t.Errorf("cubelet: exit %d %s %+v", c.code, c.stderr, c.cubelet)
	}
	t.Setenv("CUBE_CPU_OVERCOMMIT", "3")
	c = capture(t, "cubelet", "--memory-reserve-mb", "700")
	if got := c.cubelet; c.code != 0 || got.PoolSize != cubelet.PoolAdaptive || got.Capacity.MaxSandboxes != 500 || got.Capacity.MaxCreates != 0 ||
		got.Capacity.CpuCount != int32(3*runtime.NumCPU()) || got.Capacity.MemoryReserveMb != 700 || got.Capacity.MemoryMb != 0 {
		t.Errorf("cubelet capacity: exit %d %s %+v", c.code, c.stderr, c.cubelet)
	}
	t.Setenv("CUBE_CPU_OVERCOMMIT", "")
	t.Setenv("CUBE_POOL_SIZE", "many")
	if c := capture(t, "cubelet"); c.code != 2 || !strings.Contains(c.stderr, `invalid CUBE_POOL_SIZE "many"`) || c.startedRoles != 0 {
		t.Errorf("cubelet with CUBE_POOL_SIZE=many: exit %d %s", c.code, c.stderr)
	}
}

// TestBindEnv: the first of several variables that is set wins, an empty
// one counts as unset, and help names them.
func TestBindEnv(t *testing.T) {
	t.Setenv("CUBE_TEST_A", "")
	t.Setenv("CUBE_TEST_B", "from-b")
	var v string
	c := &cobra.Command{Use: "x"}
	c.Flags().StringVar(&v, "key", "default", "a key")
	bindEnv(c.Flags(), "key", "CUBE_TEST_A", "CUBE_TEST_B")
	if err := applyEnv(c); err != nil || v != "from-b" {
		t.Fatalf("v = %q, %v; want from-b", v, err)
	}
	t.Setenv("CUBE_TEST_A", "from-a")
	if err := applyEnv(c); err != nil || v != "from-a" {
		t.Fatalf("v = %q, %v; want from-a", v, err)
	}
	if u := c.Flags().Lookup("key").Usage; !strings.Contains(u, "env CUBE_TEST_A, else CUBE_TEST_B") {
		t.Errorf("usage %q does not name the variables", u)
	}
	var n int
	c.Flags().IntVar(&n, "n", 1, "a number")
	bindEnv(c.Flags(), "n", "CUBE_TEST_N")
	t.Setenv("CUBE_TEST_N", "x1")
	err := applyEnv(c)
	var ue usageError
	if err == nil || !strings.Contains(err.Error(), `invalid CUBE_TEST_N "x1" (for --n)`) || !errors.As(err, &ue) {
		t.Errorf("bad value: %v; want a usage error naming CUBE_TEST_N", err)
	}
}
