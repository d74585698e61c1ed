package sandbox

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// ForkOptions say what to fork and how long the children may live.
type ForkOptions struct {
	Tag   string
	Count int
	// Timeout ends each sandbox this long after creation (0: never).
	Timeout time.Duration
	// IdleTimeout ends a sandbox that received no request for this long
	// (0: never). Requests are agent operations: exec, files, run_code.
	IdleTimeout time.Duration
	// Labels are attached to every sandbox of the request.
	Labels map[string]string
}

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

// expired reports why the sandbox's lifetime is over, or "".
func (s *Sandbox) expired(now time.Time) string {
	if !s.expiresAt.IsZero() && now.After(s.expiresAt) {
		return fmt.Sprintf("timeout: created %s ago, limit %s", now.Sub(s.Created).Round(time.Second), s.expiresAt.Sub(s.Created))
	}
	if s.idleTimeout > 0 {
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

// janitor ends sandboxes whose absolute or idle timeout has passed. The
// engine owns it; it stops with the engine.
func (e *Engine) janitor(ctx context.Context) {
	t := time.NewTicker(janitorInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, s := range e.List() {
				if s.State() != "running" {
					continue
				}
				if why := s.expired(now); why != "" {
					e.log.Info("sandbox expired", "sandbox_id", s.ID, "reason", why)
					e.Kill(ctx, []string{s.ID})
					if e.cfg.OnEvent != nil {
						e.cfg.OnEvent(Event{Kind: EventExpired, SandboxID: s.ID, Reason: why})
					}
				}
			}
		}
	}
}

// Event is a lifecycle event the engine reports (for the audit log and
// metrics): a sandbox died on its own or expired.
type Event struct {
	Kind      string
	SandboxID string
	Reason    string
}

// Event kinds.
const (
	EventDied    = "sandbox.died"
	EventExpired = "sandbox.expired"
)
