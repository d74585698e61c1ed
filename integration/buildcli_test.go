package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestCLISnapshotFromBuildSources: through the CLI and a real daemon,
// `snapshot create` builds from a Dockerfile with its CONTEXT (the COPY
// source travels in the request; the RUN's output streams as progress)
// and from a local recipe whose files table names a file next to it; a
// fork of each sees the files. `forkd run` without a command runs the
// Dockerfile's ENTRYPOINT and CMD, and refuses where there are none.
func TestCLISnapshotFromBuildSources(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	ref := pushBusyboxBase(t, ctx)
	c := newCLI(t)
	id := snapshot.NewID()
	dir := t.TempDir()
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("hello.txt", "hello "+id+"\n")
	write("Dockerfile", "FROM "+ref+"\nCOPY hello.txt /hello.txt\n"+
		"RUN busybox echo streamed-"+id+" && busybox cp /hello.txt /copied.txt\n"+
		"ENTRYPOINT [\"busybox\", \"cat\"]\nCMD [\"/copied.txt\"]\n")
	write("app.toml", "name = \"cli-files\"\nfrom = \""+ref+"\"\ninsecure_registry = true\n"+
		"files = { \"/from-recipe.txt\" = \"hello.txt\" }\n")

	forkCat := func(tag, path string) string {
		t.Helper()
		var fr apiv1.ForkResponse
		if err := json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "--json")), &fr); err != nil || len(fr.Sandboxes) != 1 {
			t.Fatalf("fork %s: %+v %v", tag, fr, err)
		}
		return c.ok("exec", fr.Sandboxes[0].ID, "--", "busybox", "cat", path)
	}

	tag := "it-clidf-" + id
	out, errs, code := c.run("snapshot", "create", "--tag", tag, "-f", filepath.Join(dir, "Dockerfile"), "--insecure-registry", dir)
	if code != 0 {
		t.Fatalf("snapshot create -f Dockerfile: exit %d\n%s\n%s", code, out, errs)
	}
	defer c.run("rmi", tag)
	if !strings.Contains(out+errs, "| streamed-"+id) {
		t.Errorf("the RUN's output is not in the progress:\n%s\n%s", out, errs)
	}
	if got := forkCat(tag, "/copied.txt"); got != "hello "+id+"\n" {
		t.Fatalf("/copied.txt in a fork = %q", got)
	}
	// forkd run without a command runs ENTRYPOINT + CMD.
	if got := c.ok("run", "--tag", tag); got != "hello "+id+"\n" {
		t.Fatalf("forkd run with the image's default command printed %q", got)
	}

	tag2 := "it-clirc-" + id
	out, errs, code = c.run("snapshot", "create", "--tag", tag2, "--recipe", filepath.Join(dir, "app.toml"))
	if code != 0 {
		t.Fatalf("snapshot create --recipe app.toml with files: exit %d\n%s\n%s", code, out, errs)
	}
	defer c.run("rmi", tag2)
	if got := forkCat(tag2, "/from-recipe.txt"); got != "hello "+id+"\n" {
		t.Fatalf("/from-recipe.txt in a fork = %q", got)
	}
	// An image without Entrypoint or Cmd: run needs a command, and says so.
	if _, errs, code := c.run("run", "--tag", tag2); code == 0 || !strings.Contains(errs, "neither Entrypoint nor Cmd") {
		t.Errorf("run without a command on an image without one: exit %d, %s", code, errs)
	}

	// Two sources at once are refused before anything is sent.
	if _, errs, code := c.run("snapshot", "create", "--tag", "it-clibad-"+id, "--recipe", "minimal", "--from", ref); code == 0 || !strings.Contains(errs, "give one of a recipe, --from REF and -f Dockerfile") {
		t.Errorf("--recipe with --from: exit %d, %s", code, errs)
	}
}
