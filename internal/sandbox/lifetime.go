package sandbox

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/egress"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
)

// ForkOptions say what to fork and how long the children may live.
type ForkOptions struct {
	Tag   string
	Count int
	// Timeout ends each sandbox this long after creation (0: never).
	Timeout time.Duration
	// IdleTimeout ends a sandbox that served no request for this long
	// (0: never). Requests are agent operations (exec, files, run_code)
	// and branches of the sandbox; one in progress (Acquire, a branch)
	// keeps the sandbox from being idle, and the idle time counts from
	// the end of the last one.
	IdleTimeout time.Duration
	// RequestID names the fork request (for logs and the state store; see
	// state.SandboxRecord.PendingFork). Empty: the engine makes one up.
	RequestID string
	// Labels are attached to every sandbox of the request.
	Labels map[string]string
	// Network is the children's egress policy; nil: the snapshot's, or
	// the daemon's default.
	Network *egress.Policy
	// Tenant owns the children (Sandbox.Tenant); Quota, if not zero,
	// bounds what that tenant's sandboxes hold with them (quota.go).
	Tenant string
	Quota  TenantQuota
	// CPUMillicores caps each child's VMM at this much CPU (1000 = one
	// CPU; 0: its default, one CPU per vCPU and half a CPU for the VMM),
	// between MinCPUMillicores and its snapshot's vCPUs.
	CPUMillicores int64
}

// MinCPUMillicores is the least CPU a fork may ask for.
const MinCPUMillicores = 100

// Limits on ForkOptions, stated in the errors that enforce them.
const (
	MaxTimeout   = 7 * 24 * time.Hour
	maxLabels    = 32
	maxLabelText = 256
)

var labelKeyRule = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]{0,62})$`)

func (o ForkOptions) validate(maxCount int) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf(format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	switch {
	case o.Count < 1:
		return bad("count %d: fork at least 1 sandbox", o.Count)
	case o.Count > maxCount:
		return bad("count %d is over the limit of %d per request (forkd serve --max-fork)", o.Count, maxCount)
	case o.Timeout < 0 || o.Timeout > MaxTimeout:
		return bad("timeout %s: must be between 0 (none) and %s", o.Timeout, MaxTimeout)
	case o.IdleTimeout < 0 || o.IdleTimeout > MaxTimeout:
		return bad("idle timeout %s: must be between 0 (none) and %s", o.IdleTimeout, MaxTimeout)
	case len(o.Labels) > maxLabels:
		return bad("%d metadata labels: at most %d", len(o.Labels), maxLabels)
	}
	for k, v := range o.Labels {
		if !labelKeyRule.MatchString(k) {
			return bad("metadata key %q: 1-63 lowercase letters, digits, '.', '_', '/' or '-', starting with a letter or digit", k)
		}
		if len(v) > maxLabelText {
			return bad("metadata value of %q is %d bytes: at most %d", k, len(v), maxLabelText)
		}
	}
	return nil
}

// touch records activity for the idle timeout.
func (s *Sandbox) touch() { s.lastActive.Store(time.Now().UnixNano()) }

// LastActivity is when the sandbox last served a request (or was created).
func (s *Sandbox) LastActivity() time.Time { return time.Unix(0, s.lastActive.Load()) }

// expiredLocked reports why the sandbox's lifetime is over, or "". A
// sandbox serving a request is not idle, however long the request runs.
// The caller holds s.mu.
func (s *Sandbox) expiredLocked(now time.Time) string {
	if !s.expiresAt.IsZero() && now.After(s.expiresAt) {
		return fmt.Sprintf("timeout: created %s ago, limit %s", now.Sub(s.Created).Round(time.Second), s.expiresAt.Sub(s.Created))
	}
	if s.idleTimeout > 0 && s.inflight == 0 {
		if idle := now.Sub(s.LastActivity()); idle > s.idleTimeout {
			return fmt.Sprintf("idle timeout: no request for %s, limit %s", idle.Round(time.Second), s.idleTimeout)
		}
	}
	return ""
}

// MatchLabels reports whether the sandbox carries every label in sel.
func (s *Sandbox) MatchLabels(sel map[string]string) bool {
	for k, v := range sel {
		if got, ok := s.labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// janitorInterval is how often lifetimes are checked: timeouts are
// enforced to within this.
const janitorInterval = time.Second

// janitor ends sandboxes whose absolute or idle timeout has passed,
// forgets the long dead and drains idle pools. The engine owns it; it
// stops with the engine.
func (e *Engine) janitor(ctx context.Context) {
	t := time.NewTicker(janitorInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			e.expireAt(ctx, now)
			e.forgetDeadAt(now)
			e.drainIdlePools(now)
			e.shrinkPools(now)
		}
	}
}

// expireAt ends the sandboxes whose lifetime is over at now.
func (e *Engine) expireAt(ctx context.Context, now time.Time) {
	for _, s := range e.List() {
		why := s.beginEnding(now)
		if why == "" {
			continue
		}
		e.log.Info("sandbox expired", "sandbox_id", s.ID, "reason", why)
		e.end(ctx, []string{s.ID}, metrics.SandboxExpired)
		e.emit(Event{Kind: EventExpired, SandboxID: s.ID, Tag: s.Tag, Tenant: s.Tenant, Reason: why})
	}
}

// beginEnding decides whether the sandbox's lifetime is over at now and,
// if it is, lets no new request in (Acquire refuses it), in one step under
// mu: a request cannot slip in between the decision and the kill. A
// sandbox whose fork has not answered yet is left to that fork.
func (s *Sandbox) beginEnding(now time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != apiv1.StateRunning || s.ending != "" || s.pendingFork != "" {
		return ""
	}
	why := s.expiredLocked(now)
	s.ending = why
	return why
}

// Lifetime is a change to a running sandbox's lifetime (SetLifetime): a
// nil field stays as it is.
type Lifetime struct {
	// Timeout ends the sandbox this long from now (0: never).
	Timeout *time.Duration
	// IdleTimeout is its new idle timeout (0: none).
	IdleTimeout *time.Duration
}

// SetLifetime extends or shortens a running sandbox's life, durably: the
// absolute timeout counts from now, as E2B's set_timeout. A sandbox that
// is ending (its timeout passed, or it is being killed) or dead cannot be
// given more life.
func (e *Engine) SetLifetime(id string, l Lifetime) (*Sandbox, error) {
	bad := func(what string, d time.Duration) error {
		return fmt.Errorf("%s %s: must be between 0 (none) and %s: %w", what, d, MaxTimeout, errdefs.ErrInvalidArgument)
	}
	if l.Timeout != nil && (*l.Timeout < 0 || *l.Timeout > MaxTimeout) {
		return nil, bad("timeout", *l.Timeout)
	}
	if l.IdleTimeout != nil && (*l.IdleTimeout < 0 || *l.IdleTimeout > MaxTimeout) {
		return nil, bad("idle timeout", *l.IdleTimeout)
	}
	s, err := e.Get(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	switch {
	case s.state != apiv1.StateRunning || s.killed:
		st := s.apiStateLocked()
		s.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s is %s: only a running sandbox's lifetime can change: %w", id, st, errdefs.ErrFailedPrecondition)
	case s.ending != "":
		why := s.ending
		s.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s is ending (%s): fork a new one: %w", id, why, errdefs.ErrFailedPrecondition)
	}
	if l.Timeout != nil {
		s.expiresAt = time.Time{}
		if *l.Timeout > 0 {
			s.expiresAt = time.Now().UTC().Add(*l.Timeout)
		}
	}
	if l.IdleTimeout != nil {
		s.idleTimeout = *l.IdleTimeout
	}
	s.mu.Unlock()
	if err := e.persist(s); err != nil {
		return nil, err
	}
	return s, nil
}

// forgetDeadAt forgets the dead sandboxes found dead more than the
// retention period before now, records included: a host whose sandboxes
// crash does not list them forever.
func (e *Engine) forgetDeadAt(now time.Time) {
	keep := e.cfg.DeadRetention
	if keep <= 0 {
		return
	}
	for _, s := range e.List() {
		s.mu.Lock()
		old := s.state == apiv1.StateDead && !s.endedAt.IsZero() && now.Sub(s.endedAt) > keep
		s.mu.Unlock()
		if !old {
			continue
		}
		<-s.exited // teardown ran (watch closes it after its last write)
		e.unpersist(s)
		e.forget(s.ID)
		e.log.Info("dead sandbox forgotten", "sandbox_id", s.ID, "retention", keep)
	}
}
