package snapshot

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const benchKeys = 100_000

// benchSnapshot returns a snapshot of benchKeys keys and their names and count values.
func benchSnapshot(b *testing.B) (*Snapshot, []string, [][]byte) {
	b.Helper()
	f := newFixture(b, Config{})
	names := make([]string, benchKeys)
	values := make([][]byte, benchKeys)
	for i := range names {
		names[i] = fmt.Sprintf("api:POST /articles|user=%d", i)
		values[i] = countValue(b, names[i], time.Minute, t0, map[string]float64{"eu": float64(i % 7), "us": 3, "ap": 1})
		f.apply(b, names[i], values[i])
	}
	return f.s, names, values
}

// BenchmarkGet measures one lookup by parallel readers, the enforcer's hot path.
func BenchmarkGet(b *testing.B) {
	s, names, _ := benchSnapshot(b)
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := next.Add(7919) // spread readers over the key space
		var sink float64
		for pb.Next() {
			e, _ := s.Get(names[i%benchKeys])
			sink += e.Remote()
			i++
		}
		_ = sink
	})
}

// BenchmarkGetWhileApplying is BenchmarkGet while one goroutine (the follower) applies
// count records to spread keys, 200 per 10 ms sleep (at most 20,000 a second; the
// applies/s metric says how many), a busy counts topic (the
// aggregator coalesces each key's emissions). Allocations reported are the writer's:
// readers allocate nothing.
func BenchmarkGetWhileApplying(b *testing.B) {
	s, names, values := benchSnapshot(b)
	var stop atomic.Bool
	var applied atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; !stop.Load(); i = (i + 104729) % benchKeys {
			_ = s.Apply([]byte(names[i]), values[i])
			if applied.Add(1)%200 == 0 {
				time.Sleep(10 * time.Millisecond)
			}
		}
	})
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := next.Add(7919)
		var sink float64
		for pb.Next() {
			e, _ := s.Get(names[i%benchKeys])
			sink += e.Remote()
			i++
		}
		_ = sink
	})
	b.StopTimer()
	stop.Store(true)
	wg.Wait()
	b.ReportMetric(float64(applied.Load())/b.Elapsed().Seconds(), "applies/s")
}

// BenchmarkApply measures applying one binary count record (decode + store) to a held key.
func BenchmarkApply(b *testing.B) {
	s, names, values := benchSnapshot(b)
	keys := make([][]byte, len(names))
	for i, n := range names {
		keys[i] = []byte(n)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		k := i % benchKeys
		if err := s.Apply(keys[k], values[k]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGetHotKey is BenchmarkGet with every reader asking for the same key, as requests
// for one hot counter do.
func BenchmarkGetHotKey(b *testing.B) {
	s, names, _ := benchSnapshot(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var sink float64
		for pb.Next() {
			e, _ := s.Get(names[42])
			sink += e.Remote()
		}
		_ = sink
	})
}

// BenchmarkMapBaseline reads a plain Go map of the same 100k keys with no synchronization
// at all, in the pattern of BenchmarkGet: the floor that memory latency sets for a random
// lookup in a table this size, against which BenchmarkGet's cost should be read.
func BenchmarkMapBaseline(b *testing.B) {
	m := make(map[string]Entry, benchKeys)
	names := make([]string, benchKeys)
	for i := range names {
		names[i] = fmt.Sprintf("api:POST /articles|user=%d", i)
		m[names[i]] = Entry{Total: float64(i)}
	}
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := next.Add(7919)
		var sink float64
		for pb.Next() {
			e := m[names[i%benchKeys]]
			sink += e.Remote()
			i++
		}
		_ = sink
	})
}
