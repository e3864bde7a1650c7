package api

import (
	"encoding/json"
	"time"

	"github.com/cube-dev/cube/internal/master"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/templatebuild"
)

// sandboxJSON is the E2B `Sandbox` object (create 201, connect 200/201).
type sandboxJSON struct {
	SandboxID       string  `json:"sandboxID"`
	TemplateID      string  `json:"templateID"`
	Alias           string  `json:"alias,omitempty"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken,omitempty"`
	Domain          *string `json:"domain"`
	// TrafficAccessToken guards non-envd ports when public traffic is off.
	TrafficAccessToken *string `json:"trafficAccessToken"`
}

// listedJSON is the E2B `ListedSandbox` object.
type listedJSON struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	State       string            `json:"state"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata"`
}

// detailJSON is the E2B `SandboxDetail` object.
type detailJSON struct {
	listedJSON
	EnvdAccessToken     string          `json:"envdAccessToken,omitempty"`
	Domain              *string         `json:"domain"`
	AllowInternetAccess *bool           `json:"allowInternetAccess"`
	Network             *master.Network `json:"network,omitempty"`
	Lifecycle           lifecycleJSON   `json:"lifecycle"`
}

type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// metricJSON is the E2B `SandboxMetric` object.
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

func (s *server) domain() *string {
	if d := s.m.Domain(); d != "" {
		return &d
	}
	return nil
}

// alias is the template name the client used (alias or id).
func alias(sb store.Sandbox) string {
	if sb.Alias != "" {
		return sb.Alias
	}
	return sb.TemplateID
}

// templateID is the template a sandbox reports. A sandbox of a tag
// (name:tag, or a name whose default tag moved) runs on the hidden
// template holding the tag's build (templatebuild.BuildTemplate); it
// reports the template's name, as E2B reports a template's id whatever
// build runs, and the tag in its alias. The record keeps the build
// template: deletes and rebuilds check what sandboxes run on.
func templateID(sb store.Sandbox) string {
	if sb.Alias == "" || !templatebuild.IsBuildTemplate(sb.TemplateID) {
		return sb.TemplateID
	}
	name, err := templatebuild.ParseName(sb.Alias)
	if err != nil {
		return sb.TemplateID // not a tag ref: the build template was asked for by another name
	}
	return name
}

func (s *server) toSandbox(sb store.Sandbox) sandboxJSON {
	return sandboxJSON{
		SandboxID: sb.ID, TemplateID: templateID(sb), Alias: alias(sb), ClientID: ClientID,
		EnvdVersion: sb.EnvdVersion, EnvdAccessToken: sb.EnvdAccessToken, Domain: s.domain(),
		TrafficAccessToken: optional(sb.TrafficAccessToken),
	}
}

// optional is nil (JSON null) for "".
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func toListed(sb store.Sandbox) listedJSON {
	meta := sb.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	return listedJSON{
		SandboxID: sb.ID, TemplateID: templateID(sb), Alias: alias(sb), ClientID: ClientID,
		StartedAt: sb.StartedAt.UTC(), EndAt: sb.EndAt.UTC(), State: string(sb.State),
		CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskSizeMB,
		EnvdVersion: sb.EnvdVersion, Metadata: meta,
	}
}

func (s *server) toDetail(sb store.Sandbox) detailJSON {
	d := detailJSON{
		listedJSON: toListed(sb), EnvdAccessToken: sb.EnvdAccessToken, Domain: s.domain(),
		AllowInternetAccess: sb.AllowInternetAccess,
		Lifecycle:           lifecycleJSON{OnTimeout: sb.Lifecycle.OnTimeout, AutoResume: sb.Lifecycle.AutoResume},
	}
	if d.Lifecycle.OnTimeout == "" {
		d.Lifecycle.OnTimeout = "kill"
	}
	if len(sb.Network) > 0 {
		var n master.Network
		if json.Unmarshal(sb.Network, &n) == nil {
			if n.EgressProxy != nil {
				p := *n.EgressProxy
				p.Password = "" // never echoed back
				n.EgressProxy = &p
			}
			d.Network = &n
		}
	}
	return d
}

func toMetric(m nodeproto.Metrics) metricJSON {
	return metricJSON{
		Timestamp: m.Timestamp.UTC(), TimestampUnix: m.Timestamp.Unix(), CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct,
		MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal,
	}
}
