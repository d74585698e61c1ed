package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

// What the CLI shows of a guest's console (sandbox info, ls, errors) is
// escaped, even from a daemon (or a record of one) that did not escape it.
func TestCLIEscapesConsole(t *testing.T) {
	const hostile = "boot ok\r\n\x1b[2J\x1b]0;pwned\x07panic \u009b1m\n"
	mux := http.NewServeMux()
	sb := apiv1.Sandbox{ID: "sb-1", Tag: "t", State: apiv1.StateDead, DeadReason: "qemu exited\nconsole tail:\n" + hostile, ConsoleTail: hostile}
	mux.HandleFunc("GET /v1/sandboxes/sb-1", func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(sb) })
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode([]apiv1.Sandbox{sb})
	})
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		writeProblemJSON(w, apiv1.Problem{Title: "Service Unavailable", Status: 503, Detail: "agent did not answer; console:\n" + hostile, Code: "unavailable"})
	})
	d := newFakeDaemon(t, mux)
	clean := func(what, out string) {
		t.Helper()
		if strings.ContainsAny(out, "\x1b\x07\r\u009b") {
			t.Errorf("%s: control characters left in %q", what, out)
		}
		if !strings.Contains(out, "dead") && !strings.Contains(out, `\x1b[2J`) {
			t.Errorf("%s: neither the state nor the console in %q", what, out)
		}
	}
	out, err := runCLI(t, d, "sandbox", "info", "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	clean("sandbox info", out)
	if !strings.Contains(out, `  \x1b[2J\x1b]0;pwned\x07panic \u009b1m`) {
		t.Errorf("sandbox info: console tail not shown escaped: %q", out)
	}
	out, err = runCLI(t, d, "ls")
	if err != nil {
		t.Fatal(err)
	}
	clean("ls", out)
	_, err = runCLI(t, d, "fork", "--tag", "t")
	var buf bytes.Buffer
	printError(&buf, err, false)
	clean("error", buf.String())
}
