package aggregator

import (
	"math/rand/v2"
	"testing"

	"github.com/streamlimit/streamlimit/topics"
)

// TestIndexAgreesWithMap runs random inserts, removals, re-pointings and lookups on an
// index and on a map of sets, with hashes that share their low bits (as the keys of one
// partition do), hashes that crowd into few slots and many positions under one hash, and
// checks that every lookup finds exactly the positions the map holds: a removal that left
// a hole in a probe run, or a grow that lost a slot, would make one disagree.
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
			type held struct {
				h   uint32
				pos int32
			}
			want := map[uint32]map[int32]bool{}
			size := 0
			add := func(k held) {
				if want[k.h] == nil {
					want[k.h] = map[int32]bool{}
				}
				want[k.h][k.pos] = true
				size++
			}
			del := func(k held) {
				delete(want[k.h], k.pos)
				size--
			}
			var hs []held
			lookup := func(h uint32) map[int32]bool {
				got := map[int32]bool{}
				for i := x.first(h); i >= 0; i = x.next(i, h) {
					if got[x.slots[i].pos] {
						t.Fatalf("position %d found twice under %#x", x.slots[i].pos, h)
					}
					got[x.slots[i].pos] = true
				}
				return got
			}
			check := func(op int, h uint32) {
				got := lookup(h)
				for pos := range want[h] {
					if !got[pos] {
						t.Fatalf("op %d: %#x/%d not found", op, h, pos)
					}
				}
				if len(got) != len(want[h]) {
					t.Fatalf("op %d: %#x has %d positions, want %d", op, h, len(got), len(want[h]))
				}
			}
			for i := range 100_000 {
				switch op := r.IntN(10); {
				case op < 5 || len(hs) == 0:
					k := held{gen.hash(r), int32(i)}
					x.insert(k.h, k.pos)
					add(k)
					hs = append(hs, k)
				case op < 7:
					j := r.IntN(len(hs))
					k := hs[j]
					hs[j] = hs[len(hs)-1]
					hs = hs[:len(hs)-1]
					x.remove(k.h, k.pos)
					del(k)
				case op < 8:
					j := r.IntN(len(hs))
					k := hs[j]
					x.repoint(k.h, k.pos, int32(1_000_000+i))
					del(k)
					hs[j].pos = int32(1_000_000 + i)
					add(hs[j])
				default:
					check(i, hs[r.IntN(len(hs))].h)
				}
			}
			if x.n != size {
				t.Fatalf("index holds %d, map %d", x.n, size)
			}
			for h := range want {
				check(-1, h)
			}
			if load := float64(x.n) / float64(len(x.slots)); load > 0.75 {
				t.Fatalf("load %.2f", load)
			}
		})
	}
}

// TestStateRemoveKeepsIndex removes counters from a state in every position that matters
// to the index — the first of a chain of counters sharing a hash (one key's several
// windows), the middle of one, and the counter that the removal moves into its place — and
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
		s.remove(s.lookup(topics.Murmur2([]byte(id.key)), []byte(id.key), id.window))
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
