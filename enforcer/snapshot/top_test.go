package snapshot

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// Top returns the n largest totals, largest first, ties by key, without expired entries,
// as sorting every entry would.
func TestTopAgainstSort(t *testing.T) {
	f := newFixture(t, Config{})
	rng := rand.New(rand.NewPCG(1, 2))
	type kv struct {
		key   string
		total float64
	}
	var all []kv
	for i := range 500 {
		key := fmt.Sprintf("api|user=%d#60s", i)
		total := float64(rng.IntN(50)) // many ties
		asOf, window := f.clk.Now(), time.Minute
		if i%7 == 0 {
			asOf = f.clk.Now().Add(-2 * time.Minute) // expired at now
		} else {
			all = append(all, kv{key, total})
		}
		f.apply(t, key, countValue(t, key, window, asOf, map[string]float64{"eu": total}))
	}
	slices.SortFunc(all, func(a, b kv) int {
		if a.total != b.total {
			if a.total > b.total {
				return -1
			}
			return 1
		}
		return strings.Compare(a.key, b.key)
	})
	for _, n := range []int{0, 1, 10, len(all), len(all) + 5} {
		got := f.s.Top(n, f.clk.Now())
		want := all[:min(n, len(all))]
		if len(got) != len(want) {
			t.Fatalf("Top(%d): %d entries, want %d", n, len(got), len(want))
		}
		for i := range want {
			if got[i].Key != want[i].key || got[i].Total != want[i].total || got[i].Site("eu") != want[i].total {
				t.Fatalf("Top(%d)[%d] = %s %v, want %s %v", n, i, got[i].Key, got[i].Total, want[i].key, want[i].total)
			}
		}
	}
}

// BenchmarkTop finds the 20 largest of 100 000 counts: a pass of the console over the
// snapshot (it costs in proportion to the keys held).
func BenchmarkTop(b *testing.B) {
	f := newFixture(b, Config{})
	for i := range 100_000 {
		key := fmt.Sprintf("api|user=%d#60s", i)
		f.apply(b, key, countValue(b, key, time.Minute, f.clk.Now(), map[string]float64{"eu": float64(i % 977), "us": 1}))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if top := f.s.Top(20, f.clk.Now()); len(top) != 20 {
			b.Fatalf("%d keys", len(top))
		}
	}
}
