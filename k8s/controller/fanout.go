package controller

import (
	"context"
	"sync"
	"time"
)

// fanOutWidth is how many nodes are asked at once.
const fanOutWidth = 16

// FanOut calls call(ctx, i) for every i in [0, n), fanOutWidth at a
// time, each under its own timeout (none when 0), and returns once all
// have returned: how the node view polls the daemons, FindSnapshot looks
// a tag up, and the gateway asks every node. A call waiting for a slot
// when ctx ends still runs, with ctx ended, so it records its failure.
func FanOut(ctx context.Context, n int, timeout time.Duration, call func(ctx context.Context, i int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, fanOutWidth)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			case <-ctx.Done():
			}
			cctx := ctx
			if timeout > 0 {
				var cancel context.CancelFunc
				cctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			call(cctx, i)
		}()
	}
	wg.Wait()
}
