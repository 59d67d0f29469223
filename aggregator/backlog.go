package aggregator

// The backlog of emission.
//
// When a partition's replay ends, every counter of it is due at once, and a round may
// publish only its budget of them. Ranking them all again in every round, by their change
// at that round's instant, would compute the value of every waiting counter in every round:
// n²/budget values for a backlog of n. So a round that has more due counters than its
// budget ranks the new ones once, by their change at that instant, and keeps them ranked
// in the backlog, a heap by that change; each round then publishes the largest first, and a
// counter's value is computed again only when it comes out. Draining n counters costs
// about three values each (ranking, coming out, the published breakdown) and n log n
// comparisons. The counters waiting are marked queued, so that the rounds' scans pass them.

// waiting is a counter in the backlog. It is found again by its key and window, since
// positions change as counters are removed.
type waiting struct {
	key    string
	window int64
	hash   uint32 // keyHash(key)
	slot   int32
	prio   float64 // its change when it was ranked
}

// backlog is a max-heap of waiting counters by prio.
type backlog []waiting

// push adds w.
func (b *backlog) push(w waiting) {
	h := append(*b, w)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if h[p].prio >= h[i].prio {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	*b = h
}

// pop removes and returns the counter of the largest change; the backlog is not empty.
func (b *backlog) pop() waiting {
	h := *b
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h[last] = waiting{}
	h = h[:last]
	h.down(0)
	if len(h) == 0 {
		h = nil // free a drained backlog's room
	}
	*b = h
	return top
}

// down moves h[i] down to its place.
func (h backlog) down(i int) {
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if r := c + 1; r < len(h) && h[r].prio > h[c].prio {
			c = r
		}
		if h[i].prio >= h[c].prio {
			return
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
}

// dropSlot forgets the waiting counters of slot (they are being forgotten).
func (b *backlog) dropSlot(slot int32) {
	h := *b
	keep := h[:0]
	for _, w := range h {
		if w.slot != slot {
			keep = append(keep, w)
		}
	}
	clear(h[len(keep):])
	for i := len(keep)/2 - 1; i >= 0; i-- {
		keep.down(i)
	}
	*b = keep
}
