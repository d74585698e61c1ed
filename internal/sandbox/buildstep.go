package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentconn"
	"github.com/forkd-dev/forkd/internal/cleanup"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/image"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/ociimage"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/tailbuf"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// stepTimeout bounds one Run step of an image build (a pip install of a
// large stack under emulation takes many minutes).
const stepTimeout = 30 * time.Minute

var _ image.StepRunner = (*Engine)(nil)

// RunStep runs one Run step of an image build (image.StepRunner): it
// boots a build VM from the image of the steps before, in its own network
// namespace with no egress (the default of a namespace no policy was
// applied to), runs the command, and streams the guest's changes (its
// overlay's upper directory) into w. The VM is gone when it returns.
func (e *Engine) RunStep(ctx context.Context, spec image.StepSpec, w *ociimage.LayerWriter) error {
	id := "bld-" + snapshot.NewID()
	var cl cleanup.Stack
	defer cl.Clean(context.WithoutCancel(ctx))
	runDir := filepath.Join(e.cfg.RunDir, "vms", id)
	cl.Push(removeAllStep(runDir))
	ns, err := netns.Create(ctx, e.cfg.NetNSPrefix+id, netns.Options{})
	if err != nil {
		return fmt.Errorf("build VM network namespace: %w", err)
	}
	cl.Push(func(context.Context) error { return ns.Remove() })
	vimg := spec.Image
	vimg.KernelArgs = append(vimg.KernelArgs, guestNetworkArgs()...)
	m, err := e.cfg.Driver.Boot(ctx, vmm.BootSpec{MachineConfig: vmm.MachineConfig{
		ID: id, RunDir: runDir, Image: vimg,
		MemoryMiB: spec.MemoryMiB, VCPUs: spec.VCPUs, Accel: e.cfg.Accel,
		Network:    &vmm.Network{NetNSPath: ns.Path(), TapName: netns.DefaultTap, MAC: netns.GuestMAC},
		ConsoleLog: filepath.Join(runDir, "console.log"),
	}})
	if err != nil {
		return fmt.Errorf("boot build VM: %w", err)
	}
	cl.Push(func(context.Context) error { return m.Kill() })
	bctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	conn, err := m.DialAgent(bctx)
	if err != nil {
		return fmt.Errorf("build VM agent socket: %w", err)
	}
	cl.Push(func(context.Context) error { return conn.Close() })
	sess, _, err := agentconn.Dial(bctx, conn, agentapi.Hello{Identity: newIdentity(id)})
	if err != nil {
		return fmt.Errorf("build VM agent did not answer within %s: %w\nconsole:\n%s", bootTimeout, err, m.ConsoleTail(consoleTailBytes))
	}
	cl.Push(func(context.Context) error { return sess.Close() })
	agent := e.agentClient(sess)

	out := tailbuf.New(4096)
	s := spec.Step
	xctx, cancel := context.WithTimeout(ctx, stepTimeout+30*time.Second)
	defer cancel()
	ev, err := agent.Exec(xctx, agentapi.ExecRequest{
		Argv: s.Argv, Shell: s.Shell, Env: spec.Env, Cwd: spec.Workdir, User: spec.User,
		TimeoutMillis: stepTimeout.Milliseconds(),
	}, nil, out, out)
	switch {
	case err != nil:
		return fmt.Errorf("run %q: %w", firstLine(s.Shell+fmt.Sprint(s.Argv)), err)
	case ev.TimedOut:
		return fmt.Errorf("still running after %s: %w\n%s", stepTimeout, errdefs.ErrInvalidArgument, out)
	case ev.ExitCode != 0:
		return fmt.Errorf("the command exited with %d: %w\n%s", ev.ExitCode, errdefs.ErrInvalidArgument, out)
	}
	if _, err := agent.Changes(ctx, w, spec.MaxLayerBytes); err != nil {
		return fmt.Errorf("reading the step's changes: %w", err)
	}
	return nil
}
