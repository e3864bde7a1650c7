package hostnetgate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestDecide(t *testing.T) {
	cases := []struct {
		name          string
		live          Live
		desired, ack  bool
		allow         bool
		mustMention   []string
		mustNotAppear string
	}{
		{"first install true", Live{}, true, false, true, []string{"does not exist"}, ""},
		{"first install false", Live{}, false, false, true, []string{"hostNetwork=false"}, ""},
		{"unchanged true", Live{true, true}, true, false, true, []string{"keeps hostNetwork=true"}, ""},
		{"unchanged false", Live{true, false}, false, false, true, []string{"keeps hostNetwork=false"}, ""},
		{"unchanged with stale ack", Live{true, true}, true, true, true, []string{"keeps"}, "acknowledged"},
		{"flip to false refused", Live{true, true}, false, false, false,
			[]string{"from true to false", "cubeNode.hostNetworkChangeAck=true", "cubeNode.hostNetwork=true"}, ""},
		{"flip to true refused", Live{true, false}, true, false, false,
			[]string{"from false to true", "cubeNode.hostNetworkChangeAck=true", "cubeNode.hostNetwork=false"}, ""},
		{"flip to false acked", Live{true, true}, false, true, true, []string{"true -> false", "acknowledged"}, ""},
		{"flip to true acked", Live{true, false}, true, true, true, []string{"false -> true", "acknowledged"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Decide("cube-node", c.live, c.desired, c.ack)
			if d.Allow != c.allow {
				t.Fatalf("Allow = %v, want %v (%s)", d.Allow, c.allow, d.Message)
			}
			for _, s := range c.mustMention {
				if !strings.Contains(d.Message, s) {
					t.Errorf("message %q lacks %q", d.Message, s)
				}
			}
			if c.mustNotAppear != "" && strings.Contains(d.Message, c.mustNotAppear) {
				t.Errorf("message %q contains %q", d.Message, c.mustNotAppear)
			}
		})
	}
}

type fakeDS struct {
	live Live
	err  error
	got  string
}

func (f *fakeDS) HostNetwork(_ context.Context, ns, name string) (Live, error) {
	f.got = ns + "/" + name
	return f.live, f.err
}

func TestRun(t *testing.T) {
	ctx := context.Background()
	ds := &fakeDS{live: Live{true, true}}
	if _, err := Run(ctx, ds, "cube-system", "cube-node", false, false); !errors.Is(err, errdefs.ErrFailedPrecondition) ||
		!strings.Contains(err.Error(), "hostNetworkChangeAck") {
		t.Fatalf("refusal = %v", err)
	}
	if ds.got != "cube-system/cube-node" {
		t.Fatalf("asked for %q", ds.got)
	}
	if d, err := Run(ctx, ds, "cube-system", "cube-node", false, true); err != nil || !d.Allow {
		t.Fatalf("acked = %+v, %v", d, err)
	}
	ds.err = fmt.Errorf("boom: %w", errdefs.ErrUnavailable)
	if _, err := Run(ctx, ds, "cube-system", "cube-node", true, false); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("read error = %v", err)
	}
}
