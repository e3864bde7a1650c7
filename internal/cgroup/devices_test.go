package cgroup

import (
	"errors"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestDeviceRules(t *testing.T) {
	if got := (Device{'c', 136, -1, "rw"}).String(); got != "c 136:* rw" {
		t.Errorf("String = %q", got)
	}
	w := limitWrites(V1, Resources{Devices: SandboxDevices})
	if len(w) < 2 || w[0] != (fileWrite{"devices", "devices.deny", "a", false}) || w[1].Value != "c 1:3 rw" {
		t.Errorf("v1 writes start with %v, want deny all then the allowlist", w[:2])
	}
	for _, x := range limitWrites(V2, Resources{Devices: SandboxDevices}) {
		if x.Controller == "devices" {
			t.Errorf("v2 write to the devices controller: %v", x)
		}
	}
	for _, x := range limitWrites(V1, Resources{}) {
		if x.Controller == "devices" {
			t.Errorf("nil allowlist writes %v", x)
		}
	}
	for _, bad := range []Device{{'x', 1, 3, "rw"}, {'c', -2, 3, "rw"}, {'c', 1, 3, ""}, {'c', 1, 3, "rwx"}} {
		if err := (Resources{Devices: []Device{bad}}).Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Validate(%v) = %v, want ErrInvalidArgument", bad, err)
		}
	}
}
