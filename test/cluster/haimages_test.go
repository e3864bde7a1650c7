package cluster_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/imagetest"
	"github.com/cube-dev/cube/internal/pgtest"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatebuild"
)

// TestImageBuildsAcrossReplicas: with two `cube server` replicas on one
// PostgreSQL database, a build fromImage through replica A imports the
// image on A and stores it as a layer in the database, so the node, whose
// cubelet knows only replica B, fetches the image template from B (from
// the stored layer: B never pulled it); a second build of the same image
// through B reuses it without reading the image's layer from the registry
// again.
func TestImageBuildsAcrossReplicas(t *testing.T) {
	needBins(t)
	dsn := pgtest.New(t).NewDatabase(t)
	img := busyboxImage(t)
	layerDigest := imagetest.LayerDigest(t, img)
	registry := imagetest.NewRegistry(t)
	host := registry.Host
	ref := registry.Push(t, "cube-test/busybox:1", img)
	digest, _ := img.Digest()
	imageTpl := templatebuild.ImageTemplate(digest.String())

	c := &cluster{t: t, dir: t.TempDir(), key: "cube_test_" + randHex(8), nodes: map[string]*nodeProc{}}
	newServer := func(name string) *haServer {
		port := freePort(t)
		s := &haServer{name: name, url: fmt.Sprintf("http://127.0.0.1:%d", port)}
		s.args = []string{"server", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--data-dir", filepath.Join(c.dir, name),
			"--api-key", c.key, "--db", dsn, "--node-down-after", "2s", "--insecure-registry", host}
		s.p = start(t, filepath.Join(c.dir, name+".log"), s.args...)
		c.server = s.p
		c.waitFor(name+" health", 30*time.Second, func() bool {
			res, err := http.Get(s.url + "/health")
			if err == nil {
				res.Body.Close()
			}
			return err == nil && res.StatusCode == 200
		})
		return s
	}
	a := newServer("server-a")
	b := newServer("server-b")
	// The cubelet knows B only: every template it lacks comes from B.
	c.url, c.server = b.url, b.p
	n := c.addNode("img1")
	call := func(s *haServer, method, path string, body, out any, want int) {
		t.Helper()
		c.url = s.url
		c.call(method, path, body, out, want)
	}
	build := func(s *haServer, tplName string) string {
		t.Helper()
		var req struct{ TemplateID, BuildID string }
		call(s, http.MethodPost, "/v3/templates", map[string]any{"name": tplName}, &req, 202)
		steps := []map[string]any{{"type": "RUN", "args": []string{"echo from-image > /img.txt", "root"}, "force": false}}
		call(s, http.MethodPost, "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, map[string]any{"fromImage": ref, "steps": steps, "force": false}, nil, 202)
		var st buildInfo
		c.waitFor("build of "+tplName, 3*time.Minute, func() bool {
			call(s, http.MethodGet, "/templates/"+req.TemplateID+"/builds/"+req.BuildID+"/status", nil, &st, 200)
			return st.Status == "ready" || st.Status == "error"
		})
		logs := allLogs(t, call, s, req.TemplateID, req.BuildID)
		if st.Status != "ready" {
			t.Fatalf("build of %s through %s ended %s: %+v\nlogs:\n%s\n%s:\n%s\nnode:\n%s", tplName, s.name, st.Status, st.Reason, logs,
				s.name, s.p.Tail(), n.p.Tail())
		}
		return logs
	}
	ctx := context.Background()
	regOf := func(dir string) *template.Registry { return template.NewRegistry(filepath.Join(c.dir, dir)) }

	logs := build(a, "ha-img-a")
	if registry.BlobReads(layerDigest) != 1 || !strings.Contains(logs, "storing template "+imageTpl+" for the other server replicas") {
		t.Fatalf("build through A read the image's layer %d times; logs:\n%s", registry.BlobReads(layerDigest), logs)
	}
	if _, err := regOf("server-a").Get(ctx, imageTpl); err != nil {
		t.Fatalf("A's registry lacks the image template: %v", err)
	}
	if _, err := regOf("server-b").Get(ctx, imageTpl); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("B's registry: %v, want no copy", err)
	}
	onNode, err := regOf(n.id).Get(ctx, imageTpl)
	if err != nil || len(onNode.Layers) != 0 {
		t.Fatalf("node's image template %+v: %v", onNode, err)
	}
	nodeLog := n.p.Read()
	if !strings.Contains(nodeLog, "fetched template by layers") || !strings.Contains(nodeLog, "template="+imageTpl) ||
		!strings.Contains(nodeLog, "from=(nothing)") {
		t.Fatalf("node log does not show the image template fetched from its layer:\n%s", n.p.Tail())
	}
	if !strings.Contains(a.p.Read(), "imported image template stored for the other server replicas") {
		t.Errorf("A's log does not say it stored the image template")
	}

	logs = build(b, "ha-img-b")
	if registry.BlobReads(layerDigest) != 1 || !strings.Contains(logs, "already imported as template "+imageTpl+" (by another server replica)") {
		t.Fatalf("build through B read the image's layer %d times in all; logs:\n%s", registry.BlobReads(layerDigest), logs)
	}
	if _, err := regOf("server-b").Get(ctx, imageTpl); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("B imported the image after all: %v", err)
	}
	built, err := regOf(n.id).Get(ctx, "ha-img-b")
	// On the image template (via the step cache the first build left).
	if err != nil || len(built.Layers) < 2 || built.Layers[0].Digest != onNode.Digest {
		t.Fatalf("built template %+v: %v (image template %s)", built, err, onNode.Digest)
	}
	if b, err := os.ReadFile(filepath.Join(built.RootfsPath, "img.txt")); err != nil || string(b) != "from-image\n" {
		t.Fatalf("img.txt %q %v", b, err)
	}
}

// busyboxImage is a one-layer image of the busybox rootfs for this host's
// platform.
func busyboxImage(t *testing.T) v1.Image {
	t.Helper()
	root := busyboxRootfs(t)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		target := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(path); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		hdr.Name, hdr.Uname, hdr.Gname, hdr.Uid, hdr.Gid = rel, "", "", 0, 0
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return imagetest.Image(t, v1.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/root"}, buf.Bytes())
}
