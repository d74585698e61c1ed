package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/uffd"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// pageServer serves one child's memory from its snapshot's chain
// (vmm.MemoryBackendUffd, Config.MemoryBackend): the VMM maps guest memory
// anonymously and hands every first touch of a page to it. A chain of
// diff layers is served as it is, never assembled into a flat image.
type pageServer struct {
	socket string
	chain  *uffd.Chain
	ln     *net.UnixListener
	stop   context.CancelFunc
	done   chan struct{}
}

// openPageServer checks snap's chain, opens its memory and listens on a
// socket in runDir. Nothing is served until start.
func (e *Engine) openPageServer(snap *snapshot.Snapshot, runDir string) (_ *pageServer, err error) {
	chain, err := e.intactChain(snap)
	if err != nil {
		return nil, err
	}
	mem, err := uffd.OpenSnapshotChain(chain)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			mem.Close()
		}
	}()
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return nil, err
	}
	sock := filepath.Join(runDir, "uffd.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("page server socket: %w", err)
	}
	return &pageServer{socket: sock, chain: mem, ln: ln}, nil
}

// start serves m's memory until close. If the server ends on its own
// (the handshake was refused, the VMM's memory is gone), m is killed: a
// guest whose page server is gone would hang on its next missing page.
func (ps *pageServer) start(e *Engine, id string, m vmm.Machine) {
	ctx, stop := context.WithCancel(e.life)
	ps.stop, ps.done = stop, make(chan struct{})
	go func() {
		defer close(ps.done)
		err := uffd.NewServer(ps.chain, uffd.Options{}).Serve(ctx, ps.ln)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("ended while the VMM ran")
		}
		e.log.Error("page server ended: killing its VMM", "sandbox_id", id, "err", err)
		m.Kill()
	}()
	go func() {
		select {
		case <-m.Done():
			stop()
		case <-ctx.Done():
		}
	}()
}

// close stops serving and releases the chain; the VMM must be gone or
// about to be killed.
func (ps *pageServer) close(context.Context) error {
	if ps.stop != nil {
		ps.stop()
		<-ps.done
	}
	ps.ln.Close()
	return ps.chain.Close()
}

// checkMemoryBackend refuses a backend the driver cannot restore with.
func checkMemoryBackend(b vmm.MemoryBackend, d vmm.Driver) error {
	switch b {
	case vmm.MemoryBackendFile:
		return nil
	case vmm.MemoryBackendUffd:
		if fr, ok := d.(vmm.FeatureReporter); ok && fr.Features().UffdMemory {
			return nil
		}
		return fmt.Errorf("memory backend %q: the %s driver cannot restore memory served by a page server (use the file backend, or --vmm firecracker): %w", b, d.Name(), errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("memory backend %q: want \"file\" or \"uffd\": %w", b, errdefs.ErrInvalidArgument)
}
