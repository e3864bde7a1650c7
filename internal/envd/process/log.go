package process

import (
	"log/slog"
	"strings"
)

// SetLogger makes s log process starts and ends to l (nothing by default).
// Call it before serving.
func (s *Service) SetLogger(l *slog.Logger) { s.log = l }

// maxLoggedArgs bounds the command line in a log line.
const maxLoggedArgs = 256

func (s *Service) logStart(p *proc, user string) {
	if s.log == nil {
		return
	}
	attrs := []any{"pid", p.pid, "cmd", p.config.GetCmd(), "args", loggedArgs(p.config.GetArgs()), "user", user}
	if p.tag != nil {
		attrs = append(attrs, "tag", *p.tag)
	}
	s.log.Info("process started", attrs...)
}

func (s *Service) logEnd(p *proc) {
	if s.log == nil {
		return
	}
	p.mu.Lock()
	end := p.end.GetEnd()
	p.mu.Unlock()
	attrs := []any{"pid", p.pid, "cmd", p.config.GetCmd(), "exitCode", end.GetExitCode(), "status", end.GetStatus()}
	if end.Error != nil {
		attrs = append(attrs, "err", end.GetError())
	}
	if end.GetExitCode() != 0 {
		s.log.Warn("process ended", attrs...)
		return
	}
	s.log.Info("process ended", attrs...)
}

func loggedArgs(args []string) string {
	s := strings.Join(args, " ")
	if len(s) > maxLoggedArgs {
		s = s[:maxLoggedArgs] + "…"
	}
	return s
}
