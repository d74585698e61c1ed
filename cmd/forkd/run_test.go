package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// runDaemon fakes fork, exec (ending with exit) and kill, recording the
// fork request and the sandboxes killed.
type runDaemon struct {
	*fakeDaemon
	mu     sync.Mutex
	fork   apiv1.ForkRequest
	killed []string
}

func newRunDaemon(t *testing.T, exit apiv1.ExecEvent, forkErr *apiv1.Problem) *runDaemon {
	d := &runDaemon{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		json.NewDecoder(r.Body).Decode(&d.fork)
		d.mu.Unlock()
		if forkErr != nil {
			writeProblemJSON(w, *forkErr)
			return
		}
		json.NewEncoder(w).Encode(apiv1.ForkResponse{Sandboxes: []apiv1.Sandbox{{ID: "sb-run"}}})
	})
	mux.HandleFunc("POST /v1/sandboxes/sb-run/exec", func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		enc.Encode(apiv1.ExecEvent{Type: "stdout", Data: []byte("hello\n")})
		exit.Type = "exit"
		enc.Encode(exit)
	})
	mux.HandleFunc("POST /v1/sandboxes/kill", func(w http.ResponseWriter, r *http.Request) {
		var req apiv1.KillRequest
		json.NewDecoder(r.Body).Decode(&req)
		d.mu.Lock()
		d.killed = append(d.killed, req.IDs...)
		d.mu.Unlock()
		json.NewEncoder(w).Encode(apiv1.KillResponse{Killed: req.IDs})
	})
	d.fakeDaemon = newFakeDaemon(t, mux)
	return d
}

func TestRunExitCodesAndRemoval(t *testing.T) {
	for _, c := range []struct {
		name   string
		exit   apiv1.ExecEvent
		args   []string
		code   int
		killed bool
	}{
		{"success", apiv1.ExecEvent{ExitCode: 0}, nil, 0, true},
		{"exit code", apiv1.ExecEvent{ExitCode: 3}, nil, 3, true},
		{"signal", apiv1.ExecEvent{ExitCode: -1, Signal: "SIGKILL"}, nil, 137, true},
		{"timeout", apiv1.ExecEvent{ExitCode: -1, TimedOut: true}, []string{"--timeout", "5s"}, 124, true},
		{"keep", apiv1.ExecEvent{ExitCode: 2}, []string{"--keep"}, 2, false},
		{"rm=false", apiv1.ExecEvent{}, []string{"--rm=false"}, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newRunDaemon(t, c.exit, nil)
			args := append(append([]string{"run", "--tag", "py", "-e", "A=1"}, c.args...), "--", "sh", "-c", "exit 3")
			out, err := runCLI(t, d.fakeDaemon, args...)
			code := 0
			if err != nil {
				ee, ok := err.(exitError)
				if !ok {
					t.Fatalf("run: %v", err)
				}
				code = ee.code
			}
			if code != c.code || out != "hello\n" {
				t.Errorf("exit %d, want %d; stdout %q", code, c.code, out)
			}
			if got := len(d.killed) == 1 && d.killed[0] == "sb-run"; got != c.killed {
				t.Errorf("killed %v, want killed: %v", d.killed, c.killed)
			}
			f := d.fork
			if f.Tag != "py" || f.Count != 1 || f.Metadata[runLabel] == "" {
				t.Errorf("fork request %+v", f)
			}
			if c.killed != (f.IdleTimeoutSeconds > 0) {
				t.Errorf("idle timeout %ds (removed: %v)", f.IdleTimeoutSeconds, c.killed)
			}
			if c.name == "timeout" && (f.TimeoutSeconds == nil || *f.TimeoutSeconds != 65) {
				t.Errorf("sandbox timeout %v, want 5s + a minute", f.TimeoutSeconds)
			}
		})
	}
}

func TestRunForkFailure(t *testing.T) {
	d := newRunDaemon(t, apiv1.ExecEvent{}, &apiv1.Problem{Status: http.StatusNotFound, Code: "not_found", Detail: `snapshot "nope" not found`})
	_, err := runCLI(t, d.fakeDaemon, "run", "--tag", "nope", "--", "true")
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), `fork from "nope"`) || len(d.killed) != 0 {
		t.Fatalf("fork failure: %v, killed %v", err, d.killed)
	}
	if _, err := runCLI(t, d.fakeDaemon, "run", "--tag", "py", "--keep", "--rm", "--", "true"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("--keep --rm: %v", err)
	}
	// Without a command run runs the image's default one (integration
	// tests it); --shell has nothing to run then.
	if _, err := runCLI(t, d.fakeDaemon, "run", "--tag", "py", "--shell"); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "--shell needs") {
		t.Errorf("--shell without a command: %v", err)
	}
}
