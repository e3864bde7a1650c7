package hostnetgate

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/cube-dev/cube/internal/errdefs"
)

// apiServer answers GET .../daemonsets/NAME like kube-apiserver does, with
// the status and body given per name.
func apiServer(t *testing.T) *httptest.Server {
	t.Helper()
	status := func(code int, reason string) string {
		return `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"` + reason + `","code":` + strconv.Itoa(code) + `}`
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/apis/apps/v1/namespaces/cube/daemonsets/host":
			w.Write([]byte(`{"kind":"DaemonSet","apiVersion":"apps/v1","metadata":{"name":"host"},"spec":{"template":{"spec":{"hostNetwork":true,"containers":[]}}}}`))
		case "/apis/apps/v1/namespaces/cube/daemonsets/pod":
			w.Write([]byte(`{"kind":"DaemonSet","apiVersion":"apps/v1","metadata":{"name":"pod"},"spec":{"template":{"spec":{"containers":[]}}}}`))
		case "/apis/apps/v1/namespaces/cube/daemonsets/secret":
			w.WriteHeader(http.StatusForbidden)
			w.Write([]byte(status(http.StatusForbidden, "Forbidden")))
		case "/apis/apps/v1/namespaces/cube/daemonsets/broken":
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte(status(http.StatusInternalServerError, "InternalError")))
		default:
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(status(http.StatusNotFound, "NotFound")))
		}
	}))
	// A unix socket: loopback TCP ports may be DNATed by dataplanes that
	// other tests leave on this machine.
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func TestKubeHostNetwork(t *testing.T) {
	srv := apiServer(t)
	sock := srv.Listener.Addr().String()
	cfg := &rest.Config{Host: "http://kube-apiserver", Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}
	k, err := NewKube(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cases := []struct {
		name    string
		want    Live
		wantErr error
	}{
		{"host", Live{true, true}, nil},
		{"pod", Live{true, false}, nil},
		{"absent", Live{}, nil},
		{"secret", Live{}, errdefs.ErrPermissionDenied},
	}
	for _, c := range cases {
		got, err := k.HostNetwork(ctx, "cube", c.name)
		if got != c.want || !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) {
			t.Errorf("%s: = %+v, %v; want %+v, %v", c.name, got, err, c.want, c.wantErr)
		}
	}
	// A server error is Unavailable (client-go retries 5xx a few times).
	if _, err := k.HostNetwork(ctx, "cube", "broken"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("broken: %v", err)
	}
	// The whole gate against that server: refusal names both ways out.
	if _, err := Run(ctx, k, "cube", "host", false, false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("gate = %v", err)
	}
}
