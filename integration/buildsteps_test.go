package integration

import (
	"archive/tar"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/forkd-dev/forkd/internal/dockerfile"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/image"
	"github.com/forkd-dev/forkd/internal/recipe"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/testutil/testnet"
)

// pushBusyboxBase pushes a one-layer image with a static busybox, a user
// "app" (1000:1000) and a file the build deletes, to a registry the test
// runs on loopback, and returns its reference.
func pushBusyboxBase(t *testing.T, ctx context.Context) string {
	t.Helper()
	bb, err := (&image.Builder{DataDir: dataDir}).BusyboxBinary(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	busybox, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	base := ociLayer(t, []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755},
		{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "busybox"},
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "etc/group", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "base/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "base/remove-me", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "base/keep", Typeflag: tar.TypeReg, Mode: 0o644},
	}, map[string][]byte{
		"bin/busybox":    busybox,
		"etc/passwd":     []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n"),
		"etc/group":      []byte("root:x:0:\napp:x:1000:\n"),
		"base/remove-me": []byte("the build deletes this\n"),
		"base/keep":      []byte("kept\n"),
	})
	img, err := mutate.AppendLayers(empty.Image, base)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{Env: []string{"PATH=/bin"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/forkd-it/busybox-steps:v1"
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	return ref
}

// dockerfileRecipe parses a Dockerfile with its context, as the API does.
func dockerfileRecipe(t *testing.T, src string, files map[string]string) *recipe.Recipe {
	t.Helper()
	f, err := dockerfile.Parse("Dockerfile", []byte(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	bctx := map[string]recipe.ContextFile{}
	for p, d := range files {
		bctx[p] = recipe.ContextFile{Mode: 0o644, Data: []byte(d)}
	}
	r, err := f.Recipe("steps-it", []byte(src), true, bctx)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// countingProgress records build messages and counts the steps that ran
// in a build VM.
type countingProgress struct {
	t   *testing.T
	vms int
}

func (c *countingProgress) say(m string) {
	c.t.Log(m)
	if strings.Contains(m, "running in a build VM") {
		c.vms++
	}
}

// TestBuildStepsInMicroVMs builds a Dockerfile FROM a test-made image on a
// loopback registry: a COPY, two RUN steps in build VMs (one creates
// files, one deletes a file of the base), ENV, WORKDIR and USER. A fork of
// the result sees all of it. A rebuild boots no VM; changing the second
// RUN reruns only it. A Dockerfile with an unsupported instruction fails
// naming its line.
func TestBuildStepsInMicroVMs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	ref := pushBusyboxBase(t, ctx)
	// The test ID makes the steps new on a data dir earlier runs left.
	id := snapshot.NewID()
	df := func(second string) string {
		return "FROM " + ref + "\n" +
			"ARG RUN_ID=" + id + "\n" +
			"ENV GREETING=hello-from-env\n" +
			"WORKDIR /work\n" +
			"COPY data.txt ./\n" +
			"RUN busybox echo \"made in $RUN_ID\" > made.txt && busybox rm /base/remove-me\n" +
			"RUN " + second + "\n" +
			"USER app\n"
	}
	files := map[string]string{"data.txt": "from the build context\n"}
	r := dockerfileRecipe(t, df("busybox mkdir -p /home/app && busybox chown app:app /home/app && busybox echo two > two.txt"), files)

	e := newEngine(t, 0)
	pr := &countingProgress{t: t}
	tag := "it-steps-" + id
	snap, err := e.CreateSnapshot(ctx, sandbox.CreateSnapshotOptions{Tag: tag, Parsed: r, Progress: pr.say})
	if err != nil {
		t.Fatalf("create snapshot from a Dockerfile: %v", err)
	}
	t.Cleanup(func() { e.RemoveSnapshot(context.Background(), tag) })
	if pr.vms != 2 {
		t.Fatalf("first build ran %d steps in build VMs, want 2 (both RUNs)", pr.vms)
	}
	built, err := image.Open(dataDir, snap.Image.Digest)
	if err != nil {
		t.Fatal(err)
	}
	layers := 0
	for _, s := range built.Steps {
		if s.Layer != "" {
			layers++
		}
	}
	if len(built.Steps) != 6 || layers != 3 {
		t.Fatalf("image records steps %+v; want 6 steps, 3 with layers (COPY, 2 RUN)", built.Steps)
	}

	sbs, err := e.Fork(ctx, snap.Tag, 1)
	if err != nil {
		t.Fatal(err)
	}
	a := agentOf(t, e, sbs[0].ID)
	got := run(t, a, "sh", "-c", `busybox pwd; busybox id -u; echo "$GREETING"; busybox cat data.txt made.txt two.txt /base/keep; `+
		`busybox test -e /base/remove-me || echo whited-out; echo "$HOME"`)
	want := "/work\n1000\nhello-from-env\nfrom the build context\nmade in " + id + "\ntwo\nkept\nwhited-out\n/home/app"
	if got != want {
		t.Fatalf("in a fork of the built image:\n%s\nwant:\n%s", got, want)
	}

	// A rebuild with no change: every step from the index, no VM.
	pr.vms = 0
	start := time.Now()
	again, err := e.BuildImage(ctx, r, pr.say)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if pr.vms != 0 || again.Digest != built.Digest {
		t.Fatalf("unchanged rebuild booted %d build VMs and made image %s (want 0 and %s)", pr.vms, again.Digest, built.Digest)
	}
	t.Logf("no-change rebuild of 6 steps took %s", took)

	// Changing the second RUN: the first RUN and COPY come from the cache.
	pr.vms = 0
	r2 := dockerfileRecipe(t, df("busybox echo changed > two.txt"), files)
	changed, err := e.BuildImage(ctx, r2, pr.say)
	if err != nil {
		t.Fatal(err)
	}
	if pr.vms != 1 || changed.Digest == built.Digest {
		t.Fatalf("after changing the second RUN: %d build VMs (want 1), image %s (the old one is %s)", pr.vms, changed.Digest, built.Digest)
	}
	for i := 0; i < 4; i++ { // ENV, WORKDIR, COPY, the first RUN
		if changed.Steps[i] != built.Steps[i] {
			t.Fatalf("step %d: %+v, was %+v: a step before the change was redone", i, changed.Steps[i], built.Steps[i])
		}
	}

	// An unsupported instruction is refused before anything runs.
	_, err = dockerfile.Parse("Dockerfile", []byte("FROM "+ref+"\nRUN true\nHEALTHCHECK CMD true\n"), nil)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "Dockerfile:3 HEALTHCHECK") {
		t.Fatalf("HEALTHCHECK: %v", err)
	}
}

// TestBuildStepsNetwork: RUN steps run under the build's egress policy.
// Allowed a name of the test's world, a step fetches from its server
// through forkd's resolver, the layer keeps what it fetched, and the
// step's output comes back as progress lines. Under none the same kind of
// step fails, and the error says its build VM had no network.
func TestBuildStepsNetwork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	ref := pushBusyboxBase(t, ctx)
	w := testnet.New(t)
	e := netEngine(t, w, "10.231.70.0/24", 0)
	id := snapshot.NewID()

	r := dockerfileRecipe(t, "FROM "+ref+"\n"+
		"RUN busybox echo output-of-"+id+" && busybox wget -q -O /fetched.txt http://allowed.example.com/\n", nil)
	var mu sync.Mutex
	var lines []string
	say := func(m string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, m)
		t.Log(m)
	}
	tag := "it-stepnet-" + id
	snap, err := e.CreateSnapshot(ctx, sandbox.CreateSnapshotOptions{
		Tag: tag, Parsed: r, Progress: say, BuildNetwork: policy(t, "allow:allowed.example.com"),
	})
	if err != nil {
		t.Fatalf("build with a RUN that downloads, allowed its host: %v", err)
	}
	t.Cleanup(func() { e.RemoveSnapshot(context.Background(), tag) })
	mu.Lock()
	streamed := slices.Contains(lines, "  | output-of-"+id)
	mu.Unlock()
	if !streamed {
		t.Errorf("the step's output %q is not among the progress lines", "output-of-"+id)
	}
	sbs, err := e.Fork(ctx, snap.Tag, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, agentOf(t, e, sbs[0].ID), "busybox", "cat", "/fetched.txt"); got != "hello from "+testnet.WebA {
		t.Fatalf("/fetched.txt in a fork = %q, want what the world's server answered", got)
	}

	r2 := dockerfileRecipe(t, "FROM "+ref+"\nRUN busybox wget -q -T 5 -O /f http://allowed.example.com/ # "+id+"\n", nil)
	_, err = e.BuildImageWith(ctx, nil, r2, sandbox.BuildOptions{Progress: say, Network: policy(t, "none")})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "had no network") {
		t.Fatalf("the same download under none: %v; want a failed step saying the build VM had no network", err)
	}
	t.Logf("under none: %v", err)
}
