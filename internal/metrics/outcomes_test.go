package metrics

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestForkRequestResults(t *testing.T) {
	m := New("dev")
	m.ObserveForkRequest(nil)
	m.ObserveForkRequest(nil)
	m.ObserveForkRequest(fmt.Errorf("snapshot %q: %w", "py", errdefs.ErrNotFound))
	m.ObserveForkRequest(fmt.Errorf("limit: %w", errdefs.ErrResourceExhausted))
	m.ObserveForkRequest(fmt.Errorf("fork of %q abandoned: %w", "py", context.Canceled))
	m.ObserveForkRequest(fmt.Errorf("restore: %w", context.DeadlineExceeded))
	m.ObserveForkRequest(errors.New("qemu exited"))
	wantLines(t, scrape(t, m),
		`forkd_fork_requests_total{result="ok"} 2`,
		`forkd_fork_requests_total{result="not_found"} 1`,
		`forkd_fork_requests_total{result="resource_exhausted"} 1`,
		`forkd_fork_requests_total{result="canceled"} 1`,
		`forkd_fork_requests_total{result="deadline_exceeded"} 1`,
		`forkd_fork_requests_total{result="internal"} 1`,
	)
}

// TestErrorClasses: a class wins over the context error it wraps, and an
// explicit internal error stays internal even if a context ended too.
func TestErrorClasses(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{errors.New("x"), "internal"},
		{fmt.Errorf("busy: %w", errdefs.ErrUnavailable), "unavailable"},
		{fmt.Errorf("%w: %w", errdefs.ErrUnavailable, context.Canceled), "unavailable"},
		{fmt.Errorf("%w: %w", errdefs.ErrInternal, context.Canceled), "internal"},
		{fmt.Errorf("wait: %w", context.Canceled), "canceled"},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), "deadline_exceeded"},
	} {
		if got := errorClass(tc.err); got != tc.want {
			t.Errorf("errorClass(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

func TestPoolRefillFailures(t *testing.T) {
	m := New("dev")
	m.ObservePoolRefillFailure(fmt.Errorf("guest memory: %w", errdefs.ErrResourceExhausted))
	m.ObservePoolRefillFailure(errors.New("start VMM: exit status 1"))
	m.ObservePoolRefillFailure(errors.New("start VMM: exit status 2"))
	wantLines(t, scrape(t, m),
		`forkd_pool_refill_failures_total{code="resource_exhausted"} 1`,
		`forkd_pool_refill_failures_total{code="internal"} 2`,
	)
	if n := testutil.CollectAndCount(m.poolRefillFailures); n != 2 {
		t.Errorf("%d refill failure series for 2 classes: error texts must not be labels", n)
	}
}

// TestPooledTagsAreBounded: the pool gauge shares the fork histogram's
// bound on tags; tags past it add up under "other".
func TestPooledTagsAreBounded(t *testing.T) {
	m := New("dev")
	pooled := map[string]int{}
	for i := range MaxTags + 20 {
		pooled[fmt.Sprintf("t%03d", i)] = 1
	}
	m.SetStateFunc(func() State { return State{PooledVMMs: pooled} })
	body := scrape(t, m)
	if n := testutil.CollectAndCount(stateCollector{m}, "forkd_pooled_vmms"); n != MaxTags+1 {
		t.Errorf("%d pooled series for %d tags, want %d", n, len(pooled), MaxTags+1)
	}
	wantLines(t, body, `forkd_pooled_vmms{tag="other"} 20`)
}
