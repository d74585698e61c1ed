package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/cleanup"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// ColdVM is a VM booted from scratch from a snapshot's image: the baseline
// that forks are measured against.
type ColdVM struct {
	// Ready is from starting the VMM to the agent answering.
	Ready time.Duration
	PID   int
	Agent *agentclient.Client
	stop  cleanup.Stack
}

// Stop ends the cold VM and removes its namespace and run files.
func (c *ColdVM) Stop() { c.stop.Clean(context.Background()) }

// ColdBoot boots the image of the snapshot tagged tag without restoring
// anything (anonymous RAM, same devices), as `forkd bench` needs.
func (e *Engine) ColdBoot(ctx context.Context, tag string) (_ *ColdVM, err error) {
	snap, err := e.store.Get(tag)
	if err != nil {
		return nil, err
	}
	cv := &ColdVM{}
	defer func() {
		if err != nil {
			cv.Stop()
		}
	}()
	id := "cold-" + snapshot.NewID()
	runDir := filepath.Join(e.cfg.RunDir, "vms", id)
	cv.stop.Push(removeAllStep(runDir))
	ns, err := netns.Create(ctx, e.cfg.NetNSPrefix+id, netns.Options{})
	if err != nil {
		return nil, err
	}
	cv.stop.Push(func(context.Context) error { return ns.Remove() })
	mc := e.machineConfig(id, snap, runDir, "")
	mc.Network = &vmm.Network{NetNSPath: ns.Path(), TapName: netns.DefaultTap, MAC: snap.Network.GuestMAC}
	start := time.Now()
	m, err := e.cfg.Driver.Boot(ctx, vmm.BootSpec{MachineConfig: mc})
	if err != nil {
		return nil, err
	}
	cv.stop.Push(func(context.Context) error { return m.Kill() })
	bctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	conn, err := m.DialAgent(bctx)
	if err != nil {
		return nil, err
	}
	cv.stop.Push(func(context.Context) error { return conn.Close() })
	sess, _, err := e.greetAgent(bctx, conn, id)
	if err != nil {
		return nil, fmt.Errorf("cold boot: agent did not answer: %w\n%s", err, m.ConsoleTail(consoleTailBytes))
	}
	cv.stop.Push(func(context.Context) error { return sess.Close() })
	cv.Ready = time.Since(start)
	cv.PID = m.PID()
	cv.Agent = agentclient.New(sess)
	return cv, nil
}
