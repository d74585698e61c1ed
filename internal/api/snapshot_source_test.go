package api

import (
	"context"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/recipe"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestCreateSnapshotFromDockerfile: a snapshot create takes what an image
// build takes (a Dockerfile with its context and build args, here) and
// hands the engine the parsed recipe and the build's network policy; bad
// sources and policies are plain 400s that start nothing.
func TestCreateSnapshotFromDockerfile(t *testing.T) {
	tk := newTenancy(t, nil)
	got := make(chan sandbox.CreateSnapshotOptions, 1)
	tk.s.createSnapshotFn = func(ctx context.Context, opts sandbox.CreateSnapshotOptions) (*snapshot.Snapshot, error) {
		opts.Slot.Release()
		got <- opts
		return nil, context.Canceled
	}
	data := base64.StdEncoding.EncodeToString([]byte("hello\n"))
	body := `{"tag":"df-snap","dockerfile":"FROM 10.0.0.5:5000/app:v1\nARG V=1\nCOPY data.txt /data.txt\nRUN echo $V\n",` +
		`"name":"app","build_args":{"V":"2"},"context":[{"path":"data.txt","mode":420,"data":"` + data + `"}],` +
		`"build_network":{"mode":"allow","allow":["pypi.example.org"]},"network":{"mode":"none"}}`
	a := tk.call("ops", "POST", "/v1/snapshots", body, asyncHdr)
	if a.status != http.StatusAccepted {
		t.Fatalf("create from a Dockerfile: %d %s", a.status, a.body)
	}
	opts := <-got
	r := opts.Parsed
	if r == nil || r.Name != "app" || r.From != "10.0.0.5:5000/app:v1" || opts.Recipe != "" || opts.RecipeTOML != "" {
		t.Fatalf("engine got recipe %+v (name %q, toml %q), want the Dockerfile's", r, opts.Recipe, opts.RecipeTOML)
	}
	if len(r.Steps) != 2 || r.Steps[0].Kind != recipe.StepCopy || r.Steps[1].BuildEnv["V"] != "2" {
		t.Fatalf("steps %+v, want COPY then RUN with V=2", r.Steps)
	}
	if f, ok := r.Context["data.txt"]; !ok || string(f.Data) != "hello\n" {
		t.Fatalf("context %+v, want data.txt", r.Context)
	}
	if bn := opts.BuildNetwork; bn == nil || bn.Mode != "allow" || len(bn.Allow) != 1 || opts.Network == nil || opts.Network.Mode != "none" {
		t.Fatalf("build network %+v, children's %+v", opts.BuildNetwork, opts.Network)
	}

	for body, want := range map[string]string{
		`{"tag":"bad1","dockerfile":"FROM x/y:1\nHEALTHCHECK CMD true\n"}`:                    "Dockerfile:2 HEALTHCHECK",
		`{"tag":"bad2","recipe":"minimal","from":"x/y:1"}`:                                    "not several",
		`{"tag":"bad3","from":"x/y:1","build_network":{"mode":"allow","allow":["10.0.0.1"]}}`: "build network",
		`{"tag":"bad4","recipe":"minimal","build_args":{"A":"1"}}`:                            "go with dockerfile",
	} {
		a := tk.call("ops", "POST", "/v1/snapshots", body, asyncHdr)
		if a.status != http.StatusBadRequest || !strings.Contains(a.p.Detail, want) {
			t.Errorf("%s: %d %s, want 400 naming %q", body, a.status, a.body, want)
		}
	}
	select {
	case o := <-got:
		t.Fatalf("a refused create reached the engine: %+v", o)
	default:
	}
}
