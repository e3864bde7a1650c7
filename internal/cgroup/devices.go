package cgroup

import (
	"fmt"
	"strconv"
)

// Device is one entry of a device allowlist: a character ('c') or block
// ('b') device, or both ('a'), by major and minor number (-1 for any) and the
// access it may have ("r", "w", "m" for mknod, in any combination).
type Device struct {
	Type   byte
	Major  int64
	Minor  int64
	Access string
}

// String returns the rule in the v1 devices.allow syntax ("c 1:3 rw").
func (d Device) String() string {
	num := func(n int64) string {
		if n < 0 {
			return "*"
		}
		return strconv.FormatInt(n, 10)
	}
	return fmt.Sprintf("%c %s:%s %s", d.Type, num(d.Major), num(d.Minor), d.Access)
}

// SandboxDevices is what a sandbox may open: the devices on its /dev (null,
// zero, full, random, urandom, tty) and pseudo-terminals (ptmx and the pts
// slaves). No mknod right: sandboxes run without CAP_MKNOD anyway.
var SandboxDevices = []Device{
	{'c', 1, 3, "rw"},    // null
	{'c', 1, 5, "rw"},    // zero
	{'c', 1, 7, "rw"},    // full
	{'c', 1, 8, "rw"},    // random
	{'c', 1, 9, "rw"},    // urandom
	{'c', 5, 0, "rw"},    // tty
	{'c', 5, 2, "rw"},    // ptmx
	{'c', 136, -1, "rw"}, // pts/* (Unix98 pty slaves)
}

// deviceWrites returns the v1 writes that enforce an allowlist: deny all,
// then allow each entry. Nil means no restriction and no writes. Cgroup v2
// has no devices files: there SetResources attaches a BPF_CGROUP_DEVICE
// program instead (setDevicesV2). A v1 host without a devices hierarchy
// skips these writes (see SetResources), as a v2 kernel without cgroup BPF
// skips the program.
func deviceWrites(v Version, devs []Device) []fileWrite {
	if v == V2 || devs == nil {
		return nil
	}
	w := []fileWrite{{Controller: "devices", File: "devices.deny", Value: "a"}}
	for _, d := range devs {
		if d.Type == 'a' {
			// In devices.allow "a" means "allow everything"; a rule for
			// both types is written as one rule per type.
			c, b := d, d
			c.Type, b.Type = 'c', 'b'
			w = append(w,
				fileWrite{Controller: "devices", File: "devices.allow", Value: c.String()},
				fileWrite{Controller: "devices", File: "devices.allow", Value: b.String()})
			continue
		}
		w = append(w, fileWrite{Controller: "devices", File: "devices.allow", Value: d.String()})
	}
	return w
}
