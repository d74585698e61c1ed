package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/testutil/testregistry"
)

// pushResult is what `forkd --json push` prints.
type pushResult struct {
	Digest   string   `json:"digest"`
	Uploaded []string `json:"uploaded"`
	Present  []string `json:"present"`
}

// TestRegistryPushPull moves a template and a branch of it from one daemon
// to another that shares nothing with it but a registry (Debian's
// docker-registry on loopback): `forkd push` on A, `forkd pull` on B with
// its own empty data dir and run dir, then forks on B. The branch's pull
// fetches only its own layer (and the artifact's config): the image and
// the template are on B already.
func TestRegistryPushPull(t *testing.T) {
	reg := testregistry.Start(t)
	dockerConfig := t.TempDir() // no credentials of the host's user
	a := newCLI(t)
	a.env = append(a.env, "DOCKER_CONFIG="+dockerConfig)
	id := snapshot.NewID()
	base, br := "it-reg-"+id, "it-reg-br-"+id
	a.ok("snapshot", "create", "--tag", base, "--recipe", "minimal")
	t.Cleanup(func() { a.run("rmi", base) })
	var fr apiv1.ForkResponse
	if err := json.Unmarshal([]byte(a.ok("fork", "--tag", base, "--json")), &fr); err != nil || len(fr.Sandboxes) != 1 {
		t.Fatalf("fork on A: %+v %v", fr, err)
	}
	a.ok("exec", fr.Sandboxes[0].ID, "--", "sh", "-c", "echo "+br+" > /root/pushed")
	a.ok("branch", fr.Sandboxes[0].ID, "--tag", br)
	t.Cleanup(func() { a.run("rmi", br) }) // before base: cleanups run last first
	a.ok("kill", fr.Sandboxes[0].ID)
	var brA apiv1.Snapshot
	if err := json.Unmarshal([]byte(a.ok("snapshot", "info", br, "--json")), &brA); err != nil || brA.Parent == nil || brA.Parent.Tag != base {
		t.Fatalf("%s on A is not a layer on %s: %+v %v", br, base, brA.Parent, err)
	}

	repo := reg.Host + "/forkd/it-" + id
	push := func(tag, ref string) pushResult {
		t.Helper()
		var res pushResult
		if err := json.Unmarshal([]byte(a.ok("--json", "push", tag, ref)), &res); err != nil {
			t.Fatalf("push %s: %v", tag, err)
		}
		return res
	}
	if res := push(base, repo+":base"); len(res.Uploaded) != 2 || len(res.Present) != 0 {
		t.Fatalf("push of the template: uploaded %v, present %v; want its image and its snapshot uploaded", res.Uploaded, res.Present)
	}
	if res := push(br, repo+":branch"); !slices.Equal(res.Uploaded, []string{"snapshot/" + brA.ID}) || len(res.Present) != 2 {
		t.Fatalf("push of the branch: uploaded %v, present %v; want only snapshot/%s uploaded", res.Uploaded, res.Present, brA.ID)
	}

	// B: a data dir of its own, empty: its image cache too.
	fresh := t.TempDir()
	b := newCLIOn(t, fresh)
	b.env = append(b.env, "DOCKER_CONFIG="+dockerConfig)
	reg.BlobGets()
	var got apiv1.Snapshot
	if err := json.Unmarshal([]byte(b.ok("--json", "pull", repo+":base")), &got); err != nil {
		t.Fatal(err)
	}
	var baseA apiv1.Snapshot
	json.Unmarshal([]byte(a.ok("snapshot", "info", base, "--json")), &baseA)
	if got.Tag != base || got.ImageDigest != baseA.ImageDigest {
		t.Fatalf("pulled %s image %s, want %s image %s", got.Tag, got.ImageDigest, base, baseA.ImageDigest)
	}
	first := reg.BlobGets()
	if len(first) != 3 {
		t.Fatalf("pull into an empty data dir: blob GETs %v, want 3 (the config, the image, the snapshot)", first)
	}
	if _, err := os.Stat(filepath.Join(fresh, "images", baseA.ImageDigest, "rootfs.ext4")); err != nil {
		t.Fatalf("B has no image after the pull: %v", err)
	}
	forkExec := func(tag string, args ...string) string {
		t.Helper()
		var fr apiv1.ForkResponse
		if err := json.Unmarshal([]byte(b.ok("fork", "--tag", tag, "--json")), &fr); err != nil || len(fr.Sandboxes) != 1 {
			t.Fatalf("fork of %s on B: %+v %v", tag, fr, err)
		}
		defer b.run("kill", fr.Sandboxes[0].ID)
		return b.ok(append([]string{"exec", fr.Sandboxes[0].ID, "--"}, args...)...)
	}
	if out := forkExec(base, "echo", "pulled ok"); out != "pulled ok\n" {
		t.Fatalf("a child of the pulled template said %q", out)
	}

	// The branch: only its own layer comes from the registry.
	got = apiv1.Snapshot{}
	if err := json.Unmarshal([]byte(b.ok("--json", "pull", repo+":branch")), &got); err != nil {
		t.Fatal(err)
	}
	if got.Tag != br || got.Parent == nil || got.Parent.Tag != base {
		t.Fatalf("pulled %s, parent %+v; want %s on %s", got.Tag, got.Parent, br, base)
	}
	second := reg.BlobGets()
	if len(second) != 2 || slices.ContainsFunc(second, func(d string) bool { return slices.Contains(first, d) }) {
		t.Fatalf("pull of the branch: blob GETs %v (the first pull's: %v); want 2 new ones, its config and its layer", second, first)
	}
	var ops []apiv1.Operation
	if err := json.Unmarshal([]byte(b.ok("--json", "operation", "list")), &ops); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ops, func(op apiv1.Operation) bool { return op.Kind == apiv1.OpSnapshotPull && op.Target == repo+":branch" })
	if i < 0 || ops[i].State != apiv1.OpSucceeded || len(ops[i].Progress) == 0 ||
		!strings.Contains(ops[i].Progress[len(ops[i].Progress)-1], "fetched 1 of 3 parts") {
		t.Fatalf("B's pull operation of the branch: %+v", ops)
	}
	if out := forkExec(br, "cat", "/root/pushed"); out != br+"\n" {
		t.Fatalf("a child of the pulled branch has %q in /root/pushed, want %q", out, br)
	}
}
