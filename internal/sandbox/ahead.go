package sandbox

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentconn"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
)

// Restore ahead: a pooled VMM is not only started but restored, its agent
// session opened and its first request rehearsed (a snapshot with a Python
// session: its rehearse code in a throwaway copy of the session; one
// without: an exec of `true`), all in the background at pool priority. A fork that
// takes it only gives it its identity: a fresh clock, fresh entropy for
// the kernel's and Python's generators (the Python reseed runs before the
// next request), the sandbox's hostname. Under emulation (TCG) the
// rehearsal is what counts: each VMM process translates the guest code it
// runs for itself, and a child's first request used to pay for the
// interpreter, pandas and the agent's request path (issue #20).
//
// Nothing a user can observe has run in a pooled child: the rehearsal
// runs in a throwaway copy of the session (agentapi.RehearseRequest), and
// the identity the pool gave it is replaced at hand-out. What differs
// from a child restored on the fork's path: its uptime counts its time in
// the pool; the guest's pid counter has moved past the rehearsal's copy,
// whose CPU the session's child-process times include; processes a
// branch snapshot left running have run on; its egress counters include
// the pool wait; and Rehearsed and Phases are not kept across a daemon
// restart. A fork that asks for another network policy than the pooled
// one does not take a child restored ahead (it has run under the pooled
// policy).

// defaultRehearsal is rehearsed when the snapshot names no code: it still
// runs the whole request path (agent, runner, compile, display bundle).
const defaultRehearsal = "1"

// rehearseTimeout bounds a rehearsal; past it the copy is interrupted and
// the child is pooled unrehearsed.
const rehearseTimeout = 30 * time.Second

// handOutTimeout bounds the identity call that hands out a child restored
// ahead; one that does not answer in time is discarded and the fork
// restores another VMM.
const handOutTimeout = 10 * time.Second

// restoreAhead restores a prepared VMM, opens its agent session under a
// pool identity and rehearses its first request. On error the caller
// discards pv. A rehearsal whose code fails, or an agent too old to
// rehearse, leaves the child pooled as it is, restored.
func (e *Engine) restoreAhead(ctx context.Context, pv *prepared) error {
	rctx, cancel := context.WithTimeout(ctx, e.cfg.ReadyTimeout)
	defer cancel()
	start := time.Now()
	if _, err := pv.machine.Restore(rctx); err != nil {
		return fmt.Errorf("sandbox %s: restore ahead: %w (console: %s)", pv.id, err, pv.machine.ConsoleTail(512))
	}
	e.cfg.Metrics.ObserveVMMStart(metrics.PhaseRestore, time.Since(start))
	if err := e.dialAgent(rctx, pv); err != nil {
		return err
	}
	sess, _, err := e.greetAgent(rctx, pv.conn, pv.id)
	if err != nil {
		return fmt.Errorf("sandbox %s: agent did not answer: %w (console: %s)", pv.id, err, pv.machine.ConsoleTail(512))
	}
	pv.session = sess
	if !pv.snap.Python.Enabled {
		return e.rehearseExec(ctx, pv)
	}
	code := pv.snap.Python.Rehearse
	if code == "" {
		code = defaultRehearsal
	}
	hctx, hcancel := context.WithTimeout(ctx, rehearseTimeout+30*time.Second)
	defer hcancel()
	err = e.agentClient(sess).Rehearse(hctx, agentapi.RehearseRequest{Code: code, TimeoutMillis: rehearseTimeout.Milliseconds()})
	switch {
	case err == nil:
		pv.rehearsed = true
	case errdefs.IsNotFound(err):
		e.log.Debug("pooled child not rehearsed: its agent predates rehearsals", "tag", pv.snap.Tag, "sandbox_id", pv.id)
	case errdefs.IsInvalidArgument(err) && hctx.Err() == nil && !isClosed(sess.Done()):
		// The rehearsal's code raised (or was stopped at its deadline):
		// the session is as it was, the child as good as one restored
		// on a fork's path.
		e.log.Warn("pooled child not rehearsed", "tag", pv.snap.Tag, "sandbox_id", pv.id, "err", err)
	default:
		// The session may be busy still, dead (killed for ignoring
		// interrupts), or gone: not a child to hand out.
		return fmt.Errorf("sandbox %s: rehearsal: %w", pv.id, err)
	}
	return nil
}

// isClosed reports whether ch is closed (without waiting).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// rehearseExec rehearses the first request of a child without a Python
// session, an exec: `true` runs once, through the agent's HTTP and exec
// paths (the hand-out's identity call is the child's first HTTP request
// otherwise, and pays for translating the agent's HTTP server). Nothing of
// it stays but the guest's pid counter. A guest without `true` is pooled
// as it is.
func (e *Engine) rehearseExec(ctx context.Context, pv *prepared) error {
	hctx, cancel := context.WithTimeout(ctx, rehearseTimeout)
	defer cancel()
	ev, err := e.agentClient(pv.session).Exec(hctx, agentapi.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard)
	switch {
	case err == nil && ev.ExitCode == 0:
		pv.rehearsed = true
	case hctx.Err() != nil || isClosed(pv.session.Done()) || isClosed(pv.machine.Done()):
		return fmt.Errorf("sandbox %s: rehearsal: %w", pv.id, err)
	default:
		e.log.Debug("pooled child not rehearsed", "tag", pv.snap.Tag, "sandbox_id", pv.id, "exit_code", ev.ExitCode, "err", err)
	}
	return nil
}

// handOut gives a child restored ahead its identity; it answers as a
// child restored now does once its agent has said READY.
func (e *Engine) handOut(ctx context.Context, pv *prepared) (*agentconn.Session, error) {
	if isClosed(pv.session.Done()) {
		return nil, fmt.Errorf("sandbox %s: the agent session of a pooled child ended: %w", pv.id, errdefs.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, handOutTimeout)
	defer cancel()
	info, err := e.agentClient(pv.session).SetIdentity(ctx, newIdentity(pv.id))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: identity: %w (console: %s)", pv.id, err, pv.machine.ConsoleTail(512))
	}
	if pv.snap.Python.Enabled && !info.Python {
		return nil, fmt.Errorf("sandbox %s: its Python session ended in the pool: %w", pv.id, errdefs.ErrUnavailable)
	}
	return pv.session, nil
}

// sessionDone is closed when the agent session of a child restored ahead
// ends; nil (never ready) for a VMM only started.
func (p *prepared) sessionDone() <-chan struct{} {
	if p.session == nil {
		return nil
	}
	return p.session.Done()
}

// ReadyPhases is where a child's fork-to-ready went, in milliseconds:
// starting its VMM (a child whose VMM was not pooled), restoring it and
// the agent's hello (a child not restored ahead), or handing out a child
// restored ahead (its identity call). NetworkMillis is the part of the
// fork's path spent linking the child's network (uplink, rules,
// resolver): within PrepareMillis for a child whose VMM was not pooled,
// or a policy change the fork asked of a pooled one; zero otherwise.
type ReadyPhases struct {
	PrepareMillis, RestoreMillis, HelloMillis, HandOutMillis float64
	NetworkMillis                                            float64
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
