package aggregator

import (
	"math/rand/v2"
	"testing"

	"github.com/streamlimit/streamlimit/topics"
)

// TestIndexAgreesWithMap runs random sets, deletions and lookups on an index and on a map,
// with hashes that share their low bits (as the keys of one partition do) and hashes that
// crowd into few slots, and checks that every lookup agrees: a deletion that left a hole
// in a probe run, or a grow that lost a slot, would make one disagree.
func TestIndexAgreesWithMap(t *testing.T) {
	for _, gen := range []struct {
		name string
		hash func(r *rand.Rand) uint32
	}{
		{"same low bits", func(r *rand.Rand) uint32 { return r.Uint32() &^ 0xff }},
		{"few values", func(r *rand.Rand) uint32 { return r.Uint32N(3000) << 20 }},
		{"random", func(r *rand.Rand) uint32 { return r.Uint32() }},
	} {
		t.Run(gen.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			var x index
			want := map[uint32]int32{}
			var hs []uint32
			for i := range 200_000 {
				switch op := r.IntN(10); {
				case op < 5 || len(hs) == 0:
					h := gen.hash(r)
					x.set(h, int32(i))
					want[h] = int32(i)
					hs = append(hs, h)
				case op < 8:
					k := r.IntN(len(hs))
					h := hs[k]
					hs[k] = hs[len(hs)-1]
					hs = hs[:len(hs)-1]
					x.del(h)
					delete(want, h)
				default:
					h := hs[r.IntN(len(hs))]
					w, ok := want[h]
					if !ok {
						w = -1
					}
					if got := x.get(h); got != w {
						t.Fatalf("op %d: get(%#x) = %d, want %d", i, h, got, w)
					}
				}
			}
			if x.n != len(want) {
				t.Fatalf("index holds %d, map %d", x.n, len(want))
			}
			for h, w := range want {
				if got := x.get(h); got != w {
					t.Fatalf("get(%#x) = %d, want %d", h, got, w)
				}
			}
			if x.get(0x12345678) != -1 && want[0x12345678] == 0 {
				t.Fatal("found a hash never set")
			}
		})
	}
}

// TestStateRemoveKeepsIndex removes counters from a state in every position that matters
// to the index — the first of a chain of counters sharing a hash (one key's several
// windows), the middle of one, and the counter that the removal moves within the list — and
// checks after each that every counter left is found and every removed one is not.
func TestStateRemoveKeepsIndex(t *testing.T) {
	s := testState(1000)
	now := int64(1_763_740_000_000)
	windows := []int64{10_000, 20_000, 30_000}
	keys := []string{"a", "b", "c", "d"}
	for _, k := range keys {
		for _, w := range windows {
			h := topics.Hit{Key: k, Site: "eu", BucketStart: now, Window: w, Count: 1}
			s.add(now, 0, &h, "", 0)
		}
	}
	held := map[counterID]bool{}
	for _, k := range keys {
		for _, w := range windows {
			held[counterID{k, w}] = true
		}
	}
	check := func(step string) {
		t.Helper()
		for id, ok := range held {
			if got := s.get(id.key, id.window) != nil; got != ok {
				t.Fatalf("%s: %s/%d found %v, want %v", step, id.key, id.window, got, ok)
			}
		}
		if s.size() != countTrue(held) {
			t.Fatalf("%s: %d counters, want %d", step, s.size(), countTrue(held))
		}
	}
	for _, id := range []counterID{
		{"b", 30_000},                // the first of b's chain (the last created)
		{"c", 20_000},                // the middle of c's chain
		{"d", 30_000},                // the last counter in the list
		{"a", 10_000},                // the end of a's chain
		{"b", 20_000}, {"b", 10_000}, // b's chain to empty
	} {
		s.remove(s.get(id.key, id.window))
		held[id] = false
		check("after removing " + id.key)
	}
}

func countTrue(m map[counterID]bool) int {
	n := 0
	for _, v := range m {
		if v {
			n++
		}
	}
	return n
}
