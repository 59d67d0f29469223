package aggregator

// index finds counters by the murmur2 hash of their key: an open-addressing table of
// (hash, position in the state's entries) pairs, probed linearly. It replaces a
// map[uint32]*entry on the path of every hit: a slot is 8 bytes, so a lookup reads one
// cache line of the table in the common case and then the entry, where a Go map reads its
// control word, its key and its value pointer, often from different lines. Every counter
// has a slot of its own: counters whose keys share a hash (a key's several windows, or a
// collision) have several slots with that hash, which a lookup visits in turn.
//
// The table's length is any number, not a power of two (a slot's home is found by
// multiplying, not masking), so that it grows by a quarter at a time: its load stays
// between 0.6 and 0.75, and it costs 8 / 0.75 to 8 / 0.6 bytes per counter instead of the
// 8 / 0.75 to 8 / 0.375 of doubling. It is not safe for concurrent use.
type index struct {
	slots []slot // empty, or at least minIndexSlots
	n     int    // occupied slots
}

// slot is one cell of the index: a counter's position, or -1 when empty.
type slot struct {
	hash uint32
	pos  int32
}

// minIndexSlots is the table's size when it is first used.
const minIndexSlots = 1024

// home returns h's first slot. The hash is mixed again (Fibonacci hashing) because the low
// bits of the counters' hashes are not spread: every key of a partition has the same
// murmur2 hash modulo the partition count; the product's high bits then scale it to the
// table's length.
func (x *index) home(h uint32) int {
	return int(uint64(h*0x9e3779b1) * uint64(len(x.slots)) >> 32)
}

// after returns the slot after i, cyclically.
func (x *index) after(i int) int {
	if i++; i == len(x.slots) {
		return 0
	}
	return i
}

// scan returns the first slot from i on that holds h or is empty (which ends h's probe
// run). The table is never full, so it stops.
func (x *index) scan(i int, h uint32) int {
	for {
		s := x.slots[i]
		if s.pos < 0 || s.hash == h {
			return i
		}
		i = x.after(i)
	}
}

// first returns the first slot of h's probe run that holds h, or -1 if none does. Walk
// the others with next.
func (x *index) first(h uint32) int {
	if len(x.slots) == 0 {
		return -1
	}
	if i := x.scan(x.home(h), h); x.slots[i].pos >= 0 {
		return i
	}
	return -1
}

// next returns the slot after i that holds h, or -1.
func (x *index) next(i int, h uint32) int {
	if i = x.scan(x.after(i), h); x.slots[i].pos >= 0 {
		return i
	}
	return -1
}

// find returns the slot holding (h, pos), or -1.
func (x *index) find(h uint32, pos int32) int {
	for i := x.first(h); i >= 0; i = x.next(i, h) {
		if x.slots[i].pos == pos {
			return i
		}
	}
	return -1
}

// insert adds a slot for (h, pos).
func (x *index) insert(h uint32, pos int32) {
	if (x.n+1)*4 > len(x.slots)*3 { // keep the load at most 3/4
		x.grow()
	}
	i := x.home(h)
	for x.slots[i].pos >= 0 {
		i = x.after(i)
	}
	x.slots[i] = slot{hash: h, pos: pos}
	x.n++
}

// repoint changes the position stored for (h, from) to to.
func (x *index) repoint(h uint32, from, to int32) {
	if i := x.find(h, from); i >= 0 {
		x.slots[i].pos = to
	}
}

// remove removes the slot of (h, pos).
func (x *index) remove(h uint32, pos int32) {
	if i := x.find(h, pos); i >= 0 {
		x.removeAt(i)
	}
}

// removeAt empties slot i, shifting later slots of its run back so that no probe meets a
// hole before its own slot (no tombstones).
func (x *index) removeAt(i int) {
	n := len(x.slots)
	// dist is the cyclic distance from a forward to b.
	dist := func(a, b int) int {
		if d := b - a; d >= 0 {
			return d
		} else {
			return d + n
		}
	}
	for j := x.after(i); ; j = x.after(j) {
		s := x.slots[j]
		if s.pos < 0 {
			break
		}
		// s may move into the hole at i only if its home slot is not in (i, j]: the
		// cyclic distance from home to j is at least the distance from i to j.
		if dist(x.home(s.hash), j) >= dist(i, j) {
			x.slots[i] = s
			i = j
		}
	}
	x.slots[i] = slot{pos: -1}
	x.n--
}

// grow makes the table a quarter larger (or creates it) and re-inserts every slot.
func (x *index) grow() {
	old := x.slots
	x.slots = make([]slot, max(minIndexSlots, len(old)+len(old)/4))
	for i := range x.slots {
		x.slots[i].pos = -1
	}
	for _, s := range old {
		if s.pos < 0 {
			continue
		}
		i := x.home(s.hash)
		for x.slots[i].pos >= 0 {
			i = x.after(i)
		}
		x.slots[i] = s
	}
}
