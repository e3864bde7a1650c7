// Package mountinfo holds what every reader of /proc/<pid>/mountinfo needs
// (proc(5)): its fields are escaped, and the same mount point can only be
// compared once they are not.
package mountinfo

import (
	"strconv"
	"strings"
)

// Unescape undoes mountinfo's octal escapes of a path field (\040 for a
// space, \011 tab, \012 newline, \134 backslash).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
