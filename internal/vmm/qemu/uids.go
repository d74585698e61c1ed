package qemu

import (
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// UIDRange is a block of host user IDs set aside for VMM processes. With
// Config.UIDs each QEMU drops to a uid of its own (and the group of the same
// number), the way Firecracker's jailer gives every microVM its own uid: a
// compromised VMM then cannot signal, ptrace or read /proc of its siblings,
// which a shared user such as nobody allows. No account needs to exist for
// these ids: a dropped QEMU opens no file (see "Least privilege").
type UIDRange struct {
	First int // first uid of the block
	Count int // number of uids
}

// DefaultUIDRange is the block the registered driver uses when forkd runs
// as root: far above login accounts (1000-60000), systemd's dynamic users
// (61184-65519) and the subordinate ids container runtimes hand out
// (100000 upwards, 65536 per user), and below 2^31 for tools that read
// uids as signed.
var DefaultUIDRange = UIDRange{First: 2_000_000_000, Count: 65536}

// Contains reports whether uid lies in r.
func (r UIDRange) Contains(uid int) bool { return uid >= r.First && uid < r.First+r.Count }

func (r UIDRange) validate() error {
	if r.Count <= 0 || r.First <= 0 || r.First+r.Count-1 > 1<<31-2 {
		return fmt.Errorf("qemu: uid range %d+%d: need a first uid above 0, a count above 0, and the last uid below 2^31-1: %w",
			r.First, r.Count, errdefs.ErrInvalidArgument)
	}
	return nil
}

// uidPool hands out the uids of a range, one per running VMM.
type uidPool struct {
	r    UIDRange
	mu   sync.Mutex
	used map[int]bool
}

func newUIDPool(r UIDRange) *uidPool { return &uidPool{r: r, used: map[int]bool{}} }

// take returns a uid no other VMM of this driver holds. It starts at a
// random offset so that a uid freed a moment ago (whose process may still
// be on its way out) is unlikely to be handed out again at once.
func (p *uidPool) take() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.used) >= p.r.Count {
		return 0, fmt.Errorf("qemu: all %d VMM uids from %d are in use; give the driver a larger UIDRange: %w",
			p.r.Count, p.r.First, errdefs.ErrResourceExhausted)
	}
	off := rand.IntN(p.r.Count)
	for i := 0; i < p.r.Count; i++ {
		uid := p.r.First + (off+i)%p.r.Count
		if !p.used[uid] {
			p.used[uid] = true
			return uid, nil
		}
	}
	panic("unreachable: fewer used uids than the range holds, yet none free")
}

// mark records a uid held by an adopted VMM.
func (p *uidPool) mark(uid int) {
	if !p.r.Contains(uid) {
		return
	}
	p.mu.Lock()
	p.used[uid] = true
	p.mu.Unlock()
}

func (p *uidPool) release(uid int) {
	p.mu.Lock()
	delete(p.used, uid)
	p.mu.Unlock()
}
