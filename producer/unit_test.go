package producer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/topics"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// Kafka's UtilsTest.testMurmur2 vectors, checked against the independent transcription the
// tests use to predict partitions.
func TestJavaMurmur2Vectors(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int32
	}{
		{"21", -973932308},
		{"foobar", -790332482},
		{"a-little-bit-long-string", -985981536},
		{"a-little-bit-longer-string", -1486304829},
		{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
		{"abc", 479470107},
	} {
		if got := javaMurmur2([]byte(c.in)); got != c.want {
			t.Errorf("javaMurmur2(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

// The partitioner the Producer configures places keys where Java's default partitioner
// does. Partitions are asserted on records a real broker stored in TestConcurrentHitsExact.
func TestPartitionerMatchesJava(t *testing.T) {
	part := kgo.StickyKeyPartitioner(nil).ForTopic("hits")
	for _, n := range []int{1, 3, 4, 7, 12} {
		for i := range 500 {
			key := fmt.Sprintf("api:POST /articles|user=%d", i)
			r := &kgo.Record{Key: []byte(key)}
			if !part.RequiresConsistency(r) {
				t.Fatal("keyed records must be placed consistently")
			}
			if got, want := int32(part.Partition(r, n)), javaPartition([]byte(key), int32(n)); got != want {
				t.Fatalf("key %q over %d partitions: partitioner %d, Java %d", key, n, got, want)
			}
		}
	}
}

func newFake(t testing.TB, partitions int32, topic string) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{Site: "eu"},
		{Brokers: []string{"x:1"}},
		{Brokers: []string{"x:1"}, Site: strings.Repeat("s", topics.MaxSiteLen+1)},
		{Brokers: []string{"x:1"}, Site: "eu", BucketWidth: 1500 * time.Microsecond},
		{Brokers: []string{"x:1"}, Site: "eu", MaxBufferedKeys: -1},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("New(%+v) = %v, want ErrBadConfig", cfg, err)
		}
	}
}

// Hits are bucketed on the injected clock, counted per (key, window), and invalid input is
// counted, not sent.
func TestBucketsWindowsAndInvalidInput(t *testing.T) {
	c := newFake(t, 3, "hits")
	clk := clock.NewFake(time.UnixMilli(1_763_740_000_150))
	reg := prometheus.NewRegistry()
	p, err := New(Config{Brokers: c.ListenAddrs(), Site: "eu-1", Clock: clk, FlushInterval: -1,
		Logger: discard, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	p.Hit("k", time.Minute, 2)
	p.Hit("k", time.Hour, 5)
	clk.Advance(40 * time.Millisecond) // 190: same bucket
	p.Hit("k", time.Minute, 3)
	clk.Advance(20 * time.Millisecond) // 210: next bucket
	p.Hit("k", time.Minute, 7)
	p.HitAt("k", time.Minute, time.UnixMilli(-250), 1) // before the epoch: bucket -300
	p.Hit("", time.Minute, 1)
	p.Hit("k", 0, 1)
	p.Hit("k", time.Minute, 0)
	p.Hit(topics.ReservedPrefix+"x", time.Minute, 1)
	p.Hit(strings.Repeat("k", topics.MaxKeyLen+1), time.Minute, 1)
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := readTopic(t, c.ListenAddrs(), "hits")
	type rec struct {
		w, b, n int64
	}
	want := map[rec]bool{{60000, 1_763_740_000_100, 5}: true, {3600000, 1_763_740_000_100, 5}: true,
		{60000, 1_763_740_000_200, 7}: true, {60000, -300, 1}: true}
	if len(got.hits) != len(want) {
		t.Fatalf("got %d records %+v, want %d", len(got.hits), got.hits, len(want))
	}
	for _, h := range got.hits {
		if !want[rec{h.Window, h.BucketStart, h.Count}] || h.Site != "eu-1" || h.Key != "k" {
			t.Errorf("unexpected record %+v", h)
		}
	}
	st := p.Stats()
	if st.InvalidHits != 5 || st.HitsIn != 18 || st.RecordsOut != 4 || st.DroppedHits != 0 {
		t.Errorf("stats %+v", st)
	}
	p.Hit("k", time.Minute, 1)
	if st := p.Stats(); st.DroppedHits != 1 {
		t.Errorf("hit after Close: dropped %d, want 1", st.DroppedHits)
	}
	if err := p.Close(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close = %v, want ErrClosed", err)
	}
	// The metrics read the same numbers.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		switch {
		case m.Counter != nil:
			for _, m := range mf.GetMetric() { // every reason of dropped_hits_total
				vals[mf.GetName()] += m.Counter.GetValue()
			}
		case m.Gauge != nil:
			vals[mf.GetName()] = m.Gauge.GetValue()
		case m.Histogram != nil:
			vals[mf.GetName()] = float64(m.Histogram.GetSampleCount())
		}
	}
	for name, want := range map[string]float64{
		"streamlimit_producer_hits_in_total": 18, "streamlimit_producer_records_out_total": 4,
		"streamlimit_producer_dropped_hits_total": 1, "streamlimit_producer_invalid_hits_total": 5,
		"streamlimit_producer_bytes_out_total": float64(st.BytesOut),
	} {
		if vals[name] != want {
			t.Errorf("%s = %v, want %v", name, vals[name], want)
		}
	}
	if vals["streamlimit_producer_flush_duration_seconds"] < 1 {
		t.Error("flush_duration_seconds has no observations")
	}
	if _, ok := vals["streamlimit_producer_buffered_keys"]; !ok {
		t.Error("buffered_keys not registered")
	}
}

// The background flush sends only finished buckets, so a counter hit steadily makes one
// record per bucket; idle counters are evicted.
func TestBackgroundFlushFinishedBucketsAndEviction(t *testing.T) {
	c := newFake(t, 1, "hits")
	clk := clock.NewFake(time.UnixMilli(1_000_000))
	p, err := New(Config{Brokers: c.ListenAddrs(), Site: "eu", Clock: clk, FlushInterval: -1,
		IdleTimeout: time.Second, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	for range 10 { // 10 buckets, 5 flushes per bucket
		for range 5 {
			for range 20 {
				p.Hit("a", 6*time.Second, 1) // sub-buckets of 100 ms: one per bucket
			}
			p.flush(false)
			clk.Advance(20 * time.Millisecond)
		}
	}
	p.flush(false)
	if err := p.cl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.RecordsOut != 10 || st.BufferedKeys != 1 {
		t.Fatalf("after 10 buckets: %+v, want 10 records and 1 known counter", st)
	}
	clk.Advance(2 * time.Second)
	for range numShards {
		p.flush(false) // the idle sweep visits one shard per flush
	}
	if st := p.Stats(); st.BufferedKeys != 0 {
		t.Fatalf("idle counter not evicted: %+v", st)
	}
	got := readTopic(t, c.ListenAddrs(), "hits")
	if got.records != 10 || got.counts[counter{"a", 6000}] != 1000 {
		t.Fatalf("read %d records, counts %v", got.records, got.counts)
	}
}

// A Hit on a known counter does not allocate.
func TestHitDoesNotAllocate(t *testing.T) {
	c := newFake(t, 1, "hits")
	p, err := New(Config{Brokers: c.ListenAddrs(), Site: "eu", Clock: clock.NewFake(time.UnixMilli(0)),
		FlushInterval: -1, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
		p.Hit(keys[i], time.Minute, 1)
	}
	i := 0
	if a := testing.AllocsPerRun(1000, func() {
		p.Hit(keys[i%len(keys)], time.Minute, 1)
		i++
	}); a != 0 {
		t.Fatalf("Hit allocates %v times per call", a)
	}
}

// Buckets are cut at the sub-bucket boundaries of the hit's window, so that every record
// lies in one sub-bucket of the aggregator: a 1 s window has 17 ms sub-buckets, and 100 ms
// of hits every millisecond make one record per piece of the 100 ms bucket that a
// sub-bucket boundary cuts.
func TestBucketsCutAtSubBuckets(t *testing.T) {
	c := newFake(t, 1, "hits")
	clk := clock.NewFake(time.UnixMilli(1_000_000))
	p, err := New(Config{Brokers: c.ListenAddrs(), Site: "eu", Clock: clk, FlushInterval: -1, Logger: discard, SiteHeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	cells := map[[2]int64]bool{}
	for ms := int64(1_000_000); ms < 1_000_100; ms++ {
		clk.Set(time.UnixMilli(ms))
		p.Hit("a", time.Second, 1)
		cells[[2]int64{ms / 100, ms / 17}] = true
	}
	clk.Advance(time.Second)
	p.flush(false)
	if err := p.cl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := readTopic(t, c.ListenAddrs(), "hits")
	if got.records != len(cells) || got.counts[counter{"a", 1000}] != 100 {
		t.Fatalf("%d records, counts %v; want %d records", got.records, got.counts, len(cells))
	}
	for _, h := range got.hits {
		// The record's start and the last millisecond of its piece are in one sub-bucket.
		if h.BucketStart/17 != (h.BucketStart+h.Count-1)/17 {
			t.Fatalf("record %+v straddles a sub-bucket boundary", h)
		}
	}
}

// Denied requests travel in the same records as hits, as a version 2 hit, and count toward
// nothing but demand.
func TestDenied(t *testing.T) {
	c := newFake(t, 1, "hits")
	clk := clock.NewFake(time.UnixMilli(1_000_000))
	p, err := New(Config{Brokers: c.ListenAddrs(), Site: "eu", Clock: clk, FlushInterval: -1, Logger: discard, SiteHeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	p.Hit("a", 6*time.Second, 2)
	p.Denied("a", 6*time.Second, 5)
	p.Denied("b", 6*time.Second, 1)
	clk.Advance(time.Second)
	p.flush(false)
	if err := p.cl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := readTopic(t, c.ListenAddrs(), "hits")
	byKey := map[string]topics.Hit{}
	for _, h := range got.hits {
		byKey[h.Key] = h
	}
	if a, b := byKey["a"], byKey["b"]; got.records != 2 || a.Count != 2 || a.Denied != 5 || b.Count != 0 || b.Denied != 1 {
		t.Fatalf("records %+v", got.hits)
	}
}

// A site heartbeat stamped during a bucket does not pass that bucket: a hit the same
// millisecond after the flush lands in a bucket that started before the flush's time, and
// follows the heartbeat on its partition. The heartbeat claims no more than that bucket's
// start, which costs the aggregator's view of the site nothing more.
func TestSiteHeartbeatDoesNotPassTheCurrentBucket(t *testing.T) {
	c := newFake(t, 1, "hits")
	clk := clock.NewFake(time.UnixMilli(1_000_031)) // 1 ms into a 10 ms bucket
	p, err := New(Config{Brokers: c.ListenAddrs(), Site: "eu", Clock: clk, FlushInterval: -1,
		BucketWidth: 10 * time.Millisecond, SiteHeartbeatInterval: time.Millisecond, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	p.Hit("learn", time.Minute, 1) // a record, so that the heartbeats learn the partition count
	p.flush(true)
	if err := p.cl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Millisecond)
	p.flush(false) // a heartbeat, nothing held
	p.Hit("k", time.Minute, 1)
	p.Denied("k", time.Minute, 1)
	clk.Advance(2 * time.Millisecond)
	p.flush(true)
	if err := p.cl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := readTopic(t, c.ListenAddrs(), "hits")
	var last int64 = -1
	for _, h := range got.seq[0] {
		if h.IsSiteHeartbeat() {
			last = h.BucketStart
			continue
		}
		if h.BucketStart < last {
			t.Fatalf("hit %+v after a heartbeat at %d", h, last)
		}
	}
	if last != 1_000_030 {
		t.Fatalf("last heartbeat at %d, want the current bucket's start 1000030 (records %+v)", last, got.seq[0])
	}
}

// Close writes a site leave record to every partition after the instance's last hits, so
// that the aggregators learn it stopped at once; with site heartbeats off it writes none.
func TestCloseLeavesEveryPartition(t *testing.T) {
	for _, heartbeats := range []bool{true, false} {
		c := newFake(t, 3, "hits")
		clk := clock.NewFake(time.UnixMilli(1_763_740_000_150))
		cfg := Config{Brokers: c.ListenAddrs(), Site: "eu-1", Instance: "pod-7", Clock: clk, FlushInterval: -1, Logger: discard}
		if !heartbeats {
			cfg.SiteHeartbeatInterval = -1
		}
		p, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 30 {
			p.Hit(fmt.Sprintf("k%d", i), time.Minute, 1)
		}
		p.flush(false) // a heartbeat, so that the producer learns the partition count
		clk.Advance(time.Second)
		p.Hit("late", time.Minute, 1)
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		got := readTopic(t, c.ListenAddrs(), "hits")
		if !heartbeats {
			if len(got.leaves) != 0 {
				t.Fatalf("heartbeats off: leave records %v", got.leaves)
			}
			continue
		}
		if len(got.leaves) != 3 {
			t.Fatalf("leave records on %d partitions, want 3: %v", len(got.leaves), got.leaves)
		}
		for part, seq := range got.seq {
			last := seq[len(seq)-1]
			if !last.IsSiteLeave() || last.Site != "eu-1" || last.Instance != "pod-7" || last.BucketStart != clk.Now().UnixMilli() {
				t.Fatalf("partition %d ends with %+v, want the leave of eu-1/pod-7 at %d", part, last, clk.Now().UnixMilli())
			}
		}
	}
}
