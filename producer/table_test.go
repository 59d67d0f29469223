package producer

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"unsafe"
)

// The table holds what a map would, through random puts, removals, sweeps and samples, with
// hashes drawn from a small set so that many entries share a hash or a home slot, and every
// entry stays findable (removal's back-shift keeps every probe sequence whole).
func TestTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tab table
	type held struct {
		h uint64
		e *entry
	}
	want := map[counterKey]held{}
	hashOf := func(ck counterKey) uint64 {
		// Few distinct hashes, whose homes (their high bits) are the first, a middle and the
		// last slot, so that clusters wrap around the table's end.
		return []uint64{0, 1 << 63, ^uint64(0) - 7}[len(ck.key)%3] + uint64(ck.window)
	}
	check := func(step int) {
		t.Helper()
		if tab.n != len(want) {
			t.Fatalf("step %d: table holds %d entries, want %d", step, tab.n, len(want))
		}
		for ck, w := range want {
			if got := tab.get(w.h, ck); got != w.e {
				t.Fatalf("step %d: get(%v) = %p, want %p", step, ck, got, w.e)
			}
		}
	}
	for step := range 20_000 {
		ck := counterKey{key: strconv.Itoa(rng.IntN(300)), window: int64(rng.IntN(4))}
		h := hashOf(ck)
		switch op := rng.IntN(10); {
		case op < 5:
			if _, ok := want[ck]; !ok {
				e := &entry{ck: ck}
				tab.put(h, e)
				want[ck] = held{h, e}
			}
		case op < 8:
			if w, ok := want[ck]; ok {
				tab.remove(w.h, w.e)
				delete(want, ck)
			} else if got := tab.get(h, ck); got != nil {
				t.Fatalf("step %d: get of a removed counter found %p", step, got)
			}
		case op < 9:
			// Sweep the entries of one window, as the idle sweep does.
			w := int64(rng.IntN(4))
			n := tab.removeIf(func(e *entry) bool { return e.ck.window == w })
			dropped := 0
			for ck := range want {
				if ck.window == w {
					delete(want, ck)
					dropped++
				}
			}
			if n != dropped {
				t.Fatalf("step %d: removeIf removed %d, want %d", step, n, dropped)
			}
		default:
			seen := map[*entry]bool{}
			tab.sample(evictSample, func(h uint64, e *entry) {
				if w, ok := want[e.ck]; !ok || w.e != e || w.h != h || seen[e] {
					t.Fatalf("step %d: sample gave %v (hash %x), not held or twice", step, e.ck, h)
				}
				seen[e] = true
			})
			if len(seen) != min(evictSample, len(want)) {
				t.Fatalf("step %d: sample saw %d entries of %d", step, len(seen), len(want))
			}
		}
		if step%97 == 0 {
			check(step)
		}
	}
	check(-1)
}

// An entry is one cache line of its size class: a Hit reads one line of it.
func TestEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 64 {
		t.Fatalf("entry is %d bytes, want 64", n)
	}
}
