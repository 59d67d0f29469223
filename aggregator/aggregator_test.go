package aggregator

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

const testWindow = 20 * time.Second

// Hits from three sites over 500 keys, on the local and the "us." topic, all written before
// the aggregator starts: every count it publishes (after replay, and then as they decay to
// nothing) equals the brute-force count at its AsOf, total and per site; every key gets a
// count, and a tombstone once its hits have left the window; heartbeats reach every counts
// partition.
func TestExactnessAgainstBruteForce(t *testing.T) {
	t.Parallel()
	onKafkas(t, testExactnessAgainstBruteForce)
}

func testExactnessAgainstBruteForce(t *testing.T, e *env) {
	rng := rand.New(rand.NewPCG(3, 4))
	now := time.Now()
	from := now.Add(time.Second - testWindow)
	// Hits over the whole window but its last second, the oldest about to leave it. A key
	// whose hits all leave the window before the aggregator first publishes it never gets a
	// count: every key is expected a count that has a hit still in the window a second
	// after the aggregator was ready. On kfake, where time is virtual and the aggregator
	// ready within a fraction of a second, that is nearly all of them; a loaded machine on
	// the real broker may take longer than the window.
	local, remote := randomHits(rng, "exact", 500, from, now, testWindow)
	e.produce(e.hits, local...)
	e.produce(e.usHits, remote...)
	reg := prometheus.NewRegistry()
	cfg := e.config(reg)
	a, _ := e.run(cfg)
	eventually(t, "ready", 60*time.Second, a.Ready)
	want := keysOf(local, remote)
	newest := map[string]int64{}
	for _, h := range append(append([]topics.Hit(nil), local...), remote...) {
		newest[h.Key] = max(newest[h.Key], h.BucketStart)
	}
	late := time.Now().Add(time.Second - testWindow).UnixMilli()
	for k, ms := range newest {
		if ms <= late {
			delete(want, k)
		}
	}
	t.Logf("ready %v after the hits' newest: %d of %d keys may have left the window before their first count",
		time.Since(now).Round(time.Millisecond), len(newest)-len(want), len(newest))
	eventually(t, "a count for every key", 30*time.Second, func() bool {
		got, _ := e.countsRecs.latest(t)
		for k := range want {
			if _, ok := got[k]; !ok {
				return false
			}
		}
		return true
	})
	// The counts decay as their hits leave the window, until each ends as a tombstone.
	eventually(t, "a tombstone for every key", testWindow+10*time.Second, func() bool {
		_, dead := e.countsRecs.latest(t)
		for k := range want {
			if !dead[k] {
				return false
			}
		}
		return true
	})
	n := e.checkExact(e.countsRecs.counts(t), cfg, nil)
	if n < len(want) {
		t.Fatalf("only %d counts checked", n)
	}
	t.Logf("%d counts checked against brute force for %d keys", n, len(want))
	if got := metricValue(t, reg, "streamlimit_aggregator_records_in_total"); got != float64(len(local)+len(remote)) {
		t.Fatalf("records_in_total = %v, want %d", got, len(local)+len(remote))
	}
	// Heartbeats: one key per source partition, on every counts partition.
	hbParts := map[string]map[int32]bool{}
	for _, r := range e.countsRecs.all() {
		if !topics.IsHeartbeatKey(r.Key) {
			continue
		}
		hb, err := topics.DecodeHeartbeat(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Key) != topics.HeartbeatKey(hb.Topic, hb.Partition) || hb.Instance == "" {
			t.Fatalf("heartbeat %q: %+v", r.Key, hb)
		}
		if hbParts[string(r.Key)] == nil {
			hbParts[string(r.Key)] = map[int32]bool{}
		}
		hbParts[string(r.Key)][r.Partition] = true
	}
	if len(hbParts) != 2*testPartitions {
		t.Fatalf("heartbeats for %d source partitions, want %d", len(hbParts), 2*testPartitions)
	}
	for k, ps := range hbParts {
		if len(ps) != testPartitions {
			t.Fatalf("heartbeat %s on %d counts partitions, want %d", k, len(ps), testPartitions)
		}
	}
}

// An aggregator stopped mid-stream and replaced by another instance of the group: hits
// written while none runs are counted, and after the replay every count equals brute force.
func TestRestartReplaysToSameCounts(t *testing.T) {
	t.Parallel()
	onKafkas(t, testRestartReplaysToSameCounts)
}

func testRestartReplaysToSameCounts(t *testing.T, e *env) {
	rng := rand.New(rand.NewPCG(5, 6))
	now := time.Now()
	l1, r1 := randomHits(rng, "restart", 100, now.Add(-10*time.Second), now, testWindow)
	e.produce(e.hits, l1...)
	e.produce(e.usHits, r1...)
	cfg := e.config(prometheus.NewRegistry())
	a, stopA := e.run(cfg)
	eventually(t, "A ready", 60*time.Second, a.Ready)
	eventually(t, "A counted every key", 30*time.Second, func() bool {
		got, _ := e.countsRecs.latest(t)
		return len(got) == 100
	})
	stopA()
	stopped := time.Now().UnixMilli()
	// Phase 2, while no aggregator runs: more hits for the same keys and new ones.
	l2, r2 := randomHits(rng, "restart", 150, time.Now().Add(-3*time.Second), time.Now(), testWindow)
	e.produce(e.hits, l2...)
	e.produce(e.usHits, r2...)
	cfg2 := e.config(prometheus.NewRegistry())
	b, _ := e.run(cfg2)
	eventually(t, "B ready", 60*time.Second, b.Ready)
	readyAt := time.Now().UnixMilli()
	eventually(t, "B published every key", 30*time.Second, func() bool {
		n := 0
		for _, c := range e.countsRecs.counts(t) {
			if c.AsOf >= readyAt {
				n++
			}
		}
		got, _ := e.countsRecs.latest(t)
		return len(got) == 150 && n >= 150
	})
	// Counts A published before it stopped reflect phase 1 only; B's reflect everything.
	e.hitsMu.Lock()
	all := e.hitsByCounter
	e.hitsByCounter = map[counterID][]topics.Hit{}
	e.hitsMu.Unlock()
	e.remember(l1...)
	e.remember(r1...)
	nA := e.checkExact(e.countsRecs.counts(t), cfg, func(c topics.Count) bool { return c.AsOf < stopped })
	e.hitsMu.Lock()
	e.hitsByCounter = all
	e.hitsMu.Unlock()
	nB := e.checkExact(e.countsRecs.counts(t), cfg, func(c topics.Count) bool { return c.AsOf > stopped })
	if nA == 0 || nB < 150 {
		t.Fatalf("checked %d counts of A and %d of B", nA, nB)
	}
}

// Two instances share the group: the range balancer gives each the same partition numbers
// on both topics (one key, one owner); when one leaves, the other takes over its slots,
// replays them, and every count published equals brute force.
func TestTwoInstancesOneLeaves(t *testing.T) {
	t.Parallel()
	onKfake(t, testTwoInstancesOneLeaves)
}

func testTwoInstancesOneLeaves(t *testing.T, e *env) {
	rng := rand.New(rand.NewPCG(7, 8))
	now := time.Now()
	l1, r1 := randomHits(rng, "two", 200, now.Add(-10*time.Second), now, testWindow)
	e.produce(e.hits, l1...)
	e.produce(e.usHits, r1...)
	cfg := e.config(prometheus.NewRegistry())
	cfg.InstanceID = "A"
	a, stopA := e.run(cfg)
	cfgB := e.config(prometheus.NewRegistry())
	cfgB.InstanceID = "B"
	b, _ := e.run(cfgB)
	eventually(t, "both ready with a share each", 60*time.Second, func() bool {
		return a.Ready() && b.Ready() && len(a.Assigned()[e.hits]) > 0 && len(b.Assigned()[e.hits]) > 0 &&
			len(a.Assigned()[e.hits])+len(b.Assigned()[e.hits]) == testPartitions
	})
	for name, x := range map[string]*Aggregator{"A": a, "B": b} {
		as := x.Assigned()
		p1, p2 := slices.Sorted(slices.Values(as[e.hits])), slices.Sorted(slices.Values(as[e.usHits]))
		if !slices.Equal(p1, p2) {
			t.Fatalf("%s holds %v of %s but %v of %s: not co-partitioned", name, p1, e.hits, p2, e.usHits)
		}
	}
	eventually(t, "every key counted", 30*time.Second, func() bool {
		got, _ := e.countsRecs.latest(t)
		return len(got) == 200
	})
	// More hits while both run, then A leaves.
	l2, r2 := randomHits(rng, "two", 200, time.Now().Add(-2*time.Second), time.Now(), testWindow)
	e.produce(e.hits, l2...)
	e.produce(e.usHits, r2...)
	stopA()
	left := time.Now().UnixMilli()
	eventually(t, "B owns everything and is ready", 60*time.Second, func() bool {
		return b.Ready() && len(b.Assigned()[e.hits]) == testPartitions && len(b.Assigned()[e.usHits]) == testPartitions
	})
	// A leaves the group as it stops: B takes its slots over within a rebalance and a
	// replay, not when A's session would have timed out.
	if took := time.Since(time.UnixMilli(left)); took > time.Second {
		t.Errorf("B owned everything %v after A stopped, want ≤ 1s (session timeout %v)", took, DefaultSessionTimeout)
	}
	readyAt := time.Now().UnixMilli()
	eventually(t, "B republished every key", 30*time.Second, func() bool {
		seen := map[string]bool{}
		for _, c := range e.countsRecs.counts(t) {
			if c.AsOf >= readyAt {
				seen[c.Key] = true
			}
		}
		return len(seen) == 200
	})
	// Every count B published once it owned everything includes all hits (both phases were
	// written before A left).
	n := e.checkExact(e.countsRecs.counts(t), cfg, func(c topics.Count) bool { return c.AsOf >= readyAt })
	if n == 0 || left > readyAt {
		t.Fatalf("checked %d counts", n)
	}
	if n < 200 {
		t.Fatalf("checked %d counts", n)
	}
}

// Hits of one key written to every partition by a foreign partitioner are counted once
// toward the one count, also after a restart replays the misrouted originals again.
func TestMisroutedHitsCountedOnce(t *testing.T) {
	t.Parallel()
	onKafkas(t, testMisroutedHitsCountedOnce)
}

func testMisroutedHitsCountedOnce(t *testing.T, e *env) {
	key := "misrouted|user=1"
	owner := topics.Partition([]byte(key), testPartitions)
	manual := newManualProducer(t, e)
	now := time.Now()
	var hs []topics.Hit
	var recs []*kgo.Record
	for p := range int32(testPartitions) {
		h := topics.Hit{Key: key, Site: "eu-1", BucketStart: now.Add(-time.Duration(p+1) * time.Second).UnixMilli(), Window: testWindow.Milliseconds(), Count: int64(p + 1)}
		v, _ := h.MarshalBinary()
		hs = append(hs, h)
		recs = append(recs, &kgo.Record{Topic: e.hits, Partition: p, Key: []byte(key), Value: v, Timestamp: h.BucketTime()})
	}
	if err := manual.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	e.remember(hs...)
	total := 0.0
	for _, h := range hs {
		total += float64(h.Count)
	}
	regA := prometheus.NewRegistry()
	cfg := e.config(regA)
	a, stopA := e.run(cfg)
	eventually(t, "full count", 60*time.Second, func() bool {
		got, _ := e.countsRecs.latest(t)
		return a.Ready() && got[key].Total == total
	})
	// At least one re-route per misrouted record (more if a rebalance replayed them).
	if got := metricValue(t, regA, "streamlimit_aggregator_rerouted_total"); got < testPartitions-1 {
		t.Fatalf("rerouted_total = %v, want ≥ %d (owner partition %d)", got, testPartitions-1, owner)
	}
	stopA()
	stopped := time.Now().UnixMilli()
	regB := prometheus.NewRegistry()
	b, _ := e.run(e.config(regB))
	eventually(t, "B ready and deduplicating the second copies", 60*time.Second, func() bool {
		return b.Ready() && metricValue(t, regB, "streamlimit_aggregator_rerouted_duplicates_total") >= testPartitions-1
	})
	eventually(t, "B publishes", 30*time.Second, func() bool {
		got, _ := e.countsRecs.latest(t)
		return got[key].AsOf > stopped
	})
	// A publishes the owner's own hit before the re-routed copies arrive, so its counts
	// may be partial, never more. B replays a log that already holds A's copies: every
	// count it publishes is exact.
	for _, c := range e.countsRecs.counts(t) {
		if c.Total > total {
			t.Fatalf("double count: %v > %v", c.Total, total)
		}
	}
	n := e.checkExact(e.countsRecs.counts(t), cfg, func(c topics.Count) bool { return c.AsOf > stopped })
	if n == 0 {
		t.Fatal("no counts")
	}
}

// newManualProducer returns a producer that writes each record to the partition it names,
// as a foreign partitioner would.
func newManualProducer(t *testing.T, e *env) *kgo.Client {
	t.Helper()
	return e.client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
}

// JSON hits written as raw bytes by a plain producer count like binary ones; "w" left out
// means DefaultWindow.
func TestJSONHits(t *testing.T) {
	t.Parallel()
	onKfake(t, testJSONHits)
}

func testJSONHits(t *testing.T, e *env) {
	now := time.Now().UnixMilli()
	raw := []struct {
		key, json string
		hit       topics.Hit
	}{
		{"json|a", fmt.Sprintf(`{"key":"json|a","site":"eu-1","ts":%d,"w":20000,"n":3}`, now-1000),
			topics.Hit{Key: "json|a", Site: "eu-1", BucketStart: now - 1000, Window: 20000, Count: 3}},
		{"json|a", fmt.Sprintf(`{"key":"json|a","site":"us-1","ts":%d,"w":20000}`, now-500),
			topics.Hit{Key: "json|a", Site: "us-1", BucketStart: now - 500, Window: 20000, Count: 1}},
		{"json|b", fmt.Sprintf(` {"key":"json|b","site":"eu-1","ts":%d,"n":2,"extra":true}`, now-200)[1:],
			topics.Hit{Key: "json|b", Site: "eu-1", BucketStart: now - 200, Window: testWindow.Milliseconds(), Count: 2}},
	}
	for _, r := range raw {
		e.produceRecords(&kgo.Record{Topic: e.hits, Key: []byte(r.key), Value: []byte(r.json)})
		e.remember(r.hit)
	}
	cfg := e.config(prometheus.NewRegistry())
	e.run(cfg)
	eventually(t, "both keys counted", 60*time.Second, func() bool {
		got, _ := e.countsRecs.latest(t)
		return got["json|a"].Total == 4 && got["json|b"].Total == 2
	})
	e.checkExact(e.countsRecs.counts(t), cfg, nil)
}

// A key with no hits for longer than its window ends as a tombstone once its site's demand
// has decayed too: published within a decay re-evaluation and an emission interval of that
// moment, and forgotten as it is.
func TestTombstone(t *testing.T) {
	t.Parallel()
	onKfake(t, testTombstone)
}

func testTombstone(t *testing.T, e *env) {
	cfg := e.config(prometheus.NewRegistry())
	a, _ := e.run(cfg)
	eventually(t, "ready", 60*time.Second, a.Ready)
	h := topics.Hit{Key: "tomb|x", Site: "eu-1", BucketStart: time.Now().UnixMilli(), Window: 2000, Count: 5}
	e.produce(e.hits, h)
	// The first moment the brute-force count is 0 (the hit has left the window) and the
	// site's demand is below the floor at which a site is listed: the counter has nothing
	// left to say.
	tau := topics.DemandTimeConstant.Milliseconds()
	var demand window.Decay
	demand.Add(h.BucketStart, h.Count, tau)
	gone := h.BucketStart
	for total, _ := e.reference(h.Key, h.Window, gone, cfg.SubBuckets, cfg.MaxClockSkew); total != 0 || demand.At(gone, tau) >= window.DemandFloor; {
		gone++
		total, _ = e.reference(h.Key, h.Window, gone, cfg.SubBuckets, cfg.MaxClockSkew)
	}
	eventually(t, "count", 30*time.Second, func() bool {
		got, _ := e.countsRecs.latest(t)
		return got[h.Key].Total == 5
	})
	var tomb *kgo.Record
	eventually(t, "tombstone", 30*time.Second, func() bool {
		for _, r := range e.countsRecs.all() {
			if string(r.Key) == h.Key && len(r.Value) == 0 {
				tomb = r
				return true
			}
		}
		return false
	})
	// The records' timestamps are the aggregator's clock when it published them: on
	// virtual time, the moment exactly.
	width := h.Window / int64(cfg.SubBuckets)
	latest := gone + max(width, cfg.EmitInterval.Milliseconds()) + cfg.EmitInterval.Milliseconds()
	at := tomb.Timestamp.UnixMilli()
	t.Logf("tombstone at %+d ms from the hit, nothing left to say from %+d ms", at-h.BucketStart, gone-h.BucketStart)
	if at < gone || at > latest {
		t.Errorf("tombstone at %+d ms from the hit, want from %+d ms (nothing left to say) to %+d ms",
			at-h.BucketStart, gone-h.BucketStart, latest-h.BucketStart)
	}
	if n := a.Keys(); n != 0 {
		t.Errorf("%d keys held once the tombstone is out, want 0", n)
	}
	if n := e.checkExact(e.countsRecs.counts(t), cfg, nil); n == 0 {
		t.Fatal("no count checked")
	}
	// Nothing of the key after its tombstone.
	time.Sleep(2 * time.Duration(h.Window) * time.Millisecond)
	for _, r := range e.countsRecs.all() {
		if string(r.Key) == h.Key && r.Offset > tomb.Offset {
			t.Fatalf("a record of %s after its tombstone: %q", h.Key, r.Value)
		}
	}
}

// Bad records of each kind are skipped and counted by reason (and copied to the dead-letter
// topic); valid hits around them are counted.
func TestBadRecords(t *testing.T) {
	t.Parallel()
	onKfake(t, testBadRecords)
}

func testBadRecords(t *testing.T, e *env) {
	dlt := e.hits + "-dlt"
	e.createTopic(dlt, 1, nil)
	reg := prometheus.NewRegistry()
	cfg := e.config(reg)
	cfg.DeadLetterTopic = dlt
	a, _ := e.run(cfg)
	eventually(t, "ready", 60*time.Second, a.Ready)
	now := time.Now().UnixMilli()
	long := strings.Repeat("k", topics.MaxKeyLen+1)
	bad := map[string][]byte{
		"unknown_version": {0x7f, 1, 2},
		"truncated":       {1, 5},
		"bad_json":        []byte(`{"key":`),
		"key_too_long":    fmt.Appendf(nil, `{"key":%q,"site":"eu-1","ts":%d}`, long, now),
		"bad_count":       fmt.Appendf(nil, `{"key":"bad|c","site":"eu-1","ts":%d,"n":0}`, now),
		"empty_site":      fmt.Appendf(nil, `{"key":"bad|s","site":"","ts":%d}`, now),
		"too_far_future":  fmt.Appendf(nil, `{"key":"bad|f","site":"eu-1","ts":%d}`, now+time.Hour.Milliseconds()),
		"too_old":         fmt.Appendf(nil, `{"key":"bad|o","site":"eu-1","ts":%d,"w":1000}`, now-time.Minute.Milliseconds()),
		"window_too_long": fmt.Appendf(nil, `{"key":"bad|w","site":"eu-1","ts":%d,"w":3600000}`, now),
	}
	good := topics.Hit{Key: "good|1", Site: "eu-1", BucketStart: now, Window: testWindow.Milliseconds(), Count: 1}
	e.produce(e.hits, good)
	for _, v := range bad {
		e.produceRecords(&kgo.Record{Topic: e.hits, Key: []byte("bad"), Value: v})
	}
	good.Count = 2
	e.produce(e.hits, good)
	eventually(t, "every bad record counted", 30*time.Second, func() bool {
		for reason := range bad {
			if metricValue(t, reg, "streamlimit_aggregator_bad_records_total", "reason", reason) != 1 {
				return false
			}
		}
		return true
	})
	eventually(t, "good hits counted", 30*time.Second, func() bool {
		got, _ := e.countsRecs.latest(t)
		return got["good|1"].Total == 3
	})
	// Dead letters carry the reason.
	dl := e.client(kgo.ConsumeTopics(dlt), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	reasons := map[string]bool{}
	eventually(t, "dead letters", 30*time.Second, func() bool {
		fs := dl.PollRecords(t.Context(), 100)
		fs.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == HeaderReason {
					reasons[string(h.Value)] = true
				}
			}
		})
		return len(reasons) == len(bad)
	})
}

// TestPatternPicksUpNewDataCenter: a data center's "<dc>.hits" that MirrorMaker 2 creates
// after the aggregator started is consumed within MetadataMaxAge, so that data center's
// hits join the global count.
func TestPatternPicksUpNewDataCenter(t *testing.T) {
	t.Parallel()
	onKfake(t, testPatternPicksUpNewDataCenter)
}

func testPatternPicksUpNewDataCenter(t *testing.T, e *env) {
	cfg := e.config(prometheus.NewRegistry())
	cfg.Topics, cfg.TopicPattern = nil, topics.HitsPattern(e.hits)
	cfg.MetadataMaxAge = 2 * time.Second
	e.run(cfg)
	now := time.Now().UnixMilli()
	e.produce(e.hits, topics.Hit{Key: "dc|k", Site: "eu", BucketStart: now, Window: 20000, Count: 2})
	eventually(t, "local hits counted", 60*time.Second, func() bool {
		got, _ := e.countsRecs.latest(t)
		return got["dc|k"].Total == 2
	})

	ap := topics.RemoteHitsTopic("ap", e.hits)
	var tc topics.Config
	tc, _ = tc.Normalize()
	e.createTopic(ap, testPartitions, tc.HitsConfigs())
	created := time.Now()
	e.produce(ap, topics.Hit{Key: "dc|k", Site: "ap", BucketStart: time.Now().UnixMilli(), Window: 20000, Count: 5})
	eventually(t, "the new data center's hits counted", 60*time.Second, func() bool {
		got, _ := e.countsRecs.latest(t)
		c := got["dc|k"]
		return c.Total == 7 && c.Site("ap") == 5
	})
	// Within MetadataMaxAge, and a second for the rebalance that adds the topic, its
	// positioning and the next emission: exactly so on virtual time.
	if took := time.Since(created); took > cfg.MetadataMaxAge+time.Second {
		t.Errorf("the new data center's hits counted %v after its topic was created, want ≤ %v", took, cfg.MetadataMaxAge+time.Second)
	}
}

// Hit batches (several hits of one site in one record, as the producer writes them) count
// exactly as the same hits in records of their own: a batch on the partition that owns its
// keys is counted where it is, the hits of a batch on another partition are re-routed one by
// one and counted once, a hit of a batch that is too old is skipped and counted (its dead
// letter a hit record of its own) while the rest of the batch counts, a batch that does not
// decode is skipped whole, and records_in_total counts hit records.
func TestHitBatches(t *testing.T) {
	t.Parallel()
	onKfake(t, testHitBatches)
}

func testHitBatches(t *testing.T, e *env) {
	dlt := e.hits + "-dlt"
	e.createTopic(dlt, 1, nil)
	// Running before the batches arrive: a too old hit is bad then, not a hit a replay
	// expects.
	reg := prometheus.NewRegistry()
	cfg := e.config(reg)
	cfg.DeadLetterTopic = dlt
	a, _ := e.run(cfg)
	eventually(t, "ready", 60*time.Second, a.Ready)
	now := time.Now()
	w := testWindow.Milliseconds()
	byPart := map[int32][]topics.Hit{}
	var all []topics.Hit
	for i := range 40 {
		h := topics.Hit{Key: fmt.Sprintf("batch|user=%d", i), Site: "eu-1", BucketStart: now.Add(-time.Duration(i%5) * time.Second).UnixMilli(), Window: w, Count: int64(1 + i%3), Denied: int64(i % 2)}
		q := topics.Partition([]byte(h.Key), testPartitions)
		byPart[q] = append(byPart[q], h)
		all = append(all, h)
	}
	batch := func(hs ...topics.Hit) []byte {
		v, err := topics.AppendHitBatch(nil, "eu-1")
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			if v, err = h.AppendToBatch(v); err != nil {
				t.Fatal(err)
			}
		}
		return v
	}
	var recs []*kgo.Record
	records := 0
	// The hits of partition 0 and 1 in batches on their own partitions; those of the
	// other partitions in one batch on partition 0, with a too old hit among them.
	for q := range int32(2) {
		recs = append(recs, &kgo.Record{Topic: e.hits, Partition: q, Key: []byte(topics.HitBatchKey), Value: batch(byPart[q]...), Timestamp: now})
		records += len(byPart[q])
	}
	old := topics.Hit{Key: "batch|old", Site: "eu-1", BucketStart: now.Add(-time.Minute).UnixMilli(), Window: 1000, Count: 9}
	var misrouted []topics.Hit
	for q := int32(2); q < testPartitions; q++ {
		misrouted = append(misrouted, byPart[q]...)
	}
	mixed := append(append([]topics.Hit{}, misrouted[:len(misrouted)/2]...), append([]topics.Hit{old}, misrouted[len(misrouted)/2:]...)...)
	recs = append(recs, &kgo.Record{Topic: e.hits, Partition: 0, Key: []byte(topics.HitBatchKey), Value: batch(mixed...), Timestamp: now})
	records += len(mixed)
	// A batch cut short: skipped whole.
	cut := batch(topics.Hit{Key: "batch|cut", Site: "eu-1", BucketStart: now.UnixMilli(), Window: w, Count: 5})
	recs = append(recs, &kgo.Record{Topic: e.hits, Partition: 1, Key: []byte(topics.HitBatchKey), Value: cut[:len(cut)-2], Timestamp: now})
	records++
	if err := newManualProducer(t, e).ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	e.remember(all...)
	want := map[string]float64{}
	for _, h := range all {
		want[h.Key] += float64(h.Count)
	}
	eventually(t, "every key of the batches counted", 60*time.Second, func() bool {
		got, _ := e.countsRecs.latest(t)
		for k, n := range want {
			if got[k].Total != n {
				return false
			}
		}
		return a.Ready()
	})
	got, _ := e.countsRecs.latest(t)
	if _, ok := got["batch|cut"]; ok {
		t.Fatal("a hit of a batch cut short was counted")
	}
	for _, c := range e.countsRecs.counts(t) {
		if c.Total > want[c.Key] {
			t.Fatalf("%s counted %v, more than its %v hits", c.Key, c.Total, want[c.Key])
		}
	}
	e.checkExact(e.countsRecs.counts(t), cfg, func(c topics.Count) bool { return strings.HasPrefix(c.Key, "batch|user=") })
	if n := metricValue(t, reg, "streamlimit_aggregator_rerouted_total"); n < float64(len(misrouted)) {
		t.Errorf("rerouted_total = %v, want ≥ %d", n, len(misrouted))
	}
	for reason, n := range map[string]float64{ReasonTooOld: 1, "truncated": 1} {
		if got := metricValue(t, reg, "streamlimit_aggregator_bad_records_total", "reason", reason); got != n {
			t.Errorf("bad_records_total{reason=%q} = %v, want %v", reason, got, n)
		}
	}
	// Every hit record once, and each re-routed hit once more on its owner's partition.
	if n := metricValue(t, reg, "streamlimit_aggregator_records_in_total"); n < float64(records+len(misrouted)) {
		t.Errorf("records_in_total = %v, want ≥ %d hit records", n, records+len(misrouted))
	}
	dl := e.client(kgo.ConsumeTopics(dlt), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	letters := map[string]string{}
	eventually(t, "dead letters", 30*time.Second, func() bool {
		dl.PollRecords(t.Context(), 100).EachRecord(func(r *kgo.Record) {
			if topics.IsHitBatch(r.Value) {
				letters["batch"] = "batch"
				return
			}
			h, err := topics.DecodeHit(r.Value)
			if err == nil && string(r.Key) == h.Key && h == old {
				letters[h.Key] = "hit"
			}
		})
		return len(letters) == 2
	})
}
