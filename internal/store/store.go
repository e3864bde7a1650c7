// Package store is the control plane's durable state: sandboxes and API keys.
// Two implementations share one schema, one set of migrations and one set of
// queries: SQLite (modernc.org/sqlite, pure Go; the embedded default for one
// server) and PostgreSQL (pgx; several server replicas). Open picks one from a
// database address. Dialect differences live in dialect.go only.
package store

import (
	"encoding/json"
	"time"
)

// State is the lifecycle state of a sandbox as the control plane records it.
type State string

// Sandbox states.
const (
	StateRunning State = "running"
	StatePaused  State = "paused"
)

// Valid reports whether s is a known state.
func (s State) Valid() bool { return s == StateRunning || s == StatePaused }

// Lifecycle says what happens at endAt.
type Lifecycle struct {
	// OnTimeout is "kill" (default) or "pause".
	OnTimeout string `json:"onTimeout"`
	// AutoResume records the client's autoResume.enabled wish.
	AutoResume bool `json:"autoResume"`
	// KeepMemory records autoPauseMemory.
	KeepMemory bool `json:"keepMemory,omitempty"`
}

// Sandbox is one sandbox record.
type Sandbox struct {
	ID              string
	TemplateID      string
	Alias           string
	NodeID          string
	Metadata        map[string]string
	EnvVars         map[string]string
	StartedAt       time.Time
	EndAt           time.Time
	State           State
	CPUCount        int
	MemoryMB        int
	DiskSizeMB      int
	EnvdVersion     string
	EnvdAccessToken string
	// TrafficAccessToken must accompany requests to non-envd ports when the
	// sandbox's public traffic is disabled ("" = public).
	TrafficAccessToken  string
	AllowInternetAccess *bool
	// Network is the client's network configuration, stored verbatim as JSON
	// (nil when none was given).
	Network   json.RawMessage
	Lifecycle Lifecycle
}

// Order is the sort direction of a listing, by start time.
type Order string

// Listing orders.
const (
	OrderDesc Order = "desc"
	OrderAsc  Order = "asc"
)

// Listing limits.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// ListFilter selects sandboxes. Zero values mean "no filter".
type ListFilter struct {
	// Metadata pairs must all match exactly.
	Metadata map[string]string
	// States is the set of accepted states; empty = all.
	States []State
	// StartedAfter keeps sandboxes with started_at >= StartedAfter.
	StartedAfter time.Time
	// Template matches template_id or alias.
	Template string
	// AnyTag makes Template also match the sandboxes created from one of
	// its tags (alias Template:tag, the alias's case ignored); they run on
	// the tag's build template (templatebuild/tags.go).
	AnyTag bool
	Order  Order
	// Limit is the page size; 0 = DefaultLimit, capped at MaxLimit.
	Limit int
	// NextToken is the opaque cursor returned by the previous page.
	NextToken string
}

// Page is one page of a listing. NextToken is empty on the last page.
type Page struct {
	Sandboxes []Sandbox
	NextToken string
}

// APIKey describes a stored API key (never its plaintext).
type APIKey struct {
	ID         string
	Name       string
	CreatedAt  time.Time
	LastUsedAt *time.Time
	RevokedAt  *time.Time
}
