package sandbox

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/cleanup"
	"github.com/forkd-dev/forkd/internal/egress"
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

// stepRunner runs one build's Run steps (image.StepRunner) under the
// build's egress policy: the request's, else the daemon's default.
type stepRunner struct {
	e      *Engine
	policy *egress.Policy
}

var _ image.StepRunner = stepRunner{}

// builderFor is the engine's image builder for one build: its progress,
// the network policy of its build VMs (nil: the daemon's default), how it
// reaches its registry, and whose step cache it uses.
func (e *Engine) builderFor(o BuildOptions) *image.Builder {
	b := *e.builder
	b.Progress = o.Progress
	b.Steps = stepRunner{e: e, policy: o.Network}
	b.Registry, b.Tenant = o.Registry, o.Tenant
	return &b
}

// checkBuildNetwork checks a build's network policy before the build.
func (e *Engine) checkBuildNetwork(p *egress.Policy) error {
	if p == nil {
		return nil
	}
	if _, _, err := e.net.resolve(p, nil); err != nil {
		return fmt.Errorf("build network: %w", err)
	}
	return nil
}

// RunStep runs one Run step of an image build: it boots a build VM from
// the image of the steps before, in its own network namespace linked
// under the build's policy, runs the command (its output, line by line,
// goes to spec.Output), and streams the guest's changes (its overlay's
// upper directory) into w. The VM and its network are gone when it
// returns.
func (r stepRunner) RunStep(ctx context.Context, spec image.StepSpec, w *ociimage.LayerWriter) error {
	e := r.e
	id := "bld-" + snapshot.NewID()
	var cl cleanup.Stack
	defer cl.Clean(context.WithoutCancel(ctx))
	runDir := filepath.Join(e.cfg.RunDir, "vms", id)
	cl.Push(removeAllStep(runDir))
	policy, compiled, err := e.net.resolve(r.policy, nil)
	if err != nil {
		return fmt.Errorf("build network: %w", err)
	}
	ns, err := netns.Create(ctx, e.cfg.NetNSPrefix+id, netns.Options{})
	if err != nil {
		return fmt.Errorf("build VM network namespace: %w", err)
	}
	cl.Push(func(context.Context) error { return ns.Remove() })
	sn := newSandboxNet(id, ns)
	if err := e.net.apply(sn, policy, compiled); err != nil {
		return fmt.Errorf("build VM network: %w", err)
	}
	cl.Push(func(context.Context) error { return e.net.release(sn) })
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
	sess, _, err := e.greetAgent(bctx, conn, id)
	if err != nil {
		return fmt.Errorf("build VM agent did not answer within %s: %w\nconsole:\n%s", bootTimeout, err, m.ConsoleTail(consoleTailBytes))
	}
	cl.Push(func(context.Context) error { return sess.Close() })
	agent := e.agentClient(sess)

	tail := tailbuf.New(4096)
	lines := newLineWriter(spec.Output, maxStepOutputLines)
	out := io.MultiWriter(tail, lines)
	s := spec.Step
	xctx, cancel := context.WithTimeout(ctx, stepTimeout+30*time.Second)
	defer cancel()
	ev, err := agent.Exec(xctx, agentapi.ExecRequest{
		Argv: s.Argv, Shell: s.Shell, Env: spec.Env, Cwd: spec.Workdir, User: spec.User,
		TimeoutMillis: stepTimeout.Milliseconds(),
	}, nil, out, out)
	lines.Flush()
	switch {
	case err != nil:
		return fmt.Errorf("run %q: %w", firstLine(s.Shell+fmt.Sprint(s.Argv)), err)
	case ev.TimedOut:
		return fmt.Errorf("still running after %s: %w\n%s", stepTimeout, errdefs.ErrInvalidArgument, tail)
	case ev.ExitCode != 0:
		return fmt.Errorf("the command exited with %d%s: %w\n%s", ev.ExitCode, networkHint(policy), errdefs.ErrInvalidArgument, tail)
	}
	if _, err := agent.Changes(ctx, w, spec.MaxLayerBytes); err != nil {
		return fmt.Errorf("reading the step's changes: %w", err)
	}
	return nil
}

// networkHint is what a failed step's error adds when its build VM had
// no network: a download in it could not have worked.
func networkHint(p egress.Policy) string {
	if p.Mode != egress.ModeNone {
		return ""
	}
	return " (its build VM had no network: the build's policy is none; give the build one, e.g. --build-network public, or build_network in the API)"
}
