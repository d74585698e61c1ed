package image

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// aptSource is one apt source entry, from either sources.list format.
type aptSource struct {
	uris       []string
	suites     []string
	components []string
	// signedBy is the Signed-By value: a keyring path or an inline key
	// (deb822 continuation lines kept as they were).
	signedBy string
	arch     string
	trusted  string
	from     string // file it came from, for messages
}

// hostDebianSources returns the host's apt sources that serve release:
// its own suite and suites such as <release>-updates and <release>-security.
// Third-party repositories on the host (a cloud SDK, nodesource) are left
// out; they are not Debian and the guest needs none of them.
func hostDebianSources(release string) ([]aptSource, error) {
	var files []string
	if _, err := os.Stat("/etc/apt/sources.list"); err == nil {
		files = append(files, "/etc/apt/sources.list")
	}
	for _, pat := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join("/etc/apt/sources.list.d", pat))
		sort.Strings(m)
		files = append(files, m...)
	}
	var all []aptSource
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var got []aptSource
		if strings.HasSuffix(f, ".sources") {
			got = parseDeb822Sources(string(data))
		} else {
			got = parseOneLineSources(string(data))
		}
		for _, s := range got {
			s.from = f
			if s = s.forRelease(release); len(s.suites) > 0 {
				all = append(all, s)
			}
		}
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("no apt source for Debian %s in /etc/apt/sources.list or sources.list.d (need a \"deb\" entry with suite %s): %w",
			release, release, errdefs.ErrFailedPrecondition)
	}
	return all, nil
}

// forRelease keeps the suites that belong to release.
func (s aptSource) forRelease(release string) aptSource {
	var keep []string
	for _, su := range s.suites {
		if su == release || strings.HasPrefix(su, release+"-") || strings.HasPrefix(su, release+"/") {
			keep = append(keep, su)
		}
	}
	s.suites = keep
	return s
}

// parseOneLineSources reads "deb [opt=val ...] URI SUITE COMPONENT..." lines.
func parseOneLineSources(text string) []aptSource {
	var out []aptSource
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		var s aptSource
		rest := f[1:]
		if strings.HasPrefix(rest[0], "[") {
			var opts []string
			for len(rest) > 0 {
				tok := rest[0]
				rest = rest[1:]
				opts = append(opts, strings.Trim(tok, "[]"))
				if strings.HasSuffix(tok, "]") {
					break
				}
			}
			for _, o := range opts {
				k, v, _ := strings.Cut(o, "=")
				switch k {
				case "signed-by":
					s.signedBy = v
				case "arch":
					s.arch = strings.ReplaceAll(v, ",", " ")
				case "trusted":
					s.trusted = v
				}
			}
		}
		if len(rest) < 2 {
			continue
		}
		s.uris = []string{rest[0]}
		s.suites = []string{rest[1]}
		s.components = rest[2:]
		out = append(out, s)
	}
	return out
}

// parseDeb822Sources reads deb822 stanzas (Types, URIs, Suites, ...).
func parseDeb822Sources(text string) []aptSource {
	var out []aptSource
	for _, stanza := range splitStanzas(text) {
		fields := map[string]string{}
		var last string
		for _, line := range stanza {
			if line[0] == ' ' || line[0] == '\t' {
				if last != "" {
					fields[last] += "\n" + line
				}
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.ToLower(strings.TrimSpace(k))
			fields[last] = strings.TrimSpace(v)
		}
		if !strings.Contains(" "+fields["types"]+" ", " deb ") || strings.EqualFold(fields["enabled"], "no") {
			continue
		}
		out = append(out, aptSource{
			uris:       strings.Fields(fields["uris"]),
			suites:     strings.Fields(fields["suites"]),
			components: strings.Fields(fields["components"]),
			signedBy:   fields["signed-by"],
			arch:       fields["architectures"],
			trusted:    fields["trusted"],
		})
	}
	return out
}

// splitStanzas splits deb822 text into stanzas of non-comment lines.
func splitStanzas(text string) [][]string {
	var out [][]string
	var cur []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if strings.TrimSpace(line) == "" {
			if len(cur) > 0 {
				out = append(out, cur)
				cur = nil
			}
			continue
		}
		cur = append(cur, strings.TrimRight(line, "\r"))
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// deb822Text renders sources as a deb822 file, the one format that can carry
// every Signed-By form (a keyring path or an inline key).
func deb822Text(sources []aptSource) string {
	var b strings.Builder
	for i, s := range sources {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "Types: deb\nURIs: %s\nSuites: %s\nComponents: %s\n",
			strings.Join(s.uris, " "), strings.Join(s.suites, " "), strings.Join(s.components, " "))
		if s.signedBy != "" {
			fmt.Fprintf(&b, "Signed-By: %s\n", s.signedBy)
		}
		if s.arch != "" {
			fmt.Fprintf(&b, "Architectures: %s\n", s.arch)
		}
		if s.trusted != "" {
			fmt.Fprintf(&b, "Trusted: %s\n", s.trusted)
		}
	}
	return b.String()
}
