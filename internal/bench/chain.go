package bench

// forkd bench chain: fork-to-ready from the head of a chain of diff
// layers against a flat snapshot of the same memory.

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/progress"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// ChainOptions are bench chain's flags.
type ChainOptions struct {
	// Memory is the guest memory in MiB (one size).
	Memory string
	// Depth is the layers in the chain.
	Depth int
	// DirtyMB is the fresh memory each layer's sandbox writes.
	DirtyMB int
	// Forks are the forks from each of flat and head.
	Forks int
}

// Chain runs bench chain: a flat snapshot of the minimal recipe, then a
// chain of o.Depth diff layers, each a branch of a child of the previous
// one after it wrote o.DirtyMB of fresh memory; the head compacted into a
// flat snapshot of the same memory; forks alternately from that and from
// the head.
func Chain(ctx context.Context, c Config, o ChainOptions) error {
	sizes, err := parseSizes(o.Memory)
	if err != nil || len(sizes) != 1 {
		return fmt.Errorf("--memory: one size in MiB: %w", errdefs.ErrInvalidArgument)
	}
	if o.Depth < 1 || o.Depth > snapshot.MaxChainDepth {
		return fmt.Errorf("--depth %d: 1 to %d: %w", o.Depth, snapshot.MaxChainDepth, errdefs.ErrInvalidArgument)
	}
	env, err := newEnv(c, "chain", nil)
	if err != nil {
		return err
	}
	defer env.close()
	e := env.e
	flat, err := env.ensureSized(ctx, fmt.Sprintf("bench-branch-%d", sizes[0]), sizes[0])
	if err != nil {
		return err
	}
	rep := newReport(ctx, e, "chain", "")
	id := snapshot.NewID()
	var tags []string
	defer func() {
		for i := len(tags) - 1; i >= 0; i-- {
			e.RemoveSnapshotWith(context.Background(), tags[i], sandbox.RemoveOptions{Force: true})
		}
	}()
	from := flat.Tag
	var layerRows []reportRow
	for i := 1; i <= o.Depth; i++ {
		sbs, err := e.Fork(ctx, from, 1)
		if err != nil {
			return err
		}
		if err := writeFresh(ctx, e, sbs[0].ID, fmt.Sprintf("layer%d", i), o.DirtyMB); err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
		tag := fmt.Sprintf("bench-chain-%s-l%d", id, i)
		res, err := e.Branch(ctx, sbs[0].ID, sandbox.BranchOptions{Tag: tag})
		if err != nil {
			return err
		}
		tags = append(tags, tag)
		e.Kill(ctx, []string{sbs[0].ID})
		var st syscall.Stat_t
		syscall.Stat(res.Snapshot.Path(snapshot.MemoryFile), &st)
		lr := reportRow{
			Measure: fmt.Sprintf("layer %d", i),
			Value:   fmt.Sprintf("paused %.1f ms, %s written, %s on disk", millis(res.Paused), progress.HumanBytes(res.BytesWritten), progress.HumanBytes(st.Blocks*512)),
			Values:  vals{"paused_ms": millis(res.Paused), "written_bytes": float64(res.BytesWritten), "disk_bytes": float64(st.Blocks * 512)},
		}
		layerRows = append(layerRows, lr)
		env.say("layer %d: %s", i, lr.Value)
		from = tag
	}
	head := from
	// The first fork from the head assembles its memory image.
	start := time.Now()
	sbs, err := e.Fork(ctx, head, 1)
	if err != nil {
		return err
	}
	first := time.Since(start)
	e.Kill(ctx, []string{sbs[0].ID})
	// The fair baseline is a flat snapshot of the same memory: the head
	// compacted (forks from the recipe's base would restore less memory).
	compactTag := fmt.Sprintf("bench-chain-%s-flat", id)
	tc := time.Now()
	flatSnap, err := e.Compact(ctx, head, compactTag)
	if err != nil {
		return err
	}
	compactTook := time.Since(tc)
	tags = append([]string{compactTag}, tags...)
	e.Warm(compactTag)
	headSnap, _ := e.Store().Get(head)
	var flatT, headT []float64
	for i := 0; i < o.Forks; i++ {
		for _, s := range []*snapshot.Snapshot{flatSnap, headSnap} {
			env.waitPool(s.ID, c.PoolSize, poolWait)
			sbs, err := e.Fork(ctx, s.Tag, 1)
			if err != nil {
				return err
			}
			if s == flatSnap {
				flatT = append(flatT, sbs[0].ReadyMillis)
			} else {
				headT = append(headT, sbs[0].ReadyMillis)
			}
			e.Kill(ctx, []string{sbs[0].ID})
		}
	}
	f50, h50 := percentile(flatT, 0.5), percentile(headT, 0.5)
	env.say("fork-to-ready p50: flat %.1f ms, head %.1f ms (%.2f×)", f50, h50, h50/f50)
	rep.Intro = fmt.Sprintf("Minimal recipe, %d MiB guest; chain of %d diff layers, each sandbox writing %d MB of fresh memory before its branch; pool %d; %d forks from each, alternating.",
		sizes[0], o.Depth, o.DirtyMB, c.PoolSize, o.Forks)
	rep.Rows = append(rep.Rows, layerRows...)
	rep.row("first fork from the head (assembles its memory once)", fmt.Sprintf("%.0f ms", millis(first)), vals{"ms": millis(first)})
	rep.row("compact the head into a flat snapshot", fmt.Sprintf("%.1f s", compactTook.Seconds()), vals{"s": compactTook.Seconds()})
	rep.row("fork-to-ready p50, the same memory as a flat snapshot (compacted)", fmt.Sprintf("%.1f ms", f50), vals{"p50_ms": f50})
	rep.row(fmt.Sprintf("fork-to-ready p50, head of depth %d", o.Depth), fmt.Sprintf("%.1f ms", h50), vals{"p50_ms": h50, "depth": float64(o.Depth)})
	rep.row("head / flat", fmt.Sprintf("%.2f×", h50/f50), vals{"ratio": h50 / f50})
	return c.write(rep)
}
