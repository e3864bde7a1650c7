package api

import (
	"errors"
	"maps"
	"net/url"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

// sdkMetadata encodes one pair like the JS SDK: encodeURIComponent on key and
// value, URLSearchParams, then the query parameter encoding.
func sdkMetadata(k, v string) string {
	enc := func(s string) string { return strings.ReplaceAll(url.QueryEscape(s), "+", "%20") }
	form := url.Values{enc(k): {enc(v)}}.Encode()
	return "metadata=" + url.QueryEscape(form)
}

func TestParseMetadataQuery(t *testing.T) {
	cases := []struct {
		name string
		raw  string // the raw query string as on the wire
		want map[string]string
		err  bool
	}{
		{"observed SDK example", "metadata=a%252520b%3Dx%252526y%25253Dz", map[string]string{"a b": "x&y=z"}, false},
		{"two pairs", "metadata=k%3Dv%26team%3Da", map[string]string{"k": "v", "team": "a"}, false},
		{"single-encoded client", "metadata=k%3Dv", map[string]string{"k": "v"}, false},
		{"unicode", sdkMetadata("ключ", "значение/?"), map[string]string{"ключ": "значение/?"}, false},
		{"plus stays plus", sdkMetadata("a", "1+1 2"), map[string]string{"a": "1+1 2"}, false},
		{"percent", sdkMetadata("p%", "100%"), map[string]string{"p%": "100%"}, false},
		{"empty value", "metadata=k%3D", map[string]string{"k": ""}, false},
		{"absent", "", nil, false},
		{"bad escape", "metadata=%25zz", nil, true},
		{"bad third escape", "metadata=k%3D%252", nil, true},
		{"empty key", "metadata=%3Dv", nil, true},
	}
	if got := sdkMetadata("a b", "x&y=z"); got != "metadata=a%252520b%3Dx%252526y%25253Dz" {
		t.Fatalf("helper does not reproduce the observed SDK encoding: %s", got)
	}
	for _, c := range cases {
		q, err := url.ParseQuery(c.raw)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := parseMetadataQuery(q.Get("metadata"))
		if c.err {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%s: err = %v, want ErrInvalidArgument", c.name, err)
			}
			continue
		}
		if err != nil || !maps.Equal(got, c.want) {
			t.Errorf("%s: got %v, %v; want %v", c.name, got, err, c.want)
		}
	}
}

func FuzzParseMetadataQuery(f *testing.F) {
	for _, s := range []string{"a%2520b=x%2526y%253Dz", "k=v&k=w", "%zz", "=", "a=%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		m, err := parseMetadataQuery(v)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("error kind: %v", err)
			}
			return
		}
		for k := range m {
			if k == "" {
				t.Fatal("empty key accepted")
			}
		}
	})
}

func FuzzDecodeCreate(f *testing.F) {
	for _, s := range []string{`{"templateID":"base"}`, `{"templateID":"base","metadata":{"k":"v"},"envVars":{"A":"1"},"timeout":300}`,
		`{"templateID":"base","timeout":-1}`, `{"templateID":"b","network":{"allowOut":["1.1.1.1"]},"autoResume":{"enabled":true}}`, `{`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := decodeCreate(body)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) && !errors.Is(err, errdefs.ErrNotImplemented) {
				t.Fatalf("error kind: %v", err)
			}
			return
		}
		if p.TemplateID == "" {
			t.Fatal("accepted a body without templateID")
		}
		if p.Timeout != nil && (*p.Timeout < -1e9) {
			t.Fatalf("timeout conversion overflowed: %v", *p.Timeout)
		}
	})
}
