package memsize

import (
	"testing"
	"unsafe"
)

// TestAllocCoversTheAllocator checks the estimate against the allocator's own size
// classes: the smallest gap between allocations of n bytes from one size class is that
// class, and the estimate never falls below it nor exceeds it by a step (16 bytes). Sizes
// from 16 bytes up: smaller ones share the tiny allocator's blocks.
func TestAllocCoversTheAllocator(t *testing.T) {
	for _, n := range []int64{16, 17, 25, 33, 100, 200, 256} {
		var ptrs [64]*byte
		for i := range ptrs {
			b := make([]byte, n)
			ptrs[i] = &b[0]
		}
		// The smallest positive gap between allocations is the size class.
		gap := int64(1 << 62)
		for i := range ptrs {
			for j := range ptrs {
				d := int64(uintptr(unsafe.Pointer(ptrs[j])) - uintptr(unsafe.Pointer(ptrs[i])))
				if d > 0 && d < gap {
					gap = d
				}
			}
		}
		if got := Alloc(n); got < gap || got >= gap+16 {
			t.Errorf("Alloc(%d) = %d, the allocator's class is %d", n, got, gap)
		}
	}
	if Alloc(0) != 0 || Alloc(-3) != 0 {
		t.Error("nothing allocated must cost nothing")
	}
	if got := Alloc(1000); got < 1000 || got > 1125 {
		t.Errorf("Alloc(1000) = %d, want within an eighth above", got)
	}
}

// TestRLQSPartKeepsTheHalf: the RLQS part, doubled, plus what Split gives the per-key
// structures of the rest keeps at most half of the target alive.
func TestRLQSPartKeepsTheHalf(t *testing.T) {
	for _, total := range []int64{256 << 20, 2 << 30, 1 << 10} {
		part := RLQSPart(total)
		b := Split(total - 2*part)
		if sum := part + b.KeyCache + b.Local + b.Counter + b.Snapshot; sum > total/2 || part <= 0 {
			t.Errorf("target %d: RLQS %d, structures %+v: %d alive, above half", total, part, b, sum)
		}
	}
	if RLQSPart(0) != 0 || RLQSPart(-1) != 0 {
		t.Error("no target, no RLQS part")
	}
}
