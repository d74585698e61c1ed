package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// TestEveryCommandHasExamples walks the command tree: every runnable
// command has an Examples section.
func TestEveryCommandHasExamples(t *testing.T) {
	walkCommands(newRootCmd(&globals{}), func(c *cobra.Command) {
		if c.HasParent() && c.Runnable() && !c.Hidden && !c.HasSubCommands() && c.Example == "" {
			t.Errorf("%q has no Example: add one to examples.go (or the command's Example field)", c.CommandPath())
		}
	})
	for key := range examples {
		found := false
		walkCommands(newRootCmd(&globals{}), func(c *cobra.Command) { found = found || commandKey(c) == key })
		if !found {
			t.Errorf("examples names %q, which is no command", key)
		}
	}
}

// splitLine splits a shell line into words, honouring quotes; a word
// starting with # ends it.
func splitLine(line string) []string {
	var words []string
	var cur strings.Builder
	var quote rune
	inWord := false
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case r == '#' && !inWord:
			return words
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// TestExamplesParse: every example line names a command that exists and
// flags it takes.
func TestExamplesParse(t *testing.T) {
	root := newRootCmd(&globals{})
	walkCommands(root, func(c *cobra.Command) {
		for _, line := range strings.Split(c.Example, "\n") {
			_, rest, ok := strings.Cut(line, "forkd ")
			if !ok {
				continue
			}
			for _, sep := range []string{" || ", " | ", " &"} {
				rest, _, _ = strings.Cut(rest, sep)
			}
			words := splitLine(rest)
			if dash := indexOf(words, "--"); dash >= 0 {
				words = words[:dash]
			}
			found, args, err := root.Find(words)
			if err != nil || found == root {
				t.Errorf("%s example %q: no such command (%v)", c.CommandPath(), line, err)
				continue
			}
			if err := found.ParseFlags(args); err != nil {
				t.Errorf("%s example %q: %v", c.CommandPath(), line, err)
			}
		}
	})
}

func indexOf(words []string, w string) int {
	for i, x := range words {
		if x == w {
			return i
		}
	}
	return -1
}

// TestUnknownSubcommandIsUsageError: a group given a subcommand it lacks
// is a usage error (exit 2) with a suggestion, not its help and exit 0.
func TestUnknownSubcommandIsUsageError(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "rn"}, `unknown command "rn" for "forkd sandbox"; did you mean ls`},
		{[]string{"snapshot", "delet", "x"}, "did you mean rm?"},
		{[]string{"system", "dff"}, "did you mean df?"},
		{[]string{"fokr"}, `unknown command "fokr" for "forkd"; did you mean fork?`},
	} {
		out, err := runCLI(t, nil, c.args...)
		if !errdefs.IsInvalidArgument(err) || exitCodeOf(err) != 2 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("forkd %s: %v (exit %d), want %q", strings.Join(c.args, " "), err, exitCodeOf(err), c.want)
		}
		if out != "" {
			t.Errorf("forkd %s printed %q", strings.Join(c.args, " "), out)
		}
	}
	out, err := runCLI(t, nil, "sandbox")
	if err != nil || !strings.Contains(out, "Available Commands") {
		t.Errorf("a group alone prints its help: %v %q", err, out)
	}
}

// TestAliasesReachTheirCommands: the docker-style names and the aliases
// people type send the requests of the commands they stand for.
func TestAliasesReachTheirCommands(t *testing.T) {
	var kills, deletes atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/kill", func(w http.ResponseWriter, r *http.Request) {
		kills.Add(1)
		var req apiv1.KillRequest
		json.NewDecoder(r.Body).Decode(&req)
		json.NewEncoder(w).Encode(apiv1.KillResponse{Killed: req.IDs})
	})
	mux.HandleFunc("DELETE /v1/snapshots/{tag}", func(w http.ResponseWriter, r *http.Request) {
		deletes.Add(1)
		json.NewEncoder(w).Encode(apiv1.RemovedSnapshots{Removed: []string{r.PathValue("tag")}})
	})
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode([]apiv1.Sandbox{{ID: "sb-1", Tag: "t", State: apiv1.StateRunning, Created: time.Now()}})
	})
	d := newFakeDaemon(t, mux)
	for _, args := range [][]string{{"rm", "sb-1"}, {"sandbox", "rm", "sb-1"}, {"sandbox", "kill", "sb-1"}} {
		if out, err := runCLI(t, d, args...); err != nil || !strings.Contains(out, "killed sb-1") {
			t.Errorf("forkd %v: %v %q", args, err, out)
		}
	}
	for _, args := range [][]string{{"snapshot", "delete", "x"}, {"snapshot", "remove", "x"}, {"snapshot", "rm", "x"}} {
		if out, err := runCLI(t, d, args...); err != nil || !strings.Contains(out, "removed x") {
			t.Errorf("forkd %v: %v %q", args, err, out)
		}
	}
	if kills.Load() != 3 || deletes.Load() != 3 {
		t.Errorf("%d kills, %d deletes; want 3 of each", kills.Load(), deletes.Load())
	}
	if out, err := runCLI(t, d, "ps"); err != nil || !strings.Contains(out, "sb-1") {
		t.Errorf("forkd ps: %v %q", err, out)
	}
}

// TestCompletionFromTheDaemon: ids, tags and images come from the
// daemon; a daemon that is not there gives nothing, at once.
func TestCompletionFromTheDaemon(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode([]apiv1.Sandbox{{ID: "sb-aaa"}, {ID: "sb-bbb"}})
	})
	mux.HandleFunc("GET /v1/snapshots", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode([]apiv1.Snapshot{{Tag: "py", Recipe: "python"}, {Tag: "base", Recipe: "minimal"}})
	})
	mux.HandleFunc("GET /v1/images", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode([]apiv1.Image{{Digest: strings.Repeat("ab", 32), Recipe: "python"}})
	})
	d := newFakeDaemon(t, mux)
	for _, c := range []struct {
		args      []string
		want, not []string
	}{
		{[]string{"kill", "sb-aaa", ""}, []string{"sb-bbb"}, []string{"sb-aaa"}},
		{[]string{"sandbox", "info", ""}, []string{"sb-aaa", "sb-bbb"}, nil},
		{[]string{"sandbox", "info", "sb-aaa", ""}, nil, []string{"sb-bbb"}},
		{[]string{"fork", "--tag", ""}, []string{"py", "base"}, nil},
		{[]string{"run", "--tag", ""}, []string{"py", "base"}, nil},
		{[]string{"rmi", ""}, []string{"py", "base"}, nil},
		{[]string{"snapshot", "create", "--recipe", ""}, []string{"python", "minimal"}, nil},
		{[]string{"image", "rm", ""}, []string{"abababababab", "python"}, nil},
	} {
		out, err := runCLI(t, d, append([]string{"__complete"}, c.args...)...)
		if err != nil {
			t.Fatalf("complete %v: %v", c.args, err)
		}
		lines := strings.Split(out, "\n")
		for _, w := range c.want {
			if indexOf(lines, w) < 0 {
				t.Errorf("complete %v: no %q in\n%s", c.args, w, out)
			}
		}
		for _, w := range c.not {
			if indexOf(lines, w) >= 0 {
				t.Errorf("complete %v: %q offered again in\n%s", c.args, w, out)
			}
		}
	}

	gone := &fakeDaemon{sock: filepath.Join(t.TempDir(), "none.sock")}
	start := time.Now()
	out, err := runCLI(t, gone, "__complete", "kill", "")
	if err != nil || strings.Contains(out, "sb-") || time.Since(start) > completionTimeout+5*time.Second {
		t.Errorf("completion without a daemon: %v after %s: %q", err, time.Since(start), out)
	}
}

// TestDaemonLogsSaysWhereTheLogIs: with no log, nothing on stdout (not an
// empty line); the message names the file.
func TestDaemonLogsSaysWhereTheLogIs(t *testing.T) {
	runDir := t.TempDir()
	out, err := runCLI(t, nil, "--run-dir", runDir, "daemon", "logs")
	if err != nil || out != "" {
		t.Fatalf("daemon logs with no log: %v, stdout %q", err, out)
	}
	path := filepath.Join(runDir, "forkd.log")
	if msg := noLogMessage(path); !strings.Contains(msg, path) || !strings.Contains(msg, "journalctl") {
		t.Errorf("no log file: %q", msg)
	}
	os.WriteFile(path, nil, 0o600)
	if msg := noLogMessage(path); !strings.Contains(msg, path+" is empty") {
		t.Errorf("empty log file: %q", msg)
	}
}
