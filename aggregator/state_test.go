package aggregator

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/internal/windowref"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

func testState(maxKeys int) *state {
	return newState(stateConfig{subBuckets: 10, maxSkew: time.Second, maxKeys: maxKeys, emitInterval: 100, maxSpecs: 16})
}

func TestCollectEmitsDecaysAndTombstones(t *testing.T) {
	fc := clock.NewFake(time.UnixMilli(1_763_740_000_000))
	s := testState(100)
	now := func() int64 { return fc.Now().UnixMilli() }
	hit := topics.Hit{Key: "k", Site: "eu", BucketStart: now(), Window: 10_000, Count: 4}
	if r := s.add(now(), 0, &hit, "", 0); r != added {
		t.Fatalf("add = %v", r)
	}
	_, out := s.collect(now(), 10, nil, nil)
	if len(out) != 1 || out[0].count == nil || out[0].count.Total != 4 || out[0].count.AsOf != now() {
		t.Fatalf("first emission %+v", out)
	}
	// Nothing changed and the decay time has not come: nothing.
	fc.Advance(50 * time.Millisecond)
	if _, out = s.collect(now(), 10, nil, nil); len(out) != 0 {
		t.Fatalf("unexpected %+v", out)
	}
	// New hit within EmitInterval: held back until the interval passed.
	hit.Count = 1
	s.add(now(), 0, &hit, "", 0)
	if _, out = s.collect(now(), 10, nil, nil); len(out) != 0 {
		t.Fatalf("emitted twice within EmitInterval: %+v", out)
	}
	fc.Advance(60 * time.Millisecond)
	if _, out = s.collect(now(), 10, nil, nil); len(out) != 1 || out[0].count.Total != 5 {
		t.Fatalf("second emission %+v", out)
	}
	// The window slides over the bucket: decaying counts are published, each equal to the rule.
	sp := window.NewSpec(10*time.Second, 10, time.Second)
	hits := []topics.Hit{{Site: "eu", BucketStart: hit.BucketStart, Count: 5}}
	fc.Advance(10 * time.Second)
	var decays, tombstones int
	for range 30 {
		fc.Advance(100 * time.Millisecond)
		_, out = s.collect(now(), 10, nil, nil)
		for _, e := range out {
			if e.count == nil {
				tombstones++
				if e.key != "k" || now() < hit.BucketStart+11_000 {
					t.Fatalf("tombstone %q at +%d ms", e.key, now()-hit.BucketStart)
				}
				continue
			}
			if tombstones > 0 {
				t.Fatal("count after tombstone")
			}
			decays++
			want, _ := windowref.Reference(sp, hits, e.count.AsOf)
			if math.Abs(e.count.Total-want) > 1e-9 {
				t.Fatalf("decayed count %v at %d, want %v", e.count.Total, e.count.AsOf, want)
			}
		}
	}
	if decays == 0 {
		t.Fatal("no decay emission")
	}
	// Past the window: one tombstone, and the counter is forgotten.
	if tombstones != 1 {
		t.Fatalf("%d tombstones", tombstones)
	}
	if s.size() != 0 || s.n != 0 || len(s.chunks) > 1 {
		t.Fatalf("counter not forgotten: %d", s.size())
	}
}

func TestCollectBudgetPrefersBiggestChange(t *testing.T) {
	s := testState(100)
	now := int64(1_763_740_000_000)
	for i := 1; i <= 5; i++ {
		h := topics.Hit{Key: "k" + strconv.Itoa(i), Site: "eu", BucketStart: now, Window: 10_000, Count: int64(i)}
		s.add(now, 0, &h, "", 0)
	}
	_, out := s.collect(now, 2, nil, nil)
	if len(out) != 2 || out[0].count.Total != 5 || out[1].count.Total != 4 {
		t.Fatalf("budget 2: %+v", out)
	}
	_, out = s.collect(now+100, 10, nil, nil)
	if len(out) != 3 {
		t.Fatalf("the rest should follow: %d", len(out))
	}
}

func TestPausedSlotAndDropSlot(t *testing.T) {
	s := testState(100)
	now := int64(1_763_740_000_000)
	a := topics.Hit{Key: "a", Site: "eu", BucketStart: now, Window: 10_000, Count: 1}
	b := topics.Hit{Key: "b", Site: "eu", BucketStart: now, Window: 10_000, Count: 1}
	s.add(now, 0, &a, "", 0)
	s.add(now, 1, &b, "", 0)
	s.paused[1] = true
	_, out := s.collect(now, 10, nil, nil)
	if len(out) != 1 || out[0].key != "a" {
		t.Fatalf("paused slot emitted: %+v", out)
	}
	s.dropSlot(1)
	if s.size() != 1 {
		t.Fatalf("dropSlot left %d keys", s.size())
	}
}

func TestMaxKeysAndDedupe(t *testing.T) {
	s := testState(2)
	now := int64(1_763_740_000_000)
	// k1 is hit least recently: the third key takes its place.
	for i, want := range []addResult{added, added, addedEvicting} {
		h := topics.Hit{Key: "k" + strconv.Itoa(i), Site: "eu", BucketStart: now, Window: 10_000, Count: 1}
		if i == 1 {
			h.BucketStart -= 1000
		}
		if r := s.add(now, 0, &h, "", 0); r != want {
			t.Fatalf("key %d: %v, want %v", i, r, want)
		}
	}
	if s.size() != 2 || s.get("k1", 10_000) != nil || s.get("k2", 10_000) == nil {
		t.Fatalf("%d counters, k1 %v, k2 %v: want k1 evicted for k2", s.size(), s.get("k1", 10_000), s.get("k2", 10_000))
	}
	h := topics.Hit{Key: "k0", Site: "eu", BucketStart: now, Window: 10_000, Count: 1}
	if r := s.add(now, 0, &h, "hits/1/7", now+1000); r != added {
		t.Fatalf("first copy: %v", r)
	}
	if r := s.add(now, 0, &h, "hits/1/7", now+1000); r != duplicate {
		t.Fatalf("second copy: %v", r)
	}
	if got, _ := s.sumAt(s.get("k0", 10_000), now, countNow); got != 2 {
		t.Fatalf("k0 = %v, want 2", got)
	}
	// Expired origins are pruned; a dropped slot forgets its origins (replay rebuilds them).
	s.pruneSeen(now + 2000)
	if s.seenSize != 0 {
		t.Fatalf("seen %d after prune", s.seenSize)
	}
}

// BenchmarkProcessHit measures the in-process cost of one binary hit record over 100k
// counters and three sites: decode, validation, ownership check (murmur2) and bucket update
// (no Kafka), on the poll loop's path (Aggregator.count over a partition's records).
func BenchmarkProcessHit(b *testing.B) { processHits(b, 1) }

// BenchmarkProcessHitBatch is BenchmarkProcessHit with the hits in hit batches of
// endToEndBatch, as the producer writes them: what the aggregator spends on a hit when
// Kafka's per-record costs are spread over a batch.
func BenchmarkProcessHitBatch(b *testing.B) { processHits(b, endToEndBatch) }

// processHits times hits in records of batch hits each (1: hit records of their own).
func processHits(b *testing.B, batch int) {
	a, err := New(Config{Brokers: []string{"unused:9092"}, MaxKeys: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().UnixMilli()
	const keys, parts = 100_000, 12
	sites := []string{"eu", "us", "ap"}
	byPart := make([][][]topics.Hit, parts) // by partition and site
	for p := range byPart {
		byPart[p] = make([][]topics.Hit, len(sites))
	}
	for i := range keys {
		h := topics.Hit{Key: "api:POST /articles|user=" + strconv.Itoa(i), Site: sites[i%3], BucketStart: now, Window: 60_000, Count: 1}
		p := topics.Partition([]byte(h.Key), parts)
		byPart[p][i%3] = append(byPart[p][i%3], h)
	}
	// The records of a partition side by side, their bytes in one buffer, as the client
	// decodes a fetched batch; the keys' counters lie in memory in another order.
	recs := make([]kgo.Record, 0, keys)
	hitsOf := make([]int, 0, keys)
	buf := make([]byte, 0, keys*64)
	for p, bySite := range byPart {
		for _, hits := range bySite {
			for len(hits) > 0 {
				n := min(len(hits), batch)
				k := len(buf)
				if batch == 1 {
					buf = append(buf, hits[0].Key...)
					buf, _ = hits[0].AppendBinary(buf)
					recs = append(recs, kgo.Record{Topic: "hits", Key: buf[k : k+len(hits[0].Key)], Value: buf[k+len(hits[0].Key):], Timestamp: time.UnixMilli(now), Partition: int32(p)})
				} else {
					buf = append(buf, topics.HitBatchKey...)
					buf, _ = topics.AppendHitBatch(buf, hits[0].Site)
					for _, h := range hits[:n] {
						buf, _ = h.AppendToBatch(buf)
					}
					kl := len(topics.HitBatchKey)
					recs = append(recs, kgo.Record{Topic: "hits", Key: buf[k : k+kl], Value: buf[k+kl:], Timestamp: time.UnixMilli(now), Partition: int32(p)})
				}
				hitsOf = append(hitsOf, n)
				hits = hits[n:]
			}
		}
	}
	byRec := make([][]*kgo.Record, parts)
	hitsIn := map[*kgo.Record]int{}
	for i := range recs {
		byRec[recs[i].Partition] = append(byRec[recs[i].Partition], &recs[i])
		hitsIn[&recs[i]] = hitsOf[i]
	}
	// Fetches as the poll loop gets them: a partition's records, a lockChunk at a time.
	var fetches []kgo.FetchTopicPartition
	var fetchHits []int
	for p, recs := range byRec {
		a.parts[tp{"hits", int32(p)}] = &partState{}
		for len(recs) > 0 {
			n := min(len(recs), lockChunk)
			fetches = append(fetches, kgo.FetchTopicPartition{Topic: "hits", FetchPartition: kgo.FetchPartition{Partition: int32(p), Records: recs[:n]}})
			h := 0
			for _, r := range recs[:n] {
				h += hitsIn[r]
			}
			fetchHits = append(fetchHits, h)
			recs = recs[n:]
		}
	}
	a.nparts["hits"] = parts
	ctx := context.Background()
	// Warm: every counter exists and has a window.Counter (a counter's first record is
	// kept in its entry, its second makes its window.Counter: compact.go).
	for range 2 {
		for i := range fetches {
			a.count(ctx, nil, now, &fetches[i], fetches[i].Records)
		}
	}
	if a.st.size() != keys {
		b.Fatalf("%d counters, want %d", a.st.size(), keys)
	}
	b.ReportAllocs()
	// Each iteration is one hit; a fetch is counted when the hits of the last one have
	// all been accounted for.
	next, left := 0, 0
	for b.Loop() {
		if left == 0 {
			i := next % len(fetches)
			a.count(ctx, nil, now, &fetches[i], fetches[i].Records)
			next, left = next+1, fetchHits[i]
		}
		left--
	}
}

// TestCollectRefreshesSteadyCounts: a count that stays the same (hits arriving as fast as
// they leave the window) is still republished every half window, so readers never take a
// live key for an expired one.
func TestCollectRefreshesSteadyCounts(t *testing.T) {
	fc := clock.NewFake(time.UnixMilli(1_763_740_000_000))
	s := testState(100)
	now := func() int64 { return fc.Now().UnixMilli() }
	const w = 10_000
	emitted := []int64{}
	for range 300 { // 30 s: a hit per 100 ms keeps the count steady once the window is full
		hit := topics.Hit{Key: "k", Site: "eu", BucketStart: now(), Window: w, Count: 1}
		s.add(now(), 0, &hit, "", 0)
		_, out := s.collect(now(), 10, nil, nil)
		for _, e := range out {
			if e.count != nil {
				emitted = append(emitted, e.count.AsOf)
			}
		}
		fc.Advance(100 * time.Millisecond)
	}
	last := emitted[0]
	for _, at := range emitted[1:] {
		if at-last > w/2+200 {
			t.Fatalf("no count published for %d ms (window %d ms): readers would expire the key", at-last, w)
		}
		last = at
	}
	if now()-last > w/2+200 {
		t.Fatalf("last count published %d ms ago", now()-last)
	}
}

// TestCollectSilentRemovalKeepsCandidates: a counter that reached zero before it was ever
// published is forgotten during the scan for due counters, and the last counter takes its
// place; a counter already chosen for emission from that last place must be emitted from
// its new one (the scan once kept the old position, and the emission read a cleared entry).
func TestCollectSilentRemovalKeepsCandidates(t *testing.T) {
	fc := clock.NewFake(time.UnixMilli(1_763_740_000_000))
	s := testState(100)
	now := func() int64 { return fc.Now().UnixMilli() }
	// "gone" is counted and never published; its 1 s window passes.
	gone := topics.Hit{Key: "gone", Site: "eu", BucketStart: now(), Window: 1_000, Count: 3}
	if r := s.add(now(), 0, &gone, "", 0); r != added {
		t.Fatalf("add = %v", r)
	}
	fc.Advance(5 * time.Second)
	// Then several counters behind it, each due.
	for i := range 5 {
		h := topics.Hit{Key: "k" + strconv.Itoa(i), Site: "eu", BucketStart: now(), Window: 10_000, Count: int64(i + 1)}
		if r := s.add(now(), 0, &h, "", 0); r != added {
			t.Fatalf("add = %v", r)
		}
	}
	_, out := s.collect(now(), 10, nil, nil)
	got := map[string]float64{}
	for _, e := range out {
		if e.count == nil {
			t.Fatalf("tombstone for %s, which was never published", e.key)
		}
		got[e.key] = e.count.Total
	}
	for i := range 5 {
		if k := "k" + strconv.Itoa(i); got[k] != float64(i+1) {
			t.Errorf("%s emitted %v, want %d (emissions %v)", k, got[k], i+1, got)
		}
	}
	if len(got) != 5 || s.n != 5 {
		t.Errorf("%d emissions, %d counters held; want 5 and 5 (gone forgotten)", len(got), s.n)
	}
}
