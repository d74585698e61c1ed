package bench

// What the benchmarks set up before they measure: the snapshot they fork,
// a full pool before each measure, guest memory a sandbox wrote.

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// ensureSnapshot returns the snapshot a benchmark forks, creating it from
// recipe when the tag does not exist yet, its pool filling.
func (b *runEnv) ensureSnapshot(ctx context.Context, tag, recipe string) (*snapshot.Snapshot, error) {
	snap, err := b.e.Store().Get(tag)
	if errdefs.IsNotFound(err) {
		// Creating a snapshot starts filling its pool.
		b.say("creating snapshot %s from recipe %s", tag, recipe)
		return b.e.CreateSnapshot(ctx, sandbox.CreateSnapshotOptions{Tag: tag, Recipe: recipe, Progress: func(m string) { b.say("  %s", m) }})
	}
	if err != nil {
		return nil, err
	}
	// An existing snapshot's pool is started here, as a daemon keeps one
	// between requests: else nothing fills it before the first fork, and
	// the first measure waits out poolWait and forks from an empty pool.
	if err := b.e.Warm(tag); err != nil {
		return nil, err
	}
	return snap, nil
}

// ensureSized returns the minimal snapshot with mib of guest memory,
// creating it when missing.
func (b *runEnv) ensureSized(ctx context.Context, tag string, mib int) (*snapshot.Snapshot, error) {
	snap, err := b.e.Store().Get(tag)
	if errdefs.IsNotFound(err) {
		b.say("creating snapshot %s (minimal, %d MiB)", tag, mib)
		snap, err = b.e.CreateSnapshot(ctx, sandbox.CreateSnapshotOptions{Tag: tag, Recipe: "minimal", MemoryMiB: mib})
	}
	return snap, err
}

// poolWait is how long a measure waits for a full pool unless its
// benchmark has a flag for it (first-answer's --pool-wait).
const poolWait = 2 * time.Minute

// pools is what waitPool needs of an engine.
type pools interface {
	// PoolSize is how many VMMs the snapshot's pool holds ready.
	PoolSize(snapshotID string) int
	// PoolTarget is how many it keeps: its base size, or more after a
	// fan-out grew it.
	PoolTarget(snapshotID string) int
}

// waitPool waits (bounded) until the snapshot's pool is full again, so each
// measured fork sees the steady state of a daemon between requests.
func (b *runEnv) waitPool(snapID string, size int, limit time.Duration) {
	waitPool(b.e, snapID, size, limit, b.say)
}

// waitPool waits, up to limit, until the snapshot's pool holds at least
// size VMMs ready to hand out, and its target: a fan-out before may have
// raised the target past the base size, and the refill restoring toward it
// would otherwise run under the next measurement. A pool still short
// after limit is measured anyway, and say notes it beside the rows.
func waitPool(p pools, snapID string, size int, limit time.Duration, say sayFunc) {
	want := max(size, p.PoolTarget(snapID))
	deadline := time.Now().Add(limit)
	for p.PoolSize(snapID) < want && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := p.PoolSize(snapID); n < want {
		say("the pool held %d of %d VMMs after waiting %s: this measure starts from a partial pool", n, want, limit)
	}
}

// writeFresh has sandbox id write mb MB of random data to a file in its
// /tmp (a tmpfs: guest memory the sandbox wrote, so pages a branch copies).
func writeFresh(ctx context.Context, e *sandbox.Engine, id, name string, mb int) error {
	a, err := e.Agent(id)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	cmd := fmt.Sprintf("dd if=/dev/urandom of=/tmp/%s bs=1M count=%d 2>&1", name, mb)
	if res, err := a.Exec(ctx, agentapi.ExecRequest{Argv: []string{"sh", "-c", cmd}}, nil, &out, &out); err != nil || res.ExitCode != 0 {
		return fmt.Errorf("sandbox %s: %s: %v %s", id, cmd, err, out.String())
	}
	return nil
}

// memoryDirKind says where clones' memory images live, for the report.
func memoryDirKind(dir string) string {
	if dir == "" {
		return "in the data dir"
	}
	if huge, err := fsutil.HugePageSize(dir); err == nil && huge > 0 {
		return fmt.Sprintf("on hugetlbfs (%d KiB pages)", huge>>10)
	}
	return "on tmpfs"
}

// parseSizes reads --memory: guest sizes in MiB, 64 or more.
func parseSizes(s string) ([]int, error) {
	return parseInts("--memory", s, 64, "sizes in MiB like 256,1024")
}

// parseDirties reads --dirty-mb: MB amounts, 0 or more.
func parseDirties(s string) ([]int, error) {
	return parseInts("--dirty-mb", s, 0, "amounts in MB like 0,64")
}

// parseInts reads a flag's comma-separated numbers, none below least;
// anything else is an error naming the flag and what it wants.
func parseInts(flag, s string, least int, want string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < least {
			return nil, fmt.Errorf("%s %q: want %s: %w", flag, s, want, errdefs.ErrInvalidArgument)
		}
		out = append(out, n)
	}
	return out, nil
}
