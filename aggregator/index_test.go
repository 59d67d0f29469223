package aggregator

import (
	"math/rand/v2"
	"testing"
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
