package boot

import (
	"bufio"
	"io"
	"strings"
)

// Cmdline is the kernel command line's key=value parameters (the last of a
// repeated key wins; a bare word maps to "").
type Cmdline map[string]string

// ParseCmdline parses /proc/cmdline. Quoting ("a b") is honoured for values,
// as the kernel does.
func ParseCmdline(s string) Cmdline {
	c := Cmdline{}
	var word strings.Builder
	inQuote := false
	flush := func() {
		if word.Len() == 0 {
			return
		}
		k, v, _ := strings.Cut(word.String(), "=")
		c[k] = v
		word.Reset()
	}
	for _, r := range s {
		switch {
		case r == '"':
			inQuote = !inQuote
		case !inQuote && (r == ' ' || r == '\t' || r == '\n'):
			flush()
		default:
			word.WriteRune(r)
		}
	}
	flush()
	return c
}

// Get returns the value of key, or def if it is absent or empty.
func (c Cmdline) Get(key, def string) string {
	if v := c[key]; v != "" {
		return v
	}
	return def
}

// Kernel command line parameters the agent reads.
const (
	ParamIP       = "forkd.ip"       // eth0 address with prefix, e.g. 172.31.0.2/30
	ParamGateway  = "forkd.gw"       // default gateway, e.g. 172.31.0.1
	ParamDNS      = "forkd.dns"      // name server written to /etc/resolv.conf
	ParamHostname = "forkd.hostname" // default "forkd"
)

// ParseModuleList reads /etc/forkd-modules: one module file name per line,
// in load order; blank lines and lines starting with # are skipped.
func ParseModuleList(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, line)
	}
	return out, sc.Err()
}
