package main

import (
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args []string
		argv []string
		fd   int
		ok   bool
	}{
		{[]string{"--", "/envd", "-x"}, []string{"/envd", "-x"}, 0, true},
		{[]string{"--inherit-fd", "3", "--", "/envd"}, []string{"/envd"}, 3, true},
		{[]string{"--"}, nil, 0, false},
		{[]string{}, nil, 0, false},
		{[]string{"/envd"}, nil, 0, false},
		{[]string{"--inherit-fd", "2", "--", "/envd"}, nil, 0, false},
		{[]string{"--inherit-fd", "x", "--", "/envd"}, nil, 0, false},
		{[]string{"--inherit-fd"}, nil, 0, false},
	} {
		argv, fd, ok := parse(tc.args)
		if ok != tc.ok || (ok && (!slices.Equal(argv, tc.argv) || fd != tc.fd)) {
			t.Errorf("parse(%q) = %q %d %v, want %q %d %v", tc.args, argv, fd, ok, tc.argv, tc.fd, tc.ok)
		}
	}
}
