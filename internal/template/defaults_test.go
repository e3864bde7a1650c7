package template

import "testing"

func TestImageStartCmd(t *testing.T) {
	for _, c := range []struct {
		entrypoint, cmd []string
		want            string
	}{
		{nil, nil, ""},
		{nil, []string{"/bin/hello"}, "/bin/hello"},
		{[]string{"/docker-entrypoint.sh"}, []string{"nginx", "-g", "daemon off;"}, "/docker-entrypoint.sh nginx -g 'daemon off;'"},
		{[]string{"python3", "-c", "print('hi')"}, nil, `python3 -c 'print('\''hi'\'')'`},
		{nil, []string{"echo", "", "$HOME", "a b"}, `echo '' '$HOME' 'a b'`},
		{nil, []string{"env", "A=1", "x@y:z/w.v+u,t%s"}, "env A=1 x@y:z/w.v+u,t%s"},
	} {
		if got := ImageStartCmd(c.entrypoint, c.cmd); got != c.want {
			t.Errorf("ImageStartCmd(%q, %q) = %s, want %s", c.entrypoint, c.cmd, got, c.want)
		}
	}
}
