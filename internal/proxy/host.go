package proxy

import (
	"net"
	"strconv"
	"strings"
)

// EnvdPort is the guest port used when a request names a sandbox but no port.
const EnvdPort = 49983

// ParseHost extracts (sandboxID, port) from a Host of the form
// "<port>-<sandboxID>.<domain>", optionally with a ":port" suffix and a
// trailing dot, case-insensitively. It returns ok=false for any other host
// or when domain is empty.
func ParseHost(host, domain string) (id string, port uint16, ok bool) {
	domain = strings.Trim(strings.ToLower(domain), ".")
	if domain == "" || host == "" {
		return "", 0, false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	label, ok := strings.CutSuffix(host, "."+domain)
	if !ok || label == "" || strings.Contains(label, ".") {
		return "", 0, false
	}
	portStr, id, ok := strings.Cut(label, "-")
	if !ok || id == "" || !validID(id) {
		return "", 0, false
	}
	p, ok := parsePort(portStr)
	if !ok {
		return "", 0, false
	}
	return id, p, true
}

// parsePort accepts decimal 1..65535 without sign or leading '+'.
func parsePort(s string) (uint16, bool) {
	if s == "" || len(s) > 5 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, false
	}
	return uint16(n), true
}

// validID accepts what can be a DNS label of [a-z0-9-].
func validID(id string) bool {
	if len(id) > 63 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
