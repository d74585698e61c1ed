package integration

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/api"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/oci"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/testutil/testregistry"
)

// TestForkByReference: a host that holds nothing forks a snapshot by its
// registry reference (Debian's docker-registry on loopback): the first
// fork of a tenant pulls it, the second fetches nothing; another tenant
// gets a copy of its own, and cannot be handed one planted by the first
// (the reserved namespace is refused to every tag-creating request); a
// digest reference forks at its digest, and one the registry lacks fails
// naming the registry. (A registry that answers another manifest for a
// digest: internal/api's TestForkByReferenceDigestMismatch.)
func TestForkByReference(t *testing.T) {
	reg := testregistry.Start(t)
	dockerConfig := t.TempDir() // no credentials of the host's user
	a := newCLI(t)
	a.env = append(a.env, "DOCKER_CONFIG="+dockerConfig)
	id := snapshot.NewID()[:8]
	base := "it-fref-" + id
	a.ok("snapshot", "create", "--tag", base, "--recipe", "minimal")
	t.Cleanup(func() { a.run("rmi", base) })
	repo := reg.Host + "/forkd/fref-" + id
	var pushed pushResult
	if err := json.Unmarshal([]byte(a.ok("--json", "push", base, repo+":v1")), &pushed); err != nil {
		t.Fatal(err)
	}

	// C: an empty data dir, a daemon that lets tenants pull from the
	// loopback registry, and users of two tenants.
	c := newCLIOn(t, t.TempDir())
	c.env = append(c.env, "DOCKER_CONFIG="+dockerConfig)
	var serveLog bytes.Buffer
	serve := c.cmd("serve", "--registry-private", reg.Host)
	serve.Stdout, serve.Stderr = &serveLog, &serveLog
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- serve.Wait() }()
	t.Cleanup(func() {
		c.run("--no-autostart", "kill", "--all")
		stopServe(t, serve, served, &serveLog)
	})
	waitFor(t, 2*time.Minute, "the daemon to answer:\n"+serveLog.String(), func() bool {
		_, _, code := c.run("--no-autostart", "ls")
		return code == 0
	})
	as := func(tenant string) *cli {
		tok := strings.TrimSpace(c.ok("--no-autostart", "token", "create", "u-"+tenant, "--tenant", tenant))
		u := *c
		u.env = append(slices.Clone(c.env), "FORKD_TOKEN="+tok)
		return &u
	}
	ta, tb := "ta-"+id, "tb-"+id
	userA, userB := as(ta), as(tb)

	fork := func(u *cli, ref string) apiv1.Sandbox {
		t.Helper()
		var fr apiv1.ForkResponse
		if err := json.Unmarshal([]byte(u.ok("--no-autostart", "fork", "--tag", ref, "--json")), &fr); err != nil || len(fr.Sandboxes) != 1 {
			t.Fatalf("fork of %s: %+v %v", ref, fr, err)
		}
		sb := fr.Sandboxes[0]
		if out := u.ok("--no-autostart", "exec", sb.ID, "--", "echo", "by reference"); out != "by reference\n" {
			t.Fatalf("a child forked by reference said %q", out)
		}
		u.ok("--no-autostart", "kill", sb.ID)
		return sb
	}
	parse := func(s string) oci.Reference {
		r, err := oci.ParseReference(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ref := repo + ":v1"
	reg.BlobGets()
	first := fork(userA, ref)
	if want := api.ReferenceTag(ta, parse(ref)); first.Tag != want {
		t.Fatalf("tenant A's fork by reference forked %q, want its derived tag %q", first.Tag, want)
	}
	if gets := reg.BlobGets(); len(gets) != 3 {
		t.Fatalf("the first fork by reference on an empty host: blob GETs %v, want 3 (config, image, snapshot)", gets)
	}
	if again := fork(userA, ref); again.Tag != first.Tag {
		t.Fatalf("the second fork by reference forked %q, the first %q", again.Tag, first.Tag)
	}
	if gets := reg.BlobGets(); len(gets) != 0 {
		t.Fatalf("the second fork by reference fetched %v, want nothing", gets)
	}

	// Tenant A tries to plant a snapshot where B's fork would look: the
	// reserved namespace is refused to a pull (and to every other path
	// that creates a tag: internal/api's TestReservedTagsRefused).
	planted := api.ReferenceTag(tb, parse(ref))
	if _, errs, code := userA.run("--no-autostart", "pull", ref, "--tag", planted); code == 0 || !strings.Contains(errs, "reserves") {
		t.Fatalf("tenant A's pull under B's derived tag: exit %d\n%s", code, errs)
	}
	if _, errs, code := userA.run("--no-autostart", "snapshot", "info", planted); code == 0 || !strings.Contains(errs, "no snapshot") {
		t.Fatalf("%s exists after the refused plant: exit %d\n%s", planted, code, errs)
	}
	reg.BlobGets()
	second := fork(userB, ref)
	if second.Tag != planted || second.Tag == first.Tag {
		t.Fatalf("tenant B's fork by reference forked %q (A's: %q), want its own %q", second.Tag, first.Tag, planted)
	}
	if gets := reg.BlobGets(); len(gets) == 0 {
		t.Fatal("tenant B's first fork by reference fetched nothing: did it use A's copy?")
	}
	var bSnap apiv1.Snapshot
	if err := json.Unmarshal([]byte(userB.ok("--no-autostart", "snapshot", "info", planted, "--json")), &bSnap); err != nil || bSnap.Owner != tb {
		t.Fatalf("B's copy: owner %q (%v), want %q", bSnap.Owner, err, tb)
	}
	if _, errs, code := userB.run("--no-autostart", "snapshot", "info", first.Tag); code == 0 {
		t.Fatalf("tenant B sees A's copy %s:\n%s", first.Tag, errs)
	}

	// By digest: at that digest; a digest the registry lacks fails naming
	// the registry.
	pinned := repo + "@" + pushed.Digest
	if sb := fork(userA, pinned); sb.Tag != api.ReferenceTag(ta, parse(pinned)) {
		t.Fatalf("fork by digest forked %q", sb.Tag)
	}
	absent := repo + "@sha256:" + strings.Repeat("0", 64)
	if _, errs, code := userA.run("--no-autostart", "fork", "--tag", absent); code == 0 || !strings.Contains(errs, "not found in registry") {
		t.Fatalf("a fork of a digest the registry lacks: exit %d\n%s", code, errs)
	}
}
