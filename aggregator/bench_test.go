package aggregator

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

// BenchmarkEndToEnd writes hitsPerRun binary hits of endToEndKeys keys to a 4-partition
// topic, then reads them twice: with a raw franz-go consumer (no decoding) and with an
// Aggregator replaying the topic (decode, validate, count). It reports both rates in
// hits/s and their ratio, and the ratio of the CPU time each took. Each side's rate is
// timed from its first partition positioning to its last record, so group join time is
// left out. records=hits writes one record per hit, as producers in other languages (and
// streamlimit's with SingleHitRecords) do; records=batches writes them in hit batches of
// endToEndBatch hits, as streamlimit's producer does.
func BenchmarkEndToEnd(b *testing.B) {
	for _, batch := range []int{1, endToEndBatch} {
		name := "records=hits"
		if batch > 1 {
			name = "records=batches"
		}
		b.Run(name, func(b *testing.B) { endToEnd(b, batch) })
	}
}

// endToEndBatch is the hits per batch of BenchmarkEndToEnd/records=batches: what the
// producer's hit batches hold at the serving bench's load (some 4 000 counts a flush over
// four partitions, in batches of at most 16 KiB).
const endToEndBatch = 500

func endToEnd(b *testing.B, batch int) {
	const hitsPerRun, endToEndKeys = 1_000_000, 100_000
	brokers := testenv.Brokers(b)
	var tc topics.Config
	tc, _ = tc.Normalize()
	hits := testenv.CreateTopic(b, "hits", testPartitions, tc.HitsConfigs())
	counts := testenv.CreateTopic(b, "counts", testPartitions, tc.CountsConfigs())
	prod := testenv.KafkaClient(b, kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(100_000),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	now := time.Now()
	sites := []string{"eu-1", "us-1", "ap-1"}
	ctx := context.Background()
	// Per partition and site, the batch being filled.
	type open struct {
		v []byte
		n int
	}
	pending := map[[2]int32]*open{}
	records := 0
	send := func(q int32, o *open) {
		records++
		prod.Produce(ctx, &kgo.Record{Topic: hits, Partition: q, Key: []byte(topics.HitBatchKey), Value: o.v, Timestamp: now}, nil)
	}
	for i := range hitsPerRun {
		site := i % 3
		h := topics.Hit{Key: "bench|user=" + strconv.Itoa(i%endToEndKeys), Site: sites[site],
			BucketStart: now.Add(-time.Duration(hitsPerRun-i) * 30 * time.Microsecond).UnixMilli(), Window: 60_000, Count: 1}
		q := topics.Partition([]byte(h.Key), testPartitions)
		if batch == 1 {
			v, _ := h.MarshalBinary()
			records++
			prod.Produce(ctx, &kgo.Record{Topic: hits, Partition: q, Key: []byte(h.Key), Value: v, Timestamp: h.BucketTime()}, nil)
			continue
		}
		k := [2]int32{q, int32(site)}
		o := pending[k]
		if o == nil {
			o = &open{}
			o.v, _ = topics.AppendHitBatch(nil, h.Site)
			pending[k] = o
		}
		o.v, _ = h.AppendToBatch(o.v)
		if o.n++; o.n == batch {
			send(q, o)
			delete(pending, k)
		}
	}
	for k, o := range pending {
		send(k[0], o)
	}
	if err := prod.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	var rawRate, aggRate, cpuRatio, aggCPU, rawCPUHit float64
	for b.Loop() {
		// Raw consumer.
		start, cpu0 := time.Now(), processCPU()
		cl := testenv.KafkaClient(b, kgo.ConsumeTopics(hits), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		n := 0
		for n < records {
			fs := cl.PollRecords(ctx, 10000)
			fs.EachRecord(func(*kgo.Record) { n++ })
		}
		rawRate = hitsPerRun / time.Since(start).Seconds()
		rawCPU := processCPU() - cpu0
		cl.Close()
		// Aggregator replay.
		a, err := New(Config{Brokers: brokers, Group: testenv.TopicName(b, "g"), Topics: []string{hits}, CountsTopic: counts,
			MaxWindow: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		cpu0 = processCPU()
		go func() { done <- a.Run(rctx) }()
		for !a.Ready() {
			time.Sleep(10 * time.Millisecond)
		}
		if rawCPU > 0 {
			replayCPU := processCPU() - cpu0
			cpuRatio = float64(replayCPU) / float64(rawCPU)
			aggCPU, rawCPUHit = float64(replayCPU.Nanoseconds())/hitsPerRun, float64(rawCPU.Nanoseconds())/hitsPerRun
		}
		a.mu.Lock()
		var first, last time.Time
		for _, ps := range a.parts {
			if first.IsZero() || ps.assignedAt.Before(first) {
				first = ps.assignedAt
			}
			if ps.replayedAt.After(last) {
				last = ps.replayedAt
			}
		}
		keys := a.st.size()
		a.mu.Unlock()
		cancel()
		<-done
		if keys != endToEndKeys {
			b.Fatalf("aggregator holds %d keys, want %d", keys, endToEndKeys)
		}
		aggRate = hitsPerRun / last.Sub(first).Seconds()
	}
	b.ReportMetric(rawRate, "raw_hits/s")
	b.ReportMetric(aggRate, "agg_hits/s")
	b.ReportMetric(aggRate/rawRate, "ratio")
	// The CPU the process spent replaying (from Run until Ready, group join included) over
	// what it spent in the raw read: unlike the rates, it hardly moves with what else the
	// machine runs. 0 where the platform does not tell (processCPU).
	b.ReportMetric(cpuRatio, "cpu_agg/raw")
	// The same CPU times per hit: what one core's worth of aggregator or raw consumer
	// spends on a hit (docs/scaling.md plans the aggregator tier with it).
	b.ReportMetric(aggCPU, "agg_cpu_ns/hit")
	b.ReportMetric(rawCPUHit, "raw_cpu_ns/hit")
}

// memoryPerCounter returns the heap per counter (with its bookkeeping) of a state holding
// keys counters of a 1-minute window in 60 sub-buckets, each hit from nsites sites in
// buckets consecutive sub-buckets.
func memoryPerCounter(keys, nsites, buckets int) float64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s := newState(stateConfig{subBuckets: 60, maxSkew: 30 * time.Second, maxKeys: 1 << 20, emitInterval: 100, maxSpecs: 16})
	now := time.Now().UnixMilli()
	start := now - int64(buckets-1)*1000
	for i := range keys {
		for b := range buckets {
			for k := range nsites {
				h := topics.Hit{Key: "api:POST /articles|user=" + strconv.Itoa(i), Site: []string{"eu-1", "us-1", "ap-1"}[k], BucketStart: start + int64(b)*1000, Window: 60_000, Count: 1}
				s.add(now, 0, &h, "", 0)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(s)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(keys)
}

// Memory goals per (key, site), 1-minute window in 60 sub-buckets: a key hit in one
// sub-bucket (memoryBudgetOnce), and a key hit in every one of them (memoryBudget: 64 B plus
// 4 B per sub-bucket). A counter's own bookkeeping (entry, key, index) takes at most
// memoryBookkeeping more.
const (
	memoryBudgetOnce = 128
	// memoryCounterOnce bounds a counter hit once with one site, with its entry, key and
	// index: the (key, site) itself and its bookkeeping in one budget.
	memoryCounterOnce = 128
	memoryBudget      = 64 + 4*60
	memoryBookkeeping = 224
	memoryKeysOnce    = 100_000
	memoryKeysFull    = 20_000
)

// memoryFigures measures a counter with one and with three sites, hit in one sub-bucket and
// in all 60, and returns the bytes per counter with one site and per extra (key, site).
func memoryFigures() (onceOne, oncePerSite, fullOne, fullPerSite float64) {
	one, three := memoryPerCounter(memoryKeysOnce, 1, 1), memoryPerCounter(memoryKeysOnce, 3, 1)
	onceOne, oncePerSite = one, (three-one)/2
	one, three = memoryPerCounter(memoryKeysFull, 1, 60), memoryPerCounter(memoryKeysFull, 3, 60)
	return onceOne, oncePerSite, one, (three - one) / 2
}

// TestMemoryPerCounter checks the aggregator's heap per counter, with one and with three
// sites, against the goals: memory follows the sub-buckets a key has hits in, from
// memoryCounterOnce for a key hit once at one site (with its bookkeeping) and
// memoryBudgetOnce per further site, to memoryBudget per (key, site) for a key hit in every
// sub-bucket, with a counter's own bookkeeping in at most memoryBookkeeping more.
func TestMemoryPerCounter(t *testing.T) {
	onceOne, oncePerSite, fullOne, fullPerSite := memoryFigures()
	t.Logf("window 1m / 60 sub-buckets, hit in one sub-bucket: %.0f B per counter with 1 site, %.0f B per extra site; hit in all 60: %.0f B and %.0f B",
		onceOne, oncePerSite, fullOne, fullPerSite)
	if oncePerSite > memoryBudgetOnce || onceOne > memoryCounterOnce {
		t.Errorf("a key hit once: %.0f B with 1 site (budget %d B), %.0f B per extra site (budget %d B per (key, site))",
			onceOne, memoryCounterOnce, oncePerSite, memoryBudgetOnce)
	}
	if fullPerSite > memoryBudget || fullOne > memoryBudget+memoryBookkeeping {
		t.Errorf("a key hit in every sub-bucket: %.0f B with 1 site, %.0f B per extra site (budget %d B per (key, site))", fullOne, fullPerSite, memoryBudget)
	}
}

// BenchmarkMemoryPerCounter reports what TestMemoryPerCounter measures, for
// docs/benchmarks.md: bytes per counter with one site and per extra (key, site), for a key
// hit once and (full-) for a key hit in every sub-bucket, and the goals per (key, site).
func BenchmarkMemoryPerCounter(b *testing.B) {
	var onceOne, oncePerSite, fullOne, fullPerSite float64
	for b.Loop() {
		onceOne, oncePerSite, fullOne, fullPerSite = memoryFigures()
	}
	b.ReportMetric(onceOne, "B/counter")
	b.ReportMetric(memoryCounterOnce, "goal-B/counter")
	b.ReportMetric(oncePerSite, "B/key-site")
	b.ReportMetric(memoryBudgetOnce, "goal-B/key-site")
	b.ReportMetric(fullOne, "full-B/counter")
	b.ReportMetric(fullPerSite, "full-B/key-site")
	b.ReportMetric(memoryBudget, "full-goal-B/key-site")
}
