package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// With the uffd memory backend each child's memory is served by a page
// server the engine starts for it: a stand-in VMM process registers its
// memory with a real userfaultfd, and what it reads through the server is
// the snapshot's memory, byte for byte. The server ends with its VMM.
func TestForkServesMemoryByPageServer(t *testing.T) {
	d := &fakeDriver{uffd: true, agentAfterRestore: true}
	e, _ := newFakeEngineWith(t, d, 0, func(c *Config) { c.MemoryBackend = vmm.MemoryBackendUffd })

	st, err := e.Store().Stage("served")
	if err != nil {
		t.Fatal(err)
	}
	mem := make([]byte, 1<<20)
	rand.Read(mem[:256<<10]) // data, then zeros (served as zero pages)
	if err := os.WriteFile(filepath.Join(st.Dir, snapshot.StateFile), []byte("state"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(st.Dir, snapshot.MemoryFile), mem, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Commit(snapshot.Manifest{VMM: snapshot.VMMRef{Kind: "fake"}, MemoryMiB: 1, VCPUs: 1}); err != nil {
		t.Fatal(err)
	}
	sbs, err := e.Fork(context.Background(), "served", 2)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(mem)
	want := hex.EncodeToString(sum[:])
	d.mu.Lock()
	got := append([]string(nil), d.uffdDigests...)
	d.mu.Unlock()
	if len(got) != 2 || got[0] != want || got[1] != want {
		t.Fatalf("children read memory with digests %v through their page servers, want 2 × %s", got, want)
	}
	for _, s := range sbs {
		if !e.record(s).PageServed {
			t.Errorf("sandbox %s: its record does not say its memory was page-served (a restarted daemon would adopt it)", s.ID)
		}
		sock := filepath.Join(s.machine.Config().RunDir, "uffd.sock")
		if _, err := os.Stat(sock); err != nil {
			t.Errorf("sandbox %s: page server socket: %v", s.ID, err)
		}
	}
	if _, err := e.Kill(context.Background(), []string{sbs[0].ID}); err != nil {
		t.Fatal(err)
	}
	// No assembled image: the memory cache holds nothing.
	if ents, _ := os.ReadDir(e.mem.dir); len(ents) != 0 {
		t.Errorf("the memory cache holds %d entries with the uffd backend", len(ents))
	}
}

func TestMemoryBackendRefused(t *testing.T) {
	if err := checkMemoryBackend(vmm.MemoryBackendUffd, &fakeDriver{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("uffd on a driver without it: %v", err)
	}
	if err := checkMemoryBackend("mmap", &fakeDriver{uffd: true}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("an unknown backend: %v", err)
	}
	if err := checkMemoryBackend(vmm.MemoryBackendFile, &fakeDriver{}); err != nil {
		t.Errorf("the file backend: %v", err)
	}
}

// A daemon that leaves its sandboxes running across a restart still
// stops the page-served ones: their page server ends with it.
func TestCloseStopsPageServedSandboxes(t *testing.T) {
	d := &fakeDriver{uffd: true, agentAfterRestore: true}
	e, _ := newFakeEngineWith(t, d, 0, func(c *Config) {
		c.MemoryBackend = vmm.MemoryBackendUffd
		c.KeepSandboxesOnClose = true
	})
	st, err := e.Store().Stage("served")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(st.Dir, snapshot.StateFile), []byte("state"), 0o600)
	os.WriteFile(filepath.Join(st.Dir, snapshot.MemoryFile), make([]byte, 1<<20), 0o600)
	if _, err := st.Commit(snapshot.Manifest{VMM: snapshot.VMMRef{Kind: "fake"}, MemoryMiB: 1, VCPUs: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Fork(context.Background(), "served", 1); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := d.alive(); n != 0 {
		t.Fatalf("%d page-served VMMs left running by a daemon that keeps its sandboxes", n)
	}
}
