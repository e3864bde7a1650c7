package cubelet

import (
	"os"
	"testing"

	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/template"
)

// TestTakeSlotChoice is takeSlot's decision: a pre-started slot of the
// template's content and disk size first, else a plain slot, never a
// pre-started slot of another template; pre-started slots of an older
// content of the template are set aside to be dropped.
func TestTakeSlotChoice(t *testing.T) {
	base := template.Template{Name: "base", Digest: "sha256:new", DiskSizeMB: 1024}
	pre := func(id, tmpl, digest string, disk int) poolSlot {
		return poolSlot{rec: nodestore.Sandbox{ID: id, Template: tmpl, DiskSizeMB: disk}, stage: stagePrestarted, digest: digest}
	}
	// A plain slot is told by its stage, not by its record: one that names
	// a template is still plain.
	plain := poolSlot{rec: nodestore.Sandbox{ID: "pool-plain", Template: "base", DiskSizeMB: poolDiskSizeMB}, stage: stagePlain}
	for _, tc := range []struct {
		name      string
		ready     []poolSlot
		tmpl      template.Template
		want      string // "" = none
		wantStale int
		wantLeft  int
	}{
		{"pre-started fits", []poolSlot{plain, pre("pool-a", "base", "sha256:new", 1024)}, base, "pool-a", 0, 1},
		{"plain when none fits", []poolSlot{plain, pre("pool-a", "other", "x", 1024)}, base, "pool-plain", 0, 1},
		{"other disk size", []poolSlot{pre("pool-a", "base", "sha256:new", 2048)}, base, "", 0, 1},
		{"other template only", []poolSlot{pre("pool-a", "other", "x", 1024)}, base, "", 0, 1},
		{"outdated content set aside", []poolSlot{pre("pool-old", "base", "sha256:old", 1024), plain}, base, "pool-plain", 1, 0},
		{"outdated and fitting", []poolSlot{pre("pool-new", "base", "sha256:new", 1024), pre("pool-old", "base", "sha256:old", 1024)}, base, "pool-new", 1, 0},
		{"empty", nil, base, "", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Cubelet{pool: pool{kick: make(chan struct{}, 1), ready: append([]poolSlot(nil), tc.ready...)}}
			got, ok := c.takeSlot(tc.tmpl)
			if ok != (tc.want != "") || got.rec.ID != tc.want {
				t.Fatalf("took %q (%v), want %q", got.rec.ID, ok, tc.want)
			}
			if len(c.pool.stale) != tc.wantStale || len(c.pool.ready) != tc.wantLeft {
				t.Fatalf("stale %d ready %d, want %d %d", len(c.pool.stale), len(c.pool.ready), tc.wantStale, tc.wantLeft)
			}
		})
	}
}

func TestProcAndNetnsIdentity(t *testing.T) {
	self := procOf(os.Getpid())
	if self.pid != os.Getpid() || self.start == "" || procOf(os.Getpid()) != self {
		t.Fatalf("procOf(self) = %+v", self)
	}
	if procOf(-1) != (procID{}) || procOf(1<<30) != (procID{}) {
		t.Fatal("procOf of no process is not zero")
	}
	if netnsOf(os.Getpid()) == (nsID{}) || netnsOf(-1) != (nsID{}) {
		t.Fatal("netnsOf")
	}
	s := poolSlot{initPID: os.Getpid(), initNS: netnsOf(os.Getpid()), shim: self}
	if !s.alive() {
		t.Fatal("live slot reported dead")
	}
	s.shim.start += "0"
	if s.alive() {
		t.Fatal("slot with a reused shim pid reported alive")
	}
}
