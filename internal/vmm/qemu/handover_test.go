package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/qmp"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// These tests need neither root nor QEMU: fakeMonitor keeps QEMU's
// descriptor bookkeeping (getfd names, add-fd sets) as QEMU 10 does.

// fakeFD is a descriptor QEMU holds, with the label it was passed with.
type fakeFD struct {
	fd    int
	label string
}

// fakeMonitor serves QMP like QEMU for the hand-over commands: getfd and
// closefd keep named descriptors, add-fd, remove-fd and query-fdsets
// descriptor sets, and migrate and migrate-incoming take what their URI
// names (a named descriptor, or a dup of the set's descriptor whose
// access mode matches, checked as QEMU does) until the migration ends.
type fakeMonitor struct {
	version string // query-version's reply

	mu          sync.Mutex
	named       map[string]fakeFD
	sets        map[int64][]fakeFD
	dups        map[int64]int // per set: duplicates a migration holds
	commands    []string      // every command, in order
	uris        []string      // every migration URI
	failMigrate bool
}

func newFakeMonitor(t *testing.T, version string) (*fakeMonitor, string) {
	t.Helper()
	f := &fakeMonitor{version: version, named: map[string]fakeFD{}, sets: map[int64][]fakeFD{}, dups: map[int64]int{}}
	path := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, d := range f.named {
			syscall.Close(d.fd)
		}
		for _, s := range f.sets {
			for _, d := range s {
				syscall.Close(d.fd)
			}
		}
	})
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go f.serve(c)
		}
	}()
	return f, path
}

func (f *fakeMonitor) serve(c *net.UnixConn) {
	defer c.Close()
	enc := json.NewEncoder(c)
	enc.Encode(map[string]any{"QMP": map[string]any{"version": map[string]any{"qemu": map[string]int{"major": 10}}, "capabilities": []string{}}})
	var pending []byte
	var fds []int
	buf, oob := make([]byte, 1<<16), make([]byte, 1024)
	for {
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				got, _ := syscall.ParseUnixRights(&m)
				fds = append(fds, got...)
			}
		}
		pending = append(pending, buf[:n]...)
		for {
			i := bytes.IndexByte(pending, '\n')
			if i < 0 {
				break
			}
			var cmd struct {
				Execute   string          `json:"execute"`
				Arguments json.RawMessage `json:"arguments"`
				ID        any             `json:"id"`
			}
			json.Unmarshal(pending[:i], &cmd)
			pending = pending[i+1:]
			var fd = -1
			if len(fds) > 0 && (cmd.Execute == "getfd" || cmd.Execute == "add-fd") {
				fd, fds = fds[0], fds[1:]
			}
			ret, qerr := f.execute(cmd.Execute, cmd.Arguments, fd)
			if qerr != "" {
				enc.Encode(map[string]any{"error": map[string]string{"class": "GenericError", "desc": qerr}, "id": cmd.ID})
				continue
			}
			if ret == nil {
				ret = map[string]any{}
			}
			enc.Encode(map[string]any{"return": ret, "id": cmd.ID})
			if cmd.Execute == "migrate-incoming" {
				enc.Encode(map[string]any{"event": "RESUME", "timestamp": map[string]int{"seconds": 1}})
			}
		}
	}
}

func (f *fakeMonitor) execute(cmd string, raw json.RawMessage, fd int) (any, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commands = append(f.commands, cmd)
	var args struct {
		FDName string `json:"fdname"`
		Opaque string `json:"opaque"`
		FDSet  int64  `json:"fdset-id"`
		URI    string `json:"uri"`
	}
	json.Unmarshal(raw, &args)
	switch cmd {
	case "qmp_capabilities", "cont":
		return nil, ""
	case "query-status":
		return map[string]any{"status": "running", "running": true}, ""
	case "query-migrate":
		return map[string]any{"status": "completed"}, ""
	case "query-yank":
		return []any{map[string]string{"type": "chardev", "id": "qmp"}}, ""
	case "query-version":
		maj, min, mic := 0, 0, 0
		fmt.Sscanf(f.version, "%d.%d.%d", &maj, &min, &mic)
		return map[string]any{"qemu": map[string]int{"major": maj, "minor": min, "micro": mic}, "package": " (fake)"}, ""
	case "getfd":
		if fd < 0 {
			return nil, "No file descriptor supplied via SCM_RIGHTS"
		}
		f.named[args.FDName] = fakeFD{fd, args.FDName}
		return nil, ""
	case "closefd":
		d, ok := f.named[args.FDName]
		if !ok {
			return nil, fmt.Sprintf("File descriptor named '%s' not found", args.FDName)
		}
		syscall.Close(d.fd)
		delete(f.named, args.FDName)
		return nil, ""
	case "add-fd":
		if fd < 0 {
			return nil, "No file descriptor supplied via SCM_RIGHTS"
		}
		id := int64(0)
		for f.sets[id] != nil || f.dups[id] > 0 {
			id++
		}
		f.sets[id] = []fakeFD{{fd, args.Opaque}}
		return map[string]any{"fdset-id": id, "fd": fd}, ""
	case "remove-fd":
		s, ok := f.sets[args.FDSet]
		if !ok {
			return nil, fmt.Sprintf("File descriptor named 'fdset-id:%d' not found", args.FDSet)
		}
		for _, d := range s {
			syscall.Close(d.fd)
		}
		delete(f.sets, args.FDSet)
		return nil, ""
	case "query-fdsets":
		var out []map[string]any
		for id, s := range f.sets {
			var fds []map[string]any
			for _, d := range s {
				fds = append(fds, map[string]any{"fd": d.fd, "opaque": d.label})
			}
			out = append(out, map[string]any{"fdset-id": id, "fds": fds})
		}
		for id, n := range f.dups {
			if n > 0 && f.sets[id] == nil {
				out = append(out, map[string]any{"fdset-id": id, "fds": []any{}})
			}
		}
		return out, ""
	case "migrate", "migrate-incoming":
		f.uris = append(f.uris, args.URI)
		if f.failMigrate {
			return nil, "migration refused (fake)"
		}
		mode := syscall.O_WRONLY
		if cmd == "migrate-incoming" {
			mode = syscall.O_RDONLY
		}
		if name, ok := strings.CutPrefix(args.URI, "fd:"); ok {
			d, ok := f.named[name]
			if !ok {
				return nil, fmt.Sprintf("File descriptor named '%s' has not been found", name)
			}
			// The migration owns it, and closes it when done.
			syscall.Close(d.fd)
			delete(f.named, name)
			return nil, ""
		}
		var id int64
		if _, err := fmt.Sscanf(args.URI, "file:/dev/fdset/%d", &id); err != nil {
			return nil, "unsupported URI " + args.URI
		}
		for _, d := range f.sets[id] {
			fl, err := fcntlFlags(d.fd)
			if err == nil && fl&syscall.O_ACCMODE == mode {
				// The migration ends at once here: its dup is closed.
				return nil, ""
			}
		}
		return nil, fmt.Sprintf("Could not open '/dev/fdset/%d': Permission denied", id)
	}
	return nil, "CommandNotFound " + cmd
}

func fcntlFlags(fd int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFL, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

// fdsets is what query-fdsets lists.
func (f *fakeMonitor) fdsets() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sets)
}

func (f *fakeMonitor) namedFDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.named {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (f *fakeMonitor) count(cmd string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.commands {
		if c == cmd {
			n++
		}
	}
	return n
}

// fakeProcess stands for QEMU's process: it ends when killed.
type fakeProcess struct{ killed chan struct{} }

func (p *fakeProcess) wait() error { <-p.killed; return nil }
func (p *fakeProcess) kill() error {
	select {
	case <-p.killed:
	default:
		close(p.killed)
	}
	return nil
}

// fakeMachine is a Machine of the given QEMU version connected to a
// fakeMonitor.
func fakeMachine(t *testing.T, version string) (*Machine, *fakeMonitor) {
	t.Helper()
	mon, sock := newFakeMonitor(t, version)
	dir := t.TempDir()
	d := &Driver{log: slog.New(slog.NewTextHandler(testLog{t}, nil)), version: version, feat: featuresOf(version)}
	m := newMachine(d, vmm.MachineConfig{ID: "fake", RunDir: dir, ConsoleLog: filepath.Join(dir, "console.log")}, &fakeProcess{killed: make(chan struct{})}, false)
	// A live process: a failed step reports its own error (failure).
	m.pid = os.Getpid()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := qmp.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	m.attach(c)
	return m, mon
}

type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func TestHandOverChoosesURIByVersion(t *testing.T) {
	for _, tc := range []struct {
		version, uri string
		fdsets       int
		named        []string
	}{
		{"10.0.2", "file:/dev/fdset/0", 1, nil},
		{"9.1.0", "file:/dev/fdset/0", 1, nil},
		{"9.0.0", "fd:" + stateFD, 0, []string{stateFD}},
		{"7.2.22", "fd:" + stateFD, 0, []string{stateFD}},
	} {
		t.Run(tc.version, func(t *testing.T) {
			m, mon := fakeMachine(t, tc.version)
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "state")
			h, err := m.handOverFile(ctx, path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, stateFD)
			if err != nil {
				t.Fatal(err)
			}
			if h.uri() != tc.uri || mon.fdsets() != tc.fdsets || !slices.Equal(mon.namedFDs(), tc.named) {
				t.Fatalf("handed over as %s: %d fdsets, named %v; want %s, %d, %v", h.uri(), mon.fdsets(), mon.namedFDs(), tc.uri, tc.fdsets, tc.named)
			}
			if err := h.migrate(ctx, "migrate"); err != nil {
				t.Fatal(err)
			}
			h.release(ctx)
			h.release(ctx) // a second time does nothing
			if mon.fdsets() != 0 || len(mon.namedFDs()) != 0 {
				t.Errorf("after release: %d fdsets, named %v", mon.fdsets(), mon.namedFDs())
			}
			// The fdset is removed once; a named descriptor the migration
			// took needs no closefd.
			if got := mon.count("remove-fd") + mon.count("closefd"); got != tc.fdsets {
				t.Errorf("release sent %d remove-fd/closefd, want %d", got, tc.fdsets)
			}
		})
	}
}

// A hand-over no migration took is taken back, in both forms.
func TestHandOverReleasedWithoutMigration(t *testing.T) {
	for _, version := range []string{"10.0.2", "7.2.22"} {
		t.Run(version, func(t *testing.T) {
			m, mon := fakeMachine(t, version)
			ctx := context.Background()
			h, err := m.handOverFile(ctx, filepath.Join(t.TempDir(), "state"), os.O_WRONLY|os.O_CREATE, stateFD)
			if err != nil {
				t.Fatal(err)
			}
			if mon.fdsets()+len(mon.namedFDs()) != 1 {
				t.Fatalf("QEMU holds %d fdsets, named %v", mon.fdsets(), mon.namedFDs())
			}
			cctx, cancel := context.WithCancel(ctx)
			cancel() // release works after its caller's context ended
			h.release(cctx)
			if mon.fdsets() != 0 || len(mon.namedFDs()) != 0 {
				t.Errorf("after release: %d fdsets, named %v", mon.fdsets(), mon.namedFDs())
			}
		})
	}
}

// Restore loads the state file Prepare handed over and takes it back; a
// snapshot whose migration fails takes its file back too.
func TestMigrationsReleaseTheirFiles(t *testing.T) {
	for _, version := range []string{"10.0.2", "7.2.22"} {
		t.Run(version, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			dir := t.TempDir()
			state := filepath.Join(dir, "state")
			if err := os.WriteFile(state, []byte("QEVM"), 0o600); err != nil {
				t.Fatal(err)
			}

			m, mon := fakeMachine(t, version)
			var err error
			if m.stateFile, err = m.handOverFile(ctx, state, os.O_RDONLY, stateFD); err != nil {
				t.Fatal(err)
			}
			m.state = statePrepared
			if _, err := m.Restore(ctx); err != nil {
				t.Fatal(err)
			}
			if mon.fdsets() != 0 || len(mon.namedFDs()) != 0 {
				t.Errorf("after Restore QEMU holds %d fdsets, named %v", mon.fdsets(), mon.namedFDs())
			}

			mon.mu.Lock()
			mon.failMigrate = true
			mon.mu.Unlock()
			_, err = m.Snapshot(ctx, vmm.SnapshotSpec{Type: vmm.SnapshotFull, StateFile: filepath.Join(dir, "snap")})
			if err == nil || !strings.Contains(err.Error(), "migration refused") {
				t.Fatalf("Snapshot with a failing migration = %v", err)
			}
			if mon.fdsets() != 0 || len(mon.namedFDs()) != 0 {
				t.Errorf("after a failed Snapshot QEMU holds %d fdsets, named %v", mon.fdsets(), mon.namedFDs())
			}
			want := []string{"fd:" + stateFD, "fd:" + stateFD}
			if featuresOf(version).fileMigration {
				want = []string{"file:/dev/fdset/0", "file:/dev/fdset/0"}
			}
			if !slices.Equal(mon.uris, want) {
				t.Errorf("migration URIs %q, want %q", mon.uris, want)
			}
		})
	}
}

// An adopted QEMU's version is its own, and what a dead daemon left
// handed over is taken back.
func TestSettleHandovers(t *testing.T) {
	for _, tc := range []struct {
		running string
		file    bool
	}{
		{"10.0.2", true},
		{"9.0.1", false},
	} {
		t.Run(tc.running, func(t *testing.T) {
			m, mon := fakeMachine(t, tc.running)
			// The installed binary is another release.
			m.d.version, m.d.feat = "8.2.0", featuresOf("8.2.0")
			m.feat = m.d.feat
			ctx := context.Background()
			// The dead daemon's: a set and a named descriptor.
			f, err := os.Open(os.DevNull)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := m.addFdset(ctx, f, branchFD); err != nil {
				t.Fatal(err)
			}
			if err := m.qmp.ExecuteWithFiles(ctx, "getfd", map[string]string{"fdname": stateFD}, nil, f); err != nil {
				t.Fatal(err)
			}
			// A set only a running migration still holds (no fds left).
			mon.mu.Lock()
			mon.dups[7] = 1
			mon.mu.Unlock()

			m.settleHandovers(ctx)
			if m.feat.fileMigration != tc.file {
				t.Errorf("adopted QEMU %s: fileMigration %v, want %v", tc.running, m.feat.fileMigration, tc.file)
			}
			if mon.fdsets() != 0 {
				t.Errorf("%d fdsets left", mon.fdsets())
			}
			if got := mon.count("remove-fd"); got != 1 {
				t.Errorf("%d remove-fd, want 1 (the set a migration holds is left to it)", got)
			}
			// Named descriptors too (an older forkd passed every file so).
			if got := mon.namedFDs(); len(got) != 0 {
				t.Errorf("named descriptors left: %v", got)
			}
		})
	}
}

func TestRunningVersion(t *testing.T) {
	m, _ := fakeMachine(t, "9.2.3")
	v, err := runningVersion(context.Background(), m.qmp)
	if err != nil || v != "9.2.3 (fake)" {
		t.Fatalf("runningVersion = %q, %v", v, err)
	}
	if maj, min := versionNumbers(v); maj != 9 || min != 2 {
		t.Errorf("versionNumbers(%q) = %d.%d", v, maj, min)
	}
}
