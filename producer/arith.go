package producer

import (
	"math"
	"sync"
	"sync/atomic"
)

func floorMod(a, m int64) int64 {
	r := a % m
	if r < 0 {
		r += m
	}
	return r
}

// satAdd returns a + b for b ≥ 0, or MaxInt64 when that overflows.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// satAddAtomic adds b (which may be negative) to v, saturating at MaxInt64: the sums of
// hits the metrics report never wrap around.
func satAddAtomic(v *atomic.Int64, b int64) {
	for {
		c := v.Load()
		n := c + b
		switch {
		case b > 0 && c > math.MaxInt64-b:
			n = math.MaxInt64
		case b < 0 && c == math.MaxInt64:
			return // saturated: the true value is unknown, stay there
		}
		if v.CompareAndSwap(c, n) {
			return
		}
	}
}

// wideSum is a sum of hits that cannot overflow: records carry up to MaxInt64 hits each,
// so sums of several need more than 64 bits. Load saturates at MaxInt64. It is updated
// once per record, not per hit.
type wideSum struct {
	mu     sync.Mutex
	hi, lo uint64 // two's complement 128-bit value
}

func (w *wideSum) add(v int64) {
	w.mu.Lock()
	lo := w.lo + uint64(v)
	carry := uint64(0)
	if lo < w.lo {
		carry = 1
	}
	ext := uint64(0)
	if v < 0 {
		ext = math.MaxUint64
	}
	w.hi += ext + carry
	w.lo = lo
	w.mu.Unlock()
}

// Load returns the sum, or MaxInt64 when it is larger (0 if negative, which only a bug
// would cause).
func (w *wideSum) Load() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case int64(w.hi) < 0:
		return 0
	case w.hi > 0 || w.lo > math.MaxInt64:
		return math.MaxInt64
	}
	return int64(w.lo)
}
