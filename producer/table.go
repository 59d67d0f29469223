package producer

import (
	"math/bits"
	"math/rand/v2"
	"unsafe"
)

// table finds a shard's entries by the 64-bit hash of their (key, window): open addressing
// with linear probing over (hash, entry) slots. It replaces a map[uint64]*entry on the path
// of every Hit: the hash is used as it is (a map hashes its key again), a lookup reads one
// 16-byte slot per probe and the entry only when the hashes match, and entries whose
// hashes collide simply take further slots (no second map). Removal shifts the following
// slots back, so that no probe sequence is left broken and no tombstones accumulate. It is
// not safe for concurrent use: the shard's lock guards it.
type table struct {
	slots []tslot // len is 0 or a power of two, 1 << (64 − shift)
	shift uint
	n     int // entries held
}

type tslot struct {
	h uint64
	e *entry // nil: empty
}

// minTableSlots is a table's size when it is first used.
const minTableSlots = 16

// home returns the first slot h probes: its high bits, since the low bits pick the shard
// and are the same for every entry of a table.
func (t *table) home(h uint64) uint64 { return h >> t.shift }

// get returns the entry of ck, whose hash is h, or nil.
func (t *table) get(h uint64, ck counterKey) *entry {
	if len(t.slots) == 0 {
		return nil
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.home(h); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.e == nil {
			return nil
		}
		if s.h == h && s.e.ck.window == ck.window && sameString(s.e.ck.key, ck.key) {
			return s.e
		}
	}
}

// put adds e, whose hash is h; the caller knows e's counter is not held.
func (t *table) put(h uint64, e *entry) {
	if (t.n+1)*4 > len(t.slots)*3 { // keep the load at most 3/4
		t.grow()
	}
	t.insert(h, e)
	t.n++
}

func (t *table) insert(h uint64, e *entry) {
	mask := uint64(len(t.slots) - 1)
	i := t.home(h)
	for t.slots[i].e != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = tslot{h: h, e: e}
}

func (t *table) grow() {
	old := t.slots
	n := max(2*len(old), minTableSlots)
	t.slots = make([]tslot, n)
	t.shift = uint(64 - bits.TrailingZeros(uint(n)))
	for _, s := range old {
		if s.e != nil {
			t.insert(s.h, s.e)
		}
	}
}

// removeAt removes the entry in slot i and shifts back the entries after it that probed
// past i, so that every remaining entry is still found from its home slot.
func (t *table) removeAt(i uint64) {
	mask := uint64(len(t.slots) - 1)
	for j := (i + 1) & mask; t.slots[j].e != nil; j = (j + 1) & mask {
		home := t.home(t.slots[j].h)
		// The entry at j may move to i if its home is not in the (cyclic) range (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = tslot{}
	t.n--
}

// remove removes e, whose hash is h, if it is held.
func (t *table) remove(h uint64, e *entry) {
	if len(t.slots) == 0 {
		return
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.home(h); t.slots[i].e != nil; i = (i + 1) & mask {
		if t.slots[i].e == e {
			t.removeAt(i)
			return
		}
	}
}

// sample calls f for up to n entries, from a random slot on.
func (t *table) sample(n int, f func(h uint64, e *entry)) {
	if t.n == 0 {
		return
	}
	mask := len(t.slots) - 1
	start := rand.IntN(len(t.slots))
	for k, seen := 0, 0; k < len(t.slots) && seen < n; k++ {
		s := t.slots[(start+k)&mask]
		if s.e == nil {
			continue
		}
		seen++
		f(s.h, s.e)
	}
}

// removeIf removes every entry for which drop returns true, and returns how many it
// removed.
func (t *table) removeIf(drop func(e *entry) bool) int {
	removed := 0
	// Removal shifts later entries back by one or more slots, possibly into the slot just
	// visited: look at a slot again after removing from it. An entry shifted across the
	// table's end from its start (wrapping) was visited already or will be at its new place.
	for i := 0; i < len(t.slots); {
		if e := t.slots[i].e; e != nil && drop(e) {
			t.removeAt(uint64(i))
			removed++
			continue
		}
		i++
	}
	return removed
}

// sameString reports a == b, answering without a call when they are the same bytes:
// callers usually pass the same string for a key every time (the enforcer's key cache
// keeps it), and == would call memequal to find that out.
func sameString(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}
