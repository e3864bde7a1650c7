package roles

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cube-dev/cube/internal/cluster"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/master"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/proxy"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatebuild"
)

// buildSandboxTimeout is the lifetime of a template build's sandbox: the
// build kills it when it ends; the timeout only bounds a build that was
// cut short without doing so.
const buildSandboxTimeout = 2 * time.Hour

// buildSandboxes runs template builds' sandboxes through the master (so
// they are scheduled, recorded and expire like any sandbox) and commits
// them through the registry, on the node that runs them.
type buildSandboxes struct {
	m   *master.Master
	reg *cluster.Registry
	// dial reaches sandbox addresses (the all-in-one node's dataplane
	// dialer; nil: the host's routes, as in cluster mode).
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

var _ templatebuild.Sandboxes = buildSandboxes{}

func (b buildSandboxes) CreateBuildSandbox(ctx context.Context, parent string, _, _ int) (string, error) {
	timeout := buildSandboxTimeout
	sb, err := b.m.Create(ctx, master.CreateParams{TemplateID: parent, Timeout: &timeout, BuildSandbox: true,
		Metadata: map[string]string{"cube.dev/purpose": "template-build"}})
	if err != nil {
		return "", err
	}
	return sb.ID, nil
}

func (b buildSandboxes) Envd(ctx context.Context, id string) (*http.Client, string, string, error) {
	sb, err := b.m.Get(ctx, id)
	if err != nil {
		return nil, "", "", err
	}
	addr, err := b.m.SandboxAddr(ctx, id, proxy.EnvdPort)
	if err != nil {
		return nil, "", "", err
	}
	tr := &http.Transport{DisableKeepAlives: true}
	if b.dial != nil {
		tr.DialContext = b.dial
	}
	return &http.Client{Transport: tr}, "http://" + addr, sb.EnvdAccessToken, nil
}

func (b buildSandboxes) CommitSandbox(ctx context.Context, req nodeproto.CommitRequest) error {
	_, err := b.reg.CommitSandbox(ctx, req)
	return err
}

func (b buildSandboxes) KillSandbox(ctx context.Context, id string) error {
	return b.m.Kill(ctx, id)
}

// clusterTemplates is what exists for template builds in cluster mode:
// the server's registry, then the templates the control-plane store
// records (built templates shipped as layers, images imported by any
// server replica), then the templates nodes report (a template built
// while the store was unreachable lives on its node only). Records come
// before nodes: they are what the server ships; nodes report the defaults
// of theirs too.
type clusterTemplates struct {
	server  templatebuild.RegistryTemplates
	records templateRecords // nil: none
	reg     *cluster.Registry
}

// templateRecords reads the templates the store records (store.Store
// implements it).
type templateRecords interface {
	GetTemplateRecord(ctx context.Context, name string) (store.TemplateRecord, error)
	ListTemplateRecords(ctx context.Context) ([]store.TemplateRecord, error)
}

var _ templatebuild.Templates = clusterTemplates{}

func (c clusterTemplates) List(ctx context.Context) ([]templatebuild.TemplateInfo, error) {
	out, err := c.server.List(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, t := range out {
		seen[t.Name] = true
	}
	if c.records != nil {
		recs, err := c.records.ListTemplateRecords(ctx)
		if err != nil {
			return nil, fmt.Errorf("list template records: %w", err)
		}
		for _, rec := range recs {
			if !seen[rec.Name] {
				seen[rec.Name] = true
				out = append(out, recordInfo(rec))
			}
		}
	}
	for _, t := range c.reg.NodeTemplates() {
		if !seen[t.Name] {
			seen[t.Name] = true
			out = append(out, nodeTemplateInfo(t))
		}
	}
	return out, nil
}

func (c clusterTemplates) Get(ctx context.Context, name string) (templatebuild.TemplateInfo, error) {
	t, err := c.server.Get(ctx, name)
	if !errors.Is(err, errdefs.ErrNotFound) {
		return t, err
	}
	if c.records != nil {
		rec, err := c.records.GetTemplateRecord(ctx, name)
		if err == nil {
			return recordInfo(rec), nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return templatebuild.TemplateInfo{}, fmt.Errorf("template %q: %w", name, err)
		}
	}
	for _, nt := range c.reg.NodeTemplates() {
		if nt.Name == name {
			return nodeTemplateInfo(nt), nil
		}
	}
	return templatebuild.TemplateInfo{}, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
}

// recordInfo is a store record as the build service sees it, with the
// defaults it was recorded with.
func recordInfo(rec store.TemplateRecord) templatebuild.TemplateInfo {
	ti := templatebuild.TemplateInfo{Name: rec.Name, CPUCount: rec.CPUCount, MemoryMB: rec.MemoryMB, DiskSizeMB: rec.DiskSizeMB,
		Digest: rec.Digest, CreatedAt: rec.CreatedAt}
	withDefaults(&ti, rec.Defaults)
	return ti
}

// nodeTemplateInfo is a template a node reports, with the defaults it
// reports (a build continuing from a step-cache template on a node starts
// from the env, workdir and user of the cached steps).
func nodeTemplateInfo(t cluster.TemplateRef) templatebuild.TemplateInfo {
	ti := templatebuild.TemplateInfo{Name: t.Name, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB, Digest: t.Digest}
	withDefaults(&ti, t.Defaults)
	return ti
}

// withDefaults sets ti's process defaults from template.json's "defaults"
// (unreadable ones are logged and left out).
func withDefaults(ti *templatebuild.TemplateInfo, raw json.RawMessage) {
	d, err := template.ParseDefaults(raw)
	if err != nil {
		slog.Warn("template has unreadable defaults", "template", ti.Name, "err", err)
		return
	}
	if d != nil {
		ti.Env, ti.Workdir, ti.User = d.Env, d.Workdir, d.User
	}
}

// Delete removes the server's copy, the nodes' (a built template lives
// on the node that built it, and on the nodes that fetched it) and the
// store's record (cluster.Registry.DeleteTemplate: also when no node
// holds it).
func (c clusterTemplates) Delete(ctx context.Context, name string) error {
	serverErr := c.server.Delete(ctx, name)
	if serverErr != nil && !errors.Is(serverErr, errdefs.ErrNotFound) {
		return serverErr
	}
	nodeErr := c.reg.DeleteTemplate(ctx, name)
	if nodeErr == nil || (errors.Is(nodeErr, errdefs.ErrNotFound) && serverErr == nil) {
		return nil
	}
	return nodeErr
}

// newTemplateBuilds starts the template build service over the store:
// uploads spooled in <dataDir>/template-files and kept in the store, upload
// URLs signed with the store's shared key (seeded from the key earlier
// versions kept in <dataDir>/template-files.key, so URLs handed out before
// an upgrade still work). Builds fromImage import their images into server,
// the server's registry, over plain HTTP only from the registries insecure
// lists; with shared (cluster mode, nil otherwise) they are also stored
// there for every server replica, which reuse them from there.
func newTemplateBuilds(ctx context.Context, dataDir string, st templatebuild.Store, sbx templatebuild.Sandboxes,
	tpls templatebuild.Templates, server *template.Registry, shared imageStore, insecure []string, metrics prometheus.Registerer, log *slog.Logger) (*templatebuild.Service, error) {
	bm, err := templatebuild.NewMetrics(metrics)
	if err != nil {
		return nil, err
	}
	images, err := newRegistryImages(server, insecure)
	if err != nil {
		return nil, err
	}
	images.shared, images.log = shared, log.With("role", "template-builds")
	secret, err := uploadSecret(ctx, st, filepath.Join(dataDir, "template-files.key"))
	if err != nil {
		return nil, err
	}
	return templatebuild.New(ctx, templatebuild.Config{Store: st, Sandboxes: sbx, Templates: tpls, Images: images,
		FilesDir: filepath.Join(dataDir, "template-files"), Secret: secret, Instance: buildInstance(dataDir),
		Metrics: bm, Logger: log.With("role", "template-builds")})
}

// uploadSecret returns the key that signs upload URLs, shared by every
// replica through the store (the first replica's candidate wins): the key
// of legacyPath when an earlier version made one, else a random one.
// Replicas share the store already, so no further secret needs deploying.
func uploadSecret(ctx context.Context, st templatebuild.Store, legacyPath string) ([]byte, error) {
	candidate, err := os.ReadFile(legacyPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", legacyPath, err)
	}
	if len(candidate) < 32 {
		candidate = make([]byte, 32)
		rand.Read(candidate)
	}
	secret, err := st.SharedSecret(ctx, templatebuild.UploadSecretName, candidate)
	if err != nil {
		return nil, fmt.Errorf("template upload key: %w", err)
	}
	return secret, nil
}

// buildInstance names this server among the replicas, the same across its
// restarts: host name (the pod name on Kubernetes) and data dir (several
// servers on one host have their own).
func buildInstance(dataDir string) string {
	host, _ := os.Hostname()
	if abs, err := filepath.Abs(dataDir); err == nil {
		dataDir = abs
	}
	return host + ":" + dataDir
}
