//go:build !race

// Allocation counts mean nothing under -race (its instrumentation allocates); make test runs
// the allocation tests in a race-free pass first.

package aggregator

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// allocKeys and allocBatch shape the replay TestReplayAllocations counts: allocKeys keys,
// each hit 10 times from 3 sites in turn, 3 s apart (as BenchmarkEndToEnd's), in hit batches
// of allocBatch.
const allocKeys, allocBatch = 1000, 500

// replayFetches returns the hit batches of allocKeys keys' 10 hits each at now, a fetch of
// one partition each, in the order a replay reads them.
func replayFetches(t testing.TB, now int64) []kgo.FetchTopicPartition {
	sites := []string{"eu-1", "us-1", "ap-1"}
	var fetches []kgo.FetchTopicPartition
	for j := range 10 {
		for k := 0; k < allocKeys; k += allocBatch {
			v, err := topics.AppendHitBatch(nil, sites[j%3])
			if err != nil {
				t.Fatal(err)
			}
			for i := k; i < k+allocBatch; i++ {
				h := topics.Hit{Key: "bench|user=" + strconv.Itoa(i), BucketStart: now - 27_000 + int64(j)*3000, Window: 60_000, Count: 1}
				if v, err = h.AppendToBatch(v); err != nil {
					t.Fatal(err)
				}
			}
			r := &kgo.Record{Topic: "hits", Key: []byte(topics.HitBatchKey), Value: v, Timestamp: time.UnixMilli(now)}
			fetches = append(fetches, kgo.FetchTopicPartition{Topic: "hits", FetchPartition: kgo.FetchPartition{Records: []*kgo.Record{r}}})
		}
	}
	return fetches
}

// TestReplayAllocations holds what replaying hit batches allocates to the counters it makes:
// per key hit 10 times from 3 sites, its key, its window.Counter and the Counter's 10
// allocations (TestCounterGrowthAllocs), and nothing per hit or per record — no copy of a
// key, no reading buffer. Counting a batch again into the counters it made allocates
// nothing. It was 17 allocations per key before a Counter grew in its size class's room and
// a batch was read once into scratch that is kept.
func TestReplayAllocations(t *testing.T) {
	a, err := New(Config{Brokers: []string{"unused:9092"}, MaxKeys: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	a.parts[tp{"hits", 0}] = &partState{replaying: true}
	a.nparts["hits"] = 1
	fetches := replayFetches(t, now)
	ctx := context.Background()
	replay := func() {
		for i := range fetches {
			a.count(ctx, nil, now, &fetches[i], fetches[i].Records)
		}
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	replay()
	runtime.ReadMemStats(&after)
	if a.st.size() != allocKeys {
		t.Fatalf("%d counters, want %d", a.st.size(), allocKeys)
	}
	perKey := float64(after.Mallocs-before.Mallocs) / allocKeys
	t.Logf("replaying %d keys × 10 hits from 3 sites in batches of %d: %.2f allocations per key", allocKeys, allocBatch, perKey)
	// 12 per key, and a few per run: the chunks of entries, the index, the scratch, the
	// interned sites.
	if perKey > 12.1 {
		t.Errorf("replay: %.2f allocations per key, want at most 12.1", perKey)
	}
	if n := testing.AllocsPerRun(5, func() { a.count(ctx, nil, now, &fetches[0], fetches[0].Records) }); n != 0 {
		t.Errorf("counting a batch of %d hits into existing counters: %v allocations, want 0", allocBatch, n)
	}
}
