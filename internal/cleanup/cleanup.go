// Package cleanup runs teardown steps in reverse order, once, and survives
// the cancellation of the context that created the resources.
//
// Constructors use it the gVisor way: make a Stack right after acquiring the
// first resource, defer Clean, push a step per resource, and Release on
// success so the caller takes ownership.
package cleanup

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Timeout bounds one Clean call; teardown must not hang a request forever.
const Timeout = 10 * time.Second

// Stack is a LIFO list of teardown steps. The zero value is ready to use.
type Stack struct {
	mu       sync.Mutex
	steps    []func(context.Context) error
	released bool
}

// Push adds a step to run on Clean.
func (s *Stack) Push(step func(context.Context) error) {
	s.mu.Lock()
	s.steps = append(s.steps, step)
	s.mu.Unlock()
}

// Release disarms the stack: Clean becomes a no-op. Returns the steps so a
// new owner can run them later.
func (s *Stack) Release() []func(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = true
	steps := s.steps
	s.steps = nil
	return steps
}

// Clean runs the steps in reverse order under a context that ignores the
// caller's cancellation, and joins their errors. It runs at most once.
func (s *Stack) Clean(ctx context.Context) error {
	s.mu.Lock()
	if s.released {
		s.mu.Unlock()
		return nil
	}
	s.released = true
	steps := s.steps
	s.steps = nil
	s.mu.Unlock()
	return Run(ctx, steps)
}

// Run runs steps in reverse order, detached from ctx's cancellation.
func Run(ctx context.Context, steps []func(context.Context) error) error {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Timeout)
	defer cancel()
	var errs []error
	for i := len(steps) - 1; i >= 0; i-- {
		if err := steps[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
