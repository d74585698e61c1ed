package main

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/pack"
)

// TestPushCommand pushes a snapshot the (stand-in) daemon exports to a
// registry on loopback: parts the registry has are not sent again; a
// signed push says so; bad arguments and an unreachable registry are
// errors of their class, naming what is wrong.
func TestPushCommand(t *testing.T) {
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	src, work := t.TempDir(), t.TempDir()
	smallSnapshot(t, src, "base")
	daemon := archiveDaemon(t, src, t.TempDir()).URL
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	ref := strings.TrimPrefix(reg.URL, "http://") + "/forkd/cli:v1"
	push := func(args ...string) (string, error) {
		return runCLI(t, nil, append([]string{"--host", daemon, "push"}, args...)...)
	}

	out, err := push("base", ref)
	if err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`^pushed base to ` + regexp.QuoteMeta(ref) + ` \(sha256:[0-9a-f]{64}\): 2 parts uploaded \([^)]+\), 0 already there\n$`)
	if !want.MatchString(out) {
		t.Errorf("first push printed %q", out)
	}
	key := filepath.Join(work, "key")
	if _, err := runCLI(t, nil, "pack", "keygen", "-o", key); err != nil {
		t.Fatal(err)
	}
	out, err = push("--json", "--sign", key, "base", ref)
	var res struct {
		Tag, Ref, Digest  string
		Uploaded, Present []string
		Signed            bool
	}
	if err != nil || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("signed push: %v %q", err, out)
	}
	// The signature is in the config: the parts are the same blobs.
	if res.Tag != "base" || res.Ref != ref || !res.Signed || len(res.Uploaded) != 0 || len(res.Present) != 2 {
		t.Errorf("signed push again: %+v", res)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	for _, c := range []struct {
		args []string
		is   func(error) bool
		want string
	}{
		{[]string{"Not-A-Tag", ref}, errdefs.IsInvalidArgument, "tag"},
		{[]string{"base", "no-registry"}, errdefs.IsInvalidArgument, `reference "no-registry"`},
		{[]string{"base", ref, "--sign", filepath.Join(work, "missing")}, errdefs.IsInvalidArgument, "signing key"},
		{[]string{"base", closed + "/forkd/cli:v1"}, errdefs.IsUnavailable, "registry " + closed + " unreachable"},
		{[]string{"nope", ref}, errdefs.IsNotFound, "nope"},
	} {
		if _, err := push(c.args...); err == nil || !c.is(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("push %v: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}

// TestPullCommand: forkd pull sends the daemon the reference, the local
// tag, the verify key and the docker config's credentials for the
// registry, and prints the snapshot; arguments it can check are refused
// before the daemon is asked; a failed pull is the operation's error.
func TestPullCommand(t *testing.T) {
	cfgDir := t.TempDir()
	t.Setenv("DOCKER_CONFIG", cfgDir)
	auths := `{"auths":{"127.0.0.1:5000":{"auth":"` + base64.StdEncoding.EncodeToString([]byte("ann:s3cret")) + `"}}}`
	if err := os.WriteFile(filepath.Join(cfgDir, "config.json"), []byte(auths), 0o600); err != nil {
		t.Fatal(err)
	}
	_, pubPEM, err := pack.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	pubFile := filepath.Join(t.TempDir(), "key.pub")
	os.WriteFile(pubFile, pubPEM, 0o644)

	var mu sync.Mutex
	var got []apiv1.PullSnapshotRequest
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/snapshots/pull", func(w http.ResponseWriter, r *http.Request) {
		var req apiv1.PullSnapshotRequest
		json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		id := "op-ok"
		if strings.HasSuffix(req.Ref, ":missing") {
			id = "op-failed"
		}
		json.NewEncoder(w).Encode(apiv1.Operation{ID: id, Kind: apiv1.OpSnapshotPull, State: apiv1.OpRunning})
	})
	mux.HandleFunc("GET /v1/operations/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		req := got[len(got)-1]
		mu.Unlock()
		op := apiv1.Operation{ID: r.PathValue("id"), Kind: apiv1.OpSnapshotPull, State: apiv1.OpSucceeded}
		if op.ID == "op-failed" {
			op.State = apiv1.OpFailed
			op.Error = &apiv1.Problem{Status: 404, Code: "not_found", Detail: "fetch " + req.Ref + ": not found in registry 127.0.0.1:5000"}
		} else {
			op.Result, _ = json.Marshal(apiv1.Snapshot{Tag: req.Tag})
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		json.NewEncoder(w).Encode(apiv1.OperationEvent{Type: apiv1.OpEventProgress, Message: "image/abc: fetching 10 bytes"})
		json.NewEncoder(w).Encode(apiv1.OperationEvent{Type: apiv1.OpEventState, Operation: &op})
	})
	d := newFakeDaemon(t, mux)

	ref := "127.0.0.1:5000/forkd/x:v1"
	out, err := runCLI(t, d, "pull", ref, "--tag", "mine", "--verify", pubFile, "--plain-http")
	if err != nil || out != "pulled "+ref+" as snapshot mine\n" {
		t.Fatalf("pull: %v %q", err, out)
	}
	pub, _ := pack.ParsePublicKey(pubPEM)
	if len(got) != 1 || got[0].Ref != ref || got[0].Tag != "mine" || !got[0].PlainHTTP || got[0].Force ||
		got[0].VerifyKey != pack.EncodePublicKey(pub) || got[0].Username != "ann" || got[0].Password != "s3cret" {
		t.Fatalf("the daemon was asked %+v", got)
	}

	_, err = runCLI(t, d, "pull", "127.0.0.1:5000/forkd/x:missing")
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "127.0.0.1:5000/forkd/x:missing") {
		t.Errorf("a failed pull: %v, want the operation's not_found naming the reference", err)
	}
	if got[len(got)-1].Username != "ann" {
		t.Errorf("credentials not sent for the registry: %+v", got[len(got)-1])
	}

	before := len(got)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"pull", ref, "--tag", "Not A Tag"}, "tag"},
		{[]string{"pull", ref, "--verify", filepath.Join(cfgDir, "missing.pub")}, "verify key"},
		{[]string{"pull", "no-registry"}, `reference "no-registry"`},
	} {
		if _, err := runCLI(t, d, c.args...); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an invalid argument saying %q", c.args, err, c.want)
		}
	}
	if len(got) != before {
		t.Errorf("refused arguments reached the daemon: %+v", got[before:])
	}
}
