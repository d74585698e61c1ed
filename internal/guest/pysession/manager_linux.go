package pysession

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Manager owns the sandbox's (at most one) Python session and gives its
// errors their errdefs classes.
type Manager struct {
	cfg     Config
	startMu sync.Mutex // serializes Start
	mu      sync.Mutex
	s       *Session
}

// NewManager returns a manager that starts sessions with cfg.
func NewManager(cfg Config) *Manager { return &Manager{cfg: cfg} }

// errNoSession answers run_code in a sandbox whose template started no
// session.
var errNoSession = fmt.Errorf("no Python session in this sandbox: the snapshot's recipe has no [python] section: %w", errdefs.ErrFailedPrecondition)

func (m *Manager) current() *Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.s
}

// Running reports whether a session is running.
func (m *Manager) Running() bool {
	s := m.current()
	return s != nil && s.Alive()
}

// Start starts the session and runs req.Warm in it. A session that is
// already running is an errdefs.ErrAlreadyExists; one that died is
// replaced.
func (m *Manager) Start(ctx context.Context, req agentapi.PythonStartRequest) (agentapi.PythonStartResponse, error) {
	m.startMu.Lock()
	defer m.startMu.Unlock()
	if s := m.current(); s != nil && s.Alive() {
		return agentapi.PythonStartResponse{}, fmt.Errorf("a Python session is already running (python %s, pid %d): %w", s.Version(), s.Pid(), errdefs.ErrAlreadyExists)
	}
	cfg := m.cfg
	if req.Python != "" {
		cfg.Python = req.Python
	}
	s, err := Start(ctx, cfg)
	if err != nil {
		return agentapi.PythonStartResponse{}, err
	}
	m.mu.Lock()
	m.s = s
	m.mu.Unlock()
	var resp agentapi.PythonStartResponse
	if req.Warm != "" {
		resp.Warm, err = m.Run(ctx, agentapi.RunCodeRequest{Code: req.Warm, TimeoutMillis: req.TimeoutMillis})
		if err != nil {
			return resp, fmt.Errorf("warming the Python session: %w", err)
		}
	}
	return resp, nil
}

// Run runs code in the session.
func (m *Manager) Run(ctx context.Context, req agentapi.RunCodeRequest) (agentapi.RunCodeResult, error) {
	s := m.current()
	if s == nil {
		return agentapi.RunCodeResult{}, errNoSession
	}
	res, err := s.Run(ctx, req.Code, time.Duration(req.TimeoutMillis)*time.Millisecond)
	return res, m.classify(s, err)
}

// RunStream runs code in the session, handing its output to out as it
// appears (see Session.RunStream); started is called when the code is
// about to start.
func (m *Manager) RunStream(ctx context.Context, req agentapi.RunCodeRequest, started func(), out Output) (agentapi.RunCodeResult, error) {
	s := m.current()
	if s == nil {
		return agentapi.RunCodeResult{}, errNoSession
	}
	res, err := s.RunStream(ctx, req.Code, time.Duration(req.TimeoutMillis)*time.Millisecond, started, out)
	return res, m.classify(s, err)
}

// Rehearse runs code in a throwaway copy of the session (Session.Rehearse).
func (m *Manager) Rehearse(ctx context.Context, req agentapi.RehearseRequest) error {
	s := m.current()
	if s == nil {
		return errNoSession
	}
	return m.classify(s, s.Rehearse(ctx, req.Code, time.Duration(req.TimeoutMillis)*time.Millisecond))
}

// Reseed reseeds the session's generators; without a session it does
// nothing. A session that cannot be reseeded is killed: code must never run
// with the template's seed in a child.
func (m *Manager) Reseed(ctx context.Context, seed []byte) error {
	s := m.current()
	if s == nil || !s.Alive() {
		return nil
	}
	// Recorded now, sent in the background: the next run_code cannot
	// overtake it (see Session.SetSeed), and READY does not wait for it.
	s.SetSeed(seed)
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		s.ApplySeed(ctx) // on failure the session is killed and says why

	}()
	return nil
}

// Close kills the session, if any.
func (m *Manager) Close() {
	if s := m.current(); s != nil {
		s.Close()
	}
}

// classify gives err an errdefs class. A dead session stays current (so
// later calls keep reporting why it died) until Start replaces it.
func (m *Manager) classify(s *Session, err error) error {
	switch {
	case err == nil:
		return nil
	case errdefs.IsInvalidArgument(err):
		return err // the request's fault (a rehearsal's code raised)
	case errors.Is(err, ErrDead):
		return fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", err, errdefs.ErrDeadlineExceeded)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%w: %w", err, errdefs.ErrCanceled)
	}
	if !s.Alive() {
		return fmt.Errorf("%w: %w", s.DeadError(), errdefs.ErrFailedPrecondition)
	}
	return fmt.Errorf("%w: %w", err, errdefs.ErrInternal)
}
