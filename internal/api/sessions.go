package api

import (
	"fmt"
	"sync"

	"github.com/forkd-dev/forkd/internal/auth"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Bounds of exec WebSocket sessions: once upgraded, a connection leaves
// the listener's --max-connections count, and each session holds a
// socket, goroutines and an agent stream.
const (
	maxExecSessions       = 1024
	maxTenantExecSessions = 64
)

// sessionSlots counts long-lived sessions, daemon-wide and per non-admin
// tenant. The zero value is ready.
type sessionSlots struct {
	mu       sync.Mutex
	total    int
	byTenant map[string]int
}

// take reserves a slot for p, or fails with resource_exhausted (429)
// naming the bound; release gives it back (once).
func (s *sessionSlots) take(p auth.Principal, what string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.total >= maxExecSessions {
		return nil, fmt.Errorf("%d %s are open, the most the daemon serves; close one: %w", s.total, what, errdefs.ErrResourceExhausted)
	}
	tenant := ""
	if !p.Admin() {
		tenant = auth.TenantOf(p.Tenant)
		if n := s.byTenant[tenant]; n >= maxTenantExecSessions {
			return nil, fmt.Errorf("tenant %q has %d %s open, the most one tenant may; close one: %w", tenant, n, what, errdefs.ErrResourceExhausted)
		}
		if s.byTenant == nil {
			s.byTenant = map[string]int{}
		}
		s.byTenant[tenant]++
	}
	s.total++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.total--
			if tenant != "" {
				if s.byTenant[tenant]--; s.byTenant[tenant] == 0 {
					delete(s.byTenant, tenant)
				}
			}
		})
	}, nil
}
