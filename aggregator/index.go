package aggregator

import "math/bits"

// index finds a counter by the murmur2 hash of its key: an open-addressing table of
// (hash, position in state.list) pairs, probed linearly. It replaces a map[uint32]*entry
// on the path of every hit: a slot is 8 bytes, so a lookup reads one cache line of the
// table in the common case and then the entry, where a Go map reads its control word, its
// key and its value pointer, often from different lines. It stores only the first counter
// of each hash; the others are chained through entry.next. It is not safe for concurrent
// use.
type index struct {
	slots []slot // len is a power of two, 1 << (32 − shift)
	shift uint
	n     int // occupied slots
}

// slot is one cell of the index: a counter's position in state.list, or -1 when empty.
type slot struct {
	hash uint32
	pos  int32
}

// minIndexSlots is the table's size when it is first used.
const minIndexSlots = 1024

// home returns h's first slot. The hash is mixed again (Fibonacci hashing, from its high
// bits) because the low bits of the counters' hashes are not spread: every key of a
// partition has the same murmur2 hash modulo the partition count.
func (x *index) home(h uint32) int { return int((h * 0x9e3779b1) >> x.shift) }

// find returns the position of h's slot, and whether it is occupied (else the position is
// where h would go).
func (x *index) find(h uint32) (int, bool) {
	mask := len(x.slots) - 1
	for i := x.home(h); ; i = (i + 1) & mask {
		s := x.slots[i]
		if s.pos < 0 {
			return i, false
		}
		if s.hash == h {
			return i, true
		}
	}
}

// get returns the list position stored for h, or -1.
func (x *index) get(h uint32) int32 {
	if len(x.slots) == 0 {
		return -1
	}
	if i, ok := x.find(h); ok {
		return x.slots[i].pos
	}
	return -1
}

// set stores pos for h, replacing what was stored.
func (x *index) set(h uint32, pos int32) {
	if (x.n+1)*4 > len(x.slots)*3 { // keep the load at most 3/4
		x.grow()
	}
	i, ok := x.find(h)
	if !ok {
		x.n++
	}
	x.slots[i] = slot{hash: h, pos: pos}
}

// del removes h, shifting later slots of its run back so that no probe meets a hole
// before its own slot (no tombstones).
func (x *index) del(h uint32) {
	if len(x.slots) == 0 {
		return
	}
	i, ok := x.find(h)
	if !ok {
		return
	}
	mask := len(x.slots) - 1
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := x.slots[j]
		if s.pos < 0 {
			break
		}
		// s may move into the hole at i only if its home slot is not in (i, j]: the
		// cyclic distance from home to j is at least the distance from i to j.
		home := x.home(s.hash)
		if (j-home)&mask >= (j-i)&mask {
			x.slots[i] = s
			i = j
		}
	}
	x.slots[i] = slot{pos: -1}
	x.n--
}

// grow doubles the table (or creates it) and re-inserts every slot.
func (x *index) grow() {
	old := x.slots
	n := max(minIndexSlots, 2*len(old))
	x.slots = make([]slot, n)
	x.shift = uint(32 - bits.Len(uint(n-1)))
	for i := range x.slots {
		x.slots[i].pos = -1
	}
	mask := n - 1
	for _, s := range old {
		if s.pos < 0 {
			continue
		}
		i := x.home(s.hash)
		for x.slots[i].pos >= 0 {
			i = (i + 1) & mask
		}
		x.slots[i] = s
	}
}
