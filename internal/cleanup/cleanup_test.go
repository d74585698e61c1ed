package cleanup

import (
	"context"
	"errors"
	"reflect"
	"testing"
)

func TestCleanRunsInReverseOnceDetached(t *testing.T) {
	var s Stack
	var order []int
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; i < 3; i++ {
		s.Push(func(c context.Context) error {
			if c.Err() != nil {
				t.Errorf("step %d ran with a canceled context", i)
			}
			order = append(order, i)
			if i == 1 {
				return errors.New("boom")
			}
			return nil
		})
	}
	if err := s.Clean(ctx); err == nil || err.Error() != "boom" {
		t.Fatalf("Clean error = %v, want boom", err)
	}
	if !reflect.DeepEqual(order, []int{2, 1, 0}) {
		t.Fatalf("order = %v", order)
	}
	s.Clean(ctx)
	if len(order) != 3 {
		t.Fatal("Clean ran twice")
	}
}

func TestReleaseDisarms(t *testing.T) {
	var s Stack
	ran := false
	s.Push(func(context.Context) error { ran = true; return nil })
	steps := s.Release()
	s.Clean(context.Background())
	if ran || len(steps) != 1 {
		t.Fatalf("ran=%v steps=%d", ran, len(steps))
	}
}
