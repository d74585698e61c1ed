package uffd

// bitmap is one bit per page.
type bitmap []uint64

func newBitmap(n uint64) bitmap { return make(bitmap, (n+63)/64) }

func (b bitmap) get(i uint64) bool { return b[i/64]&(1<<(i%64)) != 0 }

func (b bitmap) set(i uint64) { b[i/64] |= 1 << (i % 64) }

// setRange sets bits [first, last).
func (b bitmap) setRange(first, last uint64) {
	for i := first; i < last; i++ {
		b.set(i)
	}
}
