package image

import (
	"archive/tar"
	"bytes"
	"io"
	"slices"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/ociimage"
	"github.com/forkd-dev/forkd/internal/recipe"
)

func TestCopyInputsAndLayer(t *testing.T) {
	bctx := map[string]recipe.ContextFile{
		"app/main.py":     {Mode: 0o644, Data: []byte("print(1)\n")},
		"app/lib/util.py": {Mode: 0o644, Data: []byte("x = 1\n")},
		"run.sh":          {Mode: 0o755, Data: []byte("#!/bin/sh\n")},
	}
	step := recipe.Step{Kind: recipe.StepCopy, Src: []string{"app", "run.sh"}, Dst: "/srv/"}
	files, key, err := copyInputs(step, bctx)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeCopyLayer(&buf, files); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h.Mode
	}
	want := map[string]int64{"srv/main.py": 0o644, "srv/lib/util.py": 0o644, "srv/run.sh": 0o755}
	if len(got) != len(want) {
		t.Fatalf("layer entries %v, want %v", got, want)
	}
	for n, m := range want {
		if got[n] != m {
			t.Fatalf("layer entries %v, want %v", got, want)
		}
	}
	// The key follows the content, and only the files the step names.
	bctx["unrelated"] = recipe.ContextFile{Data: []byte("x")}
	if _, k2, _ := copyInputs(step, bctx); k2 != key {
		t.Fatal("a file the step does not copy changed its key")
	}
	bctx["run.sh"] = recipe.ContextFile{Mode: 0o755, Data: []byte("#!/bin/sh\necho\n")}
	if _, k3, _ := copyInputs(step, bctx); k3 == key {
		t.Fatal("changed content kept the key")
	}
	if _, _, err := copyInputs(recipe.Step{Kind: recipe.StepCopy, Src: []string{"missing"}, Dst: "/x"}, bctx); !errdefs.IsNotFound(err) {
		t.Fatalf("a source not in the context: %v", err)
	}
}

func TestStepChainKeys(t *testing.T) {
	from := chainStart(&ociimage.Image{Digest: "sha256:aa", Config: ociimage.Config{Env: []string{"PATH=/bin"}}}, "")
	run := recipe.Step{Kind: recipe.StepRun, Origin: "Dockerfile:3 RUN", Shell: "make"}
	a := from.next(run, "", "sha256:l1")
	moved := run
	moved.Origin = "run[0]"
	if b := from.next(moved, "", "sha256:l1"); b.key != a.key {
		t.Fatal("where a step is written changed its key")
	}
	other := chainStart(&ociimage.Image{Digest: "sha256:bb"}, "")
	if other.next(run, "", "sha256:l1").key == a.key {
		t.Fatal("another base image kept the key")
	}
	acme := chainStart(&ociimage.Image{Digest: "sha256:aa", Config: ociimage.Config{Env: []string{"PATH=/bin"}}}, "acme")
	beta := chainStart(&ociimage.Image{Digest: "sha256:aa", Config: ociimage.Config{Env: []string{"PATH=/bin"}}}, "beta")
	if k := acme.next(run, "", "").key; k == a.key || k == beta.next(run, "", "").key {
		t.Fatal("a tenant's step shares its key with the operator's or another tenant's")
	}
	env := recipe.Step{Kind: recipe.StepEnv, Key: "PATH", Value: "/usr/bin:/bin"}
	c := a.next(env, "", "")
	applyConfig(&c.config, env)
	if c.config.Env[0] != "PATH=/usr/bin:/bin" || a.config.Env[0] != "PATH=/bin" || len(c.layers) != 1 {
		t.Fatalf("env step: %+v (before: %+v)", c, a)
	}
	if a.next(run, "", "sha256:l2").key == c.next(run, "", "sha256:l2").key {
		t.Fatal("an ENV before a step did not change its key")
	}
}

// TestApplyDefaultCommand: CMD sets Cmd; an ENTRYPOINT that resets clears
// the base's Cmd, one after a CMD keeps it.
func TestApplyDefaultCommand(t *testing.T) {
	c := ociimage.Config{Cmd: []string{"base-cmd"}}
	applyConfig(&c, recipe.Step{Kind: recipe.StepEntrypoint, Argv: []string{"/init"}, Value: recipe.ResetCmd})
	if len(c.Cmd) != 0 || !slices.Equal(c.Entrypoint, []string{"/init"}) {
		t.Fatalf("after a resetting ENTRYPOINT: %+v", c)
	}
	applyConfig(&c, recipe.Step{Kind: recipe.StepCmd, Argv: []string{"serve"}})
	applyConfig(&c, recipe.Step{Kind: recipe.StepEntrypoint, Argv: []string{"/init2"}})
	if !slices.Equal(c.Cmd, []string{"serve"}) || !slices.Equal(c.Entrypoint, []string{"/init2"}) {
		t.Fatalf("an ENTRYPOINT after a CMD: %+v", c)
	}
}
