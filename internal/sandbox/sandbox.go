package sandbox

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/agentconn"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/cleanup"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// consoleTailBytes is how much of a dead VM's console is kept for the user.
const consoleTailBytes = 2048

// Sandbox is one running (or dead) child VM with its agent session.
type Sandbox struct {
	ID          string
	Tag         string
	SnapshotID  string
	Created     time.Time
	ReadyMillis float64
	// Phases splits ReadyMillis (zero: a phase the child did not go
	// through on its fork's path).
	Phases ReadyPhases
	Pooled bool
	// Rehearsed: the child was restored ahead in the pool and its first
	// request rehearsed there (ahead.go).
	Rehearsed bool
	GuestIP   string
	// Tenant is the tenant the sandbox was forked for (ForkOptions.Tenant;
	// empty for one recorded before tenants existed). Set once.
	Tenant string
	// CPUMillicores is the CPU the fork asked for (ForkOptions); 0: the
	// VMM's default.
	CPUMillicores int64
	// pageServed: see prepared.pageServed.
	pageServed bool

	// base is the manifest of the snapshot the sandbox was forked from,
	// kept for full and live branches, which need no more of it and must
	// work after its tag is removed or replaced; nil for a sandbox adopted
	// from a record that predates it.
	base *snapshot.Manifest

	machine vmm.Machine // nil for a dead sandbox recorded by an earlier daemon
	pid     int
	netns   string
	net     *sbNet // nil for a dead sandbox recorded by an earlier daemon
	conn    net.Conn
	session *agentconn.Session
	agent   *agentclient.Client
	// teardown releases the netns, run dir and agent connection.
	teardown []func(context.Context) error
	// recMu serializes the writes of the sandbox's record (persist,
	// unpersist, commitFork): each reads what to write and writes it in
	// one step, so the store ends with the sandbox's latest state (a
	// killed sandbox's record stays removed). Taken before mu, never
	// while holding it.
	recMu sync.Mutex

	labels     map[string]string
	lastActive atomic.Int64 // unix nanoseconds of the last agent request

	// mu guards the fields below.
	mu sync.Mutex
	// expiresAt and idleTimeout are the lifetime (SetLifetime changes
	// them): zero, no absolute or idle timeout.
	expiresAt   time.Time
	idleTimeout time.Duration
	state       string
	deadReason  string
	// endedAt is when the sandbox was found dead (zero while running).
	endedAt     time.Time
	consoleTail string
	killed      bool
	exited      chan struct{} // closed after teardown ran
	// pendingFork is the id of the fork request that created the
	// sandbox until that fork answers (see state.SandboxRecord.PendingFork).
	pendingFork string
	// inflight counts requests being served (Acquire to release): the
	// idle timeout never ends a sandbox in the middle of one.
	inflight int
	// ending is why the janitor is ending the sandbox; once set, no new
	// request is let in.
	ending string
}

// newSandboxID returns "sb-" and 10 random base-32 characters: short enough
// to type, long enough to never collide on one host.
func newSandboxID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	for i := range b {
		b[i] = alphabet[b[i]%32]
	}
	return "sb-" + string(b[:])
}

// State returns the sandbox state as the API reports it
// (apiv1.StateRunning, ...).
func (s *Sandbox) State() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.apiStateLocked()
}

// apiStateLocked is the state for the API: a running child of a fork that
// has not answered is starting.
func (s *Sandbox) apiStateLocked() string {
	if s.state == apiv1.StateRunning && s.pendingFork != "" {
		return apiv1.StateStarting
	}
	return s.state
}

// Info renders the sandbox for the API.
func (s *Sandbox) Info() apiv1.Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return apiv1.Sandbox{
		ID: s.ID, Tag: s.Tag, State: s.apiStateLocked(), Created: s.Created,
		ReadyMillis: s.ReadyMillis, Pooled: s.Pooled, Rehearsed: s.Rehearsed, PID: s.pid,
		NetNS: s.netns, GuestIP: s.GuestIP,
		DeadReason: s.deadReason, ConsoleTail: s.consoleTail,
		Metadata: s.labels, IdleTimeoutSeconds: int64(s.idleTimeout / time.Second),
		LastActivity: s.LastActivity().UTC(), ExpiresAt: utcOrNil(s.expiresAt), EndedAt: utcOrNil(s.endedAt),
		Network: s.NetworkInfo(false), Tenant: s.Tenant, CPUs: float64(s.CPUMillicores) / 1000,
	}
}

// utcOrNil is t in UTC for the API, nil when zero (never, not yet).
func utcOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// PID of the sandbox's VMM process.
func (s *Sandbox) PID() int { return s.pid }

// watch waits for the VMM to exit and records why. A VMM that exits without
// a kill request makes the sandbox dead, with the tail of its console.
func (s *Sandbox) watch(e *Engine) {
	<-s.machine.Done()
	tail := s.machine.ConsoleTail(consoleTailBytes)
	s.mu.Lock()
	if s.killed {
		s.state = apiv1.StateStopped
	} else {
		s.state = apiv1.StateDead
		s.endedAt = time.Now().UTC()
		reason := "VMM process exited"
		if err := s.machine.ExitError(); err != nil {
			reason = err.Error()
		}
		s.deadReason = reason
		s.consoleTail = tail
		e.cfg.Metrics.ObserveSandboxEvent(metrics.SandboxDied)
		e.log.Warn("sandbox died", "sandbox_id", s.ID, "reason", reason)
		defer e.emit(Event{Kind: EventDied, SandboxID: s.ID, Tag: s.Tag, Tenant: s.Tenant, Reason: reason})
	}
	s.mu.Unlock()
	if s.session != nil {
		s.session.Close()
	}
	cleanup.Run(context.Background(), s.teardown)
	if s.State() == apiv1.StateStopped {
		e.unpersist(s)
		e.forget(s.ID)
	} else if err := e.persist(s); err != nil {
		e.log.Error("recording dead sandbox", "sandbox_id", s.ID, "err", err)
	}
	close(s.exited)
}

// goneWait bounds how long goneReason waits for the VMM's exit to be
// seen: an agent connection cut by a dying VMM can be noticed a moment
// before the process is reaped.
const goneWait = 100 * time.Millisecond

// goneReason says why the sandbox's agent can no longer answer (the
// agent client's Gone): killed, being ended by a timeout, or its VMM
// exited; nil while it runs. The class stays Unavailable, a lost
// connection's: clients (the SDKs) take it for a cut stream.
func (s *Sandbox) goneReason() error {
	select {
	case <-s.machine.Done():
	case <-time.After(goneWait):
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.ending != "": // the janitor's kill: its reason says more
		return fmt.Errorf("sandbox %s was ended (%s) while the call ran: %w", s.ID, s.ending, errdefs.ErrUnavailable)
	case s.killed:
		return fmt.Errorf("sandbox %s was killed while the call ran: %w", s.ID, errdefs.ErrUnavailable)
	}
	select {
	case <-s.machine.Done():
		reason := "its VMM process exited"
		if err := s.machine.ExitError(); err != nil {
			// The first line: the console tail after it is in `forkd sandbox info`.
			first, _, _ := strings.Cut(err.Error(), "\n")
			reason = "its VMM process exited: " + first
		}
		return fmt.Errorf("sandbox %s died while the call ran (%s; `forkd sandbox info %s` has its console): %w", s.ID, reason, s.ID, errdefs.ErrUnavailable)
	default:
		return nil
	}
}

// kill stops the VMM and waits for teardown.
func (s *Sandbox) kill(ctx context.Context, why string) {
	s.mu.Lock()
	already := s.state != apiv1.StateRunning
	s.killed = true
	s.mu.Unlock()
	if !already && s.machine != nil {
		s.machine.Kill()
	}
	select {
	case <-s.exited:
	case <-ctx.Done():
	}
}

// client returns the agent client of a running sandbox.
func (s *Sandbox) client() (*agentclient.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clientLocked()
}

func (s *Sandbox) clientLocked() (*agentclient.Client, error) {
	if s.ending != "" {
		return nil, fmt.Errorf("sandbox %s is ending (%s): %w", s.ID, s.ending, errdefs.ErrFailedPrecondition)
	}
	if s.state != apiv1.StateRunning {
		reason := s.deadReason
		if reason == "" {
			reason = s.state
		}
		return nil, fmt.Errorf("sandbox %s is %s (%s): %w", s.ID, s.state, reason, errdefs.ErrFailedPrecondition)
	}
	return s.agent, nil
}

func (e *Engine) register(s *Sandbox) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("engine is shutting down: %w", errdefs.ErrUnavailable)
	}
	e.sandboxes[s.ID] = s
	return nil
}

func (e *Engine) forget(id string) {
	e.mu.Lock()
	delete(e.sandboxes, id)
	e.mu.Unlock()
}

// Get returns a sandbox by id.
func (e *Engine) Get(id string) (*Sandbox, error) {
	e.mu.Lock()
	s := e.sandboxes[id]
	e.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("no sandbox %q (list them with `forkd ls`): %w", id, errdefs.ErrNotFound)
	}
	return s, nil
}

// List returns sandboxes sorted by creation time.
func (e *Engine) List() []*Sandbox {
	e.mu.Lock()
	out := make([]*Sandbox, 0, len(e.sandboxes))
	for _, s := range e.sandboxes {
		out = append(out, s)
	}
	e.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Created.Equal(out[j].Created) {
			return out[i].ID < out[j].ID
		}
		return out[i].Created.Before(out[j].Created)
	})
	return out
}

// Kill stops sandboxes by id and forgets them; a dead sandbox's record is
// removed. Unknown ids are reported after the known ones are killed.
func (e *Engine) Kill(ctx context.Context, ids []string) ([]string, error) {
	return e.end(ctx, ids, metrics.SandboxKilled)
}

// end stops sandboxes by id and forgets them, counting each running one
// under event (a lifecycle counter; "": not counted, as the children of a
// fork that failed, counted as failed).
func (e *Engine) end(ctx context.Context, ids []string, event string) ([]string, error) {
	var killed, unknown []string
	var wg sync.WaitGroup
	for _, id := range ids {
		s, err := e.Get(id)
		if err != nil {
			unknown = append(unknown, id)
			continue
		}
		killed = append(killed, id)
		counted := event != "" && s.State() != apiv1.StateDead
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.kill(ctx, "killed on request")
			e.unpersist(s)
			e.forget(s.ID)
			if counted {
				e.cfg.Metrics.ObserveSandboxEvent(event)
			}
			if counted && event == metrics.SandboxKilled {
				e.emit(Event{Kind: EventKilled, SandboxID: s.ID, Tag: s.Tag, Tenant: s.Tenant})
			}
		}()
	}
	wg.Wait()
	if len(unknown) > 0 {
		return killed, fmt.Errorf("no sandbox %s (list them with `forkd ls`): %w", strings.Join(unknown, ", "), errdefs.ErrNotFound)
	}
	return killed, nil
}

// KillAll stops every sandbox.
func (e *Engine) KillAll(ctx context.Context) []string {
	var ids []string
	for _, s := range e.List() {
		ids = append(ids, s.ID)
	}
	killed, _ := e.Kill(ctx, ids)
	return killed
}

func removeAllStep(path string) func(context.Context) error {
	return func(context.Context) error { return os.RemoveAll(path) }
}

// Agent returns the agent client of a running sandbox, for exec, files and
// run_code. A dead sandbox is a FailedPrecondition naming why it died.
// It records activity once, now; a request that may outlast the idle
// timeout uses Acquire or AgentFor, which keep the sandbox busy until it
// ends.
func (e *Engine) Agent(id string) (*agentclient.Client, error) {
	s, err := e.Get(id)
	if err != nil {
		return nil, err
	}
	s.touch()
	return s.client()
}

// Acquire returns the agent client of a running sandbox for one request,
// and release, which ends the request: until then the sandbox counts as
// busy and its idle timeout does not run (a 10-minute exec under a
// 5-minute idle timeout finishes). Activity is recorded at both ends, so
// the idle time counts from the end of the last request. release may be
// called more than once; only the first call counts. The absolute timeout
// (ForkOptions.Timeout) still ends a busy sandbox.
func (e *Engine) Acquire(id string) (_ *agentclient.Client, release func(), err error) {
	s, err := e.Get(id)
	if err != nil {
		return nil, nil, err
	}
	return s.acquire()
}

// acquire is Acquire on a sandbox in hand (a branch holds its source
// busy the same way).
func (s *Sandbox) acquire() (_ *agentclient.Client, release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	agent, err := s.clientLocked()
	if err != nil {
		return nil, nil, err
	}
	s.inflight++
	s.touch()
	var once sync.Once
	return agent, func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.touch()
			s.inflight--
		})
	}, nil
}

// AgentFor is Acquire for a request whose context ends with it (an HTTP
// handler's does when the handler returns, or when its client goes away):
// the request is released when ctx ends.
func (e *Engine) AgentFor(ctx context.Context, id string) (*agentclient.Client, error) {
	agent, release, err := e.Acquire(id)
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, release)
	return agent, nil
}
