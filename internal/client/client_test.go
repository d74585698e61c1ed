package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// serve answers every request with h on a Unix socket and returns a
// client of it.
func serve(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	dir, err := os.MkdirTemp("", "forkd-client-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return New(sock)
}

func execEvents(w http.ResponseWriter, evs ...apiv1.ExecEvent) {
	enc := json.NewEncoder(w)
	for _, ev := range evs {
		enc.Encode(ev)
	}
}

func TestExecEvents(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		execEvents(w, apiv1.ExecEvent{Type: "stdout", Data: []byte("a")}, apiv1.ExecEvent{Type: "stderr", Data: []byte("b")},
			apiv1.ExecEvent{Type: "stdout", Data: []byte("c")}, apiv1.ExecEvent{Type: "exit", ExitCode: 2})
	})
	var seen []string
	ev, err := c.ExecEvents(context.Background(), "sb-1", apiv1.ExecRequest{Argv: []string{"x"}}, nil, func(ev apiv1.ExecEvent) error {
		seen = append(seen, ev.Type+":"+string(ev.Data))
		return nil
	})
	if err != nil || ev.ExitCode != 2 || strings.Join(seen, ",") != "stdout:a,stderr:b,stdout:c,exit:" {
		t.Fatalf("events %q, exit %+v, %v", seen, ev, err)
	}

	// Exec sorts the same stream into stdout and stderr.
	var stdout, stderr bytes.Buffer
	ev, err = c.Exec(context.Background(), "sb-1", apiv1.ExecRequest{Argv: []string{"x"}}, nil, &stdout, &stderr)
	if err != nil || ev.ExitCode != 2 || stdout.String() != "ac" || stderr.String() != "b" {
		t.Fatalf("exec: stdout %q stderr %q exit %+v %v", stdout.String(), stderr.String(), ev, err)
	}

	// An error from the callback ends the call with that error.
	stop := errors.New("stop")
	n := 0
	_, err = c.ExecEvents(context.Background(), "sb-1", apiv1.ExecRequest{Argv: []string{"x"}}, nil, func(apiv1.ExecEvent) error {
		n++
		return stop
	})
	if !errors.Is(err, stop) || n != 1 {
		t.Fatalf("callback error: %v after %d events", err, n)
	}
}

func TestExecStreamCut(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		execEvents(w, apiv1.ExecEvent{Type: "stdout", Data: []byte("a")})
	})
	var stdout bytes.Buffer
	if _, err := c.Exec(context.Background(), "sb-1", apiv1.ExecRequest{Argv: []string{"x"}}, nil, &stdout, &stdout); err == nil ||
		!strings.Contains(err.Error(), "cut before the process exited") {
		t.Fatalf("cut stream: %v", err)
	}
}

// TestExecFailedMidStream: an exit event carrying an error fails the call
// with it, in the class the daemon gave (Code), its text said once; a
// daemon from before Code is read as a failed precondition.
func TestExecFailedMidStream(t *testing.T) {
	const msg = "exec: sandbox sb-1 was killed while the call ran: failed precondition"
	for _, code := range []string{"failed_precondition", ""} {
		c := serve(t, func(w http.ResponseWriter, r *http.Request) {
			execEvents(w, apiv1.ExecEvent{Type: "start"}, apiv1.ExecEvent{Type: "exit", ExitCode: -1, Error: msg, Code: code})
		})
		_, err := c.Exec(context.Background(), "sb-1", apiv1.ExecRequest{Argv: []string{"x"}}, nil, nil, nil)
		if !errdefs.IsFailedPrecondition(err) || (code != "" && err.Error() != msg) {
			t.Errorf("code %q: %v", code, err)
		}
	}
}

func TestProblemUnwrapsToClass(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(apiv1.Problem{Title: "Not Found", Status: 404, Detail: "sandbox sb-1 not found", Code: "not_found", RequestID: "r1"})
	})
	_, err := c.Sandbox(context.Background(), "sb-1")
	var ce *Error
	if !errdefs.IsNotFound(err) || !errors.As(err, &ce) || ce.RequestID != "r1" || err.Error() != "sandbox sb-1 not found" {
		t.Fatalf("problem: %v", err)
	}
}
