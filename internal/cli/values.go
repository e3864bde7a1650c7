package cli

import (
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/template"
)

// Flag values that check what they are given, so that a malformed flag or
// environment variable fails at parse time, named, before the command runs.

// prefixValue is a CIDR such as 10.0.0.0/24.
type prefixValue struct{ p *netip.Prefix }

func (v prefixValue) String() string {
	if v.p == nil || !v.p.IsValid() {
		return ""
	}
	return v.p.String()
}

func (v prefixValue) Set(s string) error {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil {
		return err
	}
	*v.p = p
	return nil
}

func (prefixValue) Type() string { return "cidr" }

// prefixListValue is a comma-separated list of CIDRs; empty is none.
type prefixListValue struct{ ps *[]netip.Prefix }

func (v prefixListValue) String() string {
	if v.ps == nil {
		return ""
	}
	s := make([]string, len(*v.ps))
	for i, p := range *v.ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (v prefixListValue) Set(s string) error {
	var out []netip.Prefix
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		pf, err := netip.ParsePrefix(p)
		if err != nil {
			return err
		}
		out = append(out, pf)
	}
	*v.ps = out
	return nil
}

func (prefixListValue) Type() string { return "cidrs" }

// portRangeValue is MIN-MAX within 1-65535; 0-0 (printed empty) is unset.
type portRangeValue struct{ lo, hi *uint16 }

func (v portRangeValue) String() string {
	if v.lo == nil || (*v.lo == 0 && *v.hi == 0) {
		return ""
	}
	return fmt.Sprintf("%d-%d", *v.lo, *v.hi)
}

func (v portRangeValue) Set(s string) error {
	lo, hi, err := parsePortRange(s)
	if err != nil {
		return err
	}
	*v.lo, *v.hi = lo, hi
	return nil
}

func (portRangeValue) Type() string { return "MIN-MAX" }

func parsePortRange(s string) (uint16, uint16, error) {
	lo, hi, ok := strings.Cut(s, "-")
	a, err1 := strconv.ParseUint(lo, 10, 16)
	b, err2 := strconv.ParseUint(hi, 10, 16)
	if !ok || err1 != nil || err2 != nil || a == 0 || b < a {
		return 0, 0, fmt.Errorf("%q: want MIN-MAX within 1-65535", s)
	}
	return uint16(a), uint16(b), nil
}

// logLevelValue is debug, info, warn or error (any case), the values the
// chart's values.schema.json allows.
type logLevelValue struct{ l *slog.Level }

var logLevels = []string{"debug", "info", "warn", "error"}

func (v logLevelValue) String() string {
	if v.l == nil {
		return ""
	}
	return strings.ToLower(v.l.String())
}

func (v logLevelValue) Set(s string) error {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		*v.l = slog.LevelDebug
	case "info":
		*v.l = slog.LevelInfo
	case "warn":
		*v.l = slog.LevelWarn
	case "error":
		*v.l = slog.LevelError
	default:
		return fmt.Errorf("want one of %s", strings.Join(logLevels, ", "))
	}
	return nil
}

func (logLevelValue) Type() string { return "level" }

// addLogLevel registers --log-level with default def and CUBE_LOG_LEVEL.
func addLogLevel(fs *pflag.FlagSet, l *slog.Level, def slog.Level) {
	*l = def
	fs.Var(logLevelValue{l}, "log-level", "log level: "+strings.Join(logLevels, ", "))
	bindEnv(fs, "log-level", "CUBE_LOG_LEVEL")
}

// funcValue is a flag whose parsing and printing are functions (user
// namespace mode, rate limits, roles).
type funcValue struct {
	typ string
	get func() string
	set func(string) error
}

func (v funcValue) String() string {
	if v.get == nil {
		return ""
	}
	return v.get()
}
func (v funcValue) Set(s string) error { return v.set(s) }
func (v funcValue) Type() string       { return v.typ }

// poolTargetsValue is a comma-separated list of TEMPLATE=N (pre-started
// warm-pool slots per template; N=auto: by demand); empty is none. The first value given
// replaces the default, later ones (a repeated flag) add to it.
type poolTargetsValue struct {
	ts  *[]cubelet.PoolTarget
	set bool
}

func (v *poolTargetsValue) String() string {
	parts := make([]string, 0, len(*v.ts))
	for _, t := range *v.ts {
		n := strconv.Itoa(t.Size)
		if t.Size == cubelet.PoolAdaptive {
			n = "auto"
		}
		parts = append(parts, t.Template+"="+n)
	}
	return strings.Join(parts, ",")
}

func (v *poolTargetsValue) Set(s string) error {
	if !v.set {
		*v.ts, v.set = nil, true
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, n, ok := strings.Cut(part, "=")
		size, err := strconv.Atoi(strings.TrimSpace(n))
		if err == nil && size < 0 {
			err = strconv.ErrRange
		}
		if strings.TrimSpace(n) == "auto" {
			size, err = cubelet.PoolAdaptive, nil
		}
		if name = strings.TrimSpace(name); !ok || name == "" || err != nil {
			return fmt.Errorf("%q: want TEMPLATE=N with N >= 0 or TEMPLATE=auto, e.g. code-interpreter-v1=1", part)
		}
		*v.ts = append(*v.ts, cubelet.PoolTarget{Template: name, Size: size})
	}
	return nil
}

func (*poolTargetsValue) Type() string { return "template=n,..." }

// addPoolTemplatesFlag declares --pool-templates, defaulting to one
// pre-started slot of the code-interpreter template.
func addPoolTemplatesFlag(fs *pflag.FlagSet, ts *[]cubelet.PoolTarget) {
	*ts = []cubelet.PoolTarget{{Template: template.InterpName, Size: 1}}
	fs.Var(&poolTargetsValue{ts: ts}, "pool-templates",
		"pre-started warm-pool slots of other templates, TEMPLATE=N,... (their boot work done: a code-interpreter slot has its kernel up); N=auto follows the template's demand within --pool-memory-mb; "+
			"made once the template is on the node; needs --pool-prestart, none with --pool-size 0; empty for none")
	bindEnv(fs, "pool-templates", "CUBE_POOL_TEMPLATES")
}
