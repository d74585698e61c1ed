package image

import (
	"strings"
	"testing"
)

func TestParseSources(t *testing.T) {
	deb822 := `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: https://deb.nodesource.com/node_20.x
Suites: nodistro
Components: main
Signed-By: /usr/share/keyrings/nodesource.gpg

Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main contrib
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 abc
 -----END PGP PUBLIC KEY BLOCK-----
`
	got := parseDeb822Sources(deb822)
	var kept []aptSource
	for _, s := range got {
		if s = s.forRelease("bookworm"); len(s.suites) > 0 {
			kept = append(kept, s)
		}
	}
	if len(kept) != 2 {
		t.Fatalf("kept %d sources, want 2 (deb bookworm*, no nodesource, no deb-src): %+v", len(kept), kept)
	}
	if strings.Join(kept[0].suites, " ") != "bookworm bookworm-updates" || kept[0].signedBy != "/usr/share/keyrings/debian-archive-keyring.gpg" {
		t.Errorf("first source %+v", kept[0])
	}
	if !strings.Contains(kept[1].signedBy, "BEGIN PGP") || strings.Join(kept[1].components, " ") != "main contrib" {
		t.Errorf("inline key source %+v", kept[1])
	}
	out := deb822Text(kept)
	for _, want := range []string{"URIs: http://deb.debian.org/debian\n", "Suites: bookworm bookworm-updates\n", "Suites: bookworm-security\n", " -----END PGP PUBLIC KEY BLOCK-----\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered sources lack %q:\n%s", want, out)
		}
	}

	oneLine := `# comment
deb [arch=amd64 signed-by=/k.gpg] http://mirror/debian bookworm main contrib
deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main
deb http://security.debian.org/debian-security bookworm-security main # trailing
deb-src http://mirror/debian bookworm main
deb http://mirror/debian trixie main
`
	var lines []aptSource
	for _, s := range parseOneLineSources(oneLine) {
		if s = s.forRelease("bookworm"); len(s.suites) > 0 {
			lines = append(lines, s)
		}
	}
	if len(lines) != 2 || lines[0].signedBy != "/k.gpg" || lines[0].arch != "amd64" || lines[1].suites[0] != "bookworm-security" {
		t.Errorf("one-line sources: %+v", lines)
	}
}
