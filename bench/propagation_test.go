package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/producer"
	"github.com/streamlimit/streamlimit/serve/server"
	"github.com/streamlimit/streamlimit/topics"
)

// propagationRules is one global rule, the production case, with a limit high enough that
// every sample is admitted.
const propagationRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {name: per-minute, unit: minute, requests_per_unit: 1000000000}
`

// propagationSamples is the number of fresh keys, one hit each, timed per run.
const propagationSamples = 400

// sample is the life of one hit from site A to site B's snapshot, in wall-clock instants
// of this process (all parts run in it, so they share the clock).
type sample struct {
	key         string    // counter key
	decided     time.Time // Decide at A returned (admitted, handed to A's producer)
	bucketStart int64     // unix ms: the producer's bucket, from the hit record
	hitSeen     time.Time // an observer consumer read the hit from the hits topic
	asOf        int64     // unix ms: the aggregator's instant of the first count ≥ 1
	countSeen   time.Time // the observer read that count from the counts topic
	visible     time.Time // B's snapshot.Get returned a count ≥ 1
}

// BenchmarkPropagation measures how long a hit admitted at site A takes to be visible in
// site B's snapshot on the real broker: enforcer server A (its Limiter and producer, all
// defaults: 100 ms buckets, flushed just after they end) → hits topic → an aggregator
// (defaults: emission every 100 ms) → counts topic → enforcer server B's snapshot. Each
// sample is a fresh key decided once at A, with 5–25 ms (random) between samples so that
// they fall anywhere in a bucket; B's snapshot is polled every 1 ms. Sampling starts once
// warm-up hits have shown at B. An observer consumer on both topics splits the delay into
// stages, reported as means in ms (they add up to mean-ms):
//
//	bucket-ms  Decide → end of the producer's bucket (a hit leaves once its bucket is over)
//	flush-ms   → the hit readable in the hits topic (the flush 1 ms after the bucket's end,
//	           2 ms linger, produce, fetch)
//	agg-ms     → the aggregator's count instant (its fetch, wait for the 100 ms emission)
//	counts-ms  → the count readable in the counts topic (produce with 5 ms linger, fetch)
//	snap-ms    → visible in B's snapshot (B's fetch and apply, 1 ms polling)
func BenchmarkPropagation(b *testing.B) {
	brokers := testenv.Brokers(b)
	var tc topics.Config
	tc, _ = tc.Normalize()
	hits := testenv.CreateTopic(b, "hits", 4, tc.HitsConfigs())
	counts := testenv.CreateTopic(b, "counts", 4, tc.CountsConfigs())
	rulesPath := filepath.Join(b.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(propagationRules), 0o644); err != nil {
		b.Fatal(err)
	}
	rcfg, err := rules.LoadFile(rulesPath)
	if err != nil {
		b.Fatal(err)
	}
	discard := slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	b.Cleanup(func() { cancel(); wg.Wait() })

	agg, err := aggregator.New(aggregator.Config{Brokers: brokers, Group: testenv.TopicName(b, "agg"),
		Topics: []string{hits}, CountsTopic: counts, Logger: discard})
	if err != nil {
		b.Fatal(err)
	}
	wg.Go(func() {
		if err := agg.Run(ctx); err != nil {
			b.Errorf("aggregator: %v", err)
		}
	})
	site := func(name string) *server.Server {
		s, err := server.New(server.Config{
			Config: streamlimit.Config{
				Site:        name,
				Rules:       rulesPath,
				Brokers:     brokers,
				HitsTopic:   hits,
				CountsTopic: counts,
				Logger:      discard,
			},
			HTTPAddr: "127.0.0.1:0",
			GRPCAddr: "off",
		})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			if err := s.Run(ctx); err != nil {
				b.Errorf("site %s: %v", name, err)
			}
		})
		return s
	}
	siteA, siteB := site("a"), site("b")
	waitUntil(b, "aggregator ready and B's snapshot restored and fresh", func() bool {
		return agg.Ready() && siteB.Snapshot().Ready() && !siteB.Snapshot().Stale()
	})

	// Warm-up: the pipeline is flowing once a hit decided at A shows at B. Without it the
	// first samples also time the consumers' start (B's first fetches of partitions that
	// were empty when it started come in steps of about 100 ms, for half a second).
	for i := 0; ; i++ {
		entries := []rules.Entry{{Key: "user", Value: fmt.Sprintf("warm-%d", i)}}
		key := rcfg.Match("api", entries).Key(entries, 0)
		siteA.Engine().Decide(ctx, enforcer.Request{Domain: "api", Descriptors: [][]rules.Entry{entries}})
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) {
			if e, ok := siteB.Snapshot().Get(key); ok && e.Total >= 1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if e, ok := siteB.Snapshot().Get(key); ok && e.Total >= 1 && i >= 3 {
			break
		}
		if i > 60 {
			b.Fatal("warm-up hits never showed at site B")
		}
	}

	var (
		mu      sync.Mutex
		pending = map[string]*sample{}
	)
	observer := testenv.KafkaClient(b, kgo.ConsumeTopics(hits, counts), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	wg.Go(func() {
		for {
			fs := observer.PollFetches(ctx)
			if ctx.Err() != nil || fs.IsClientClosed() {
				return
			}
			now := time.Now()
			mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				switch r.Topic {
				case hits:
					// One hit record, or a hit batch of several keys.
					hs, _ := topics.DecodeHits(r.Value)
					for _, h := range hs {
						if s := pending[h.Key]; s != nil && s.hitSeen.IsZero() {
							s.hitSeen, s.bucketStart = now, h.BucketStart
						}
					}
				case counts:
					s := pending[string(r.Key)]
					if s == nil {
						return
					}
					if c, err := topics.DecodeCount(r.Value); err == nil && c.Total >= 1 && s.countSeen.IsZero() {
						s.countSeen, s.asOf = now, c.AsOf
					}
				}
			})
			mu.Unlock()
		}
	})

	run := 0
	for b.Loop() {
		run++
		samples := make([]*sample, propagationSamples)
		open := make(chan *sample, propagationSamples)
		var pollWG sync.WaitGroup
		pollWG.Go(func() { pollVisible(siteB, open, propagationSamples) })
		for i := range samples {
			entries := []rules.Entry{{Key: "user", Value: fmt.Sprintf("prop-%d-%d", run, i)}}
			s := &sample{key: rcfg.Match("api", entries).Key(entries, 0)}
			samples[i] = s
			mu.Lock()
			pending[s.key] = s
			mu.Unlock()
			res := siteA.Engine().Decide(ctx, enforcer.Request{Domain: "api", Descriptors: [][]rules.Entry{entries}})
			s.decided = time.Now()
			if res.Code != enforcer.CodeOK {
				b.Fatalf("sample %d denied", i)
			}
			open <- s
			time.Sleep(time.Duration(5+rand.IntN(21)) * time.Millisecond)
		}
		pollWG.Wait()
		b.StopTimer()
		mu.Lock()
		reportPropagation(b, samples)
		clear(pending)
		mu.Unlock()
		b.StartTimer()
	}
}

// pollVisible checks every open sample in B's snapshot every millisecond until n samples
// are visible, or fails after 60 s.
func pollVisible(siteB *server.Server, open <-chan *sample, n int) {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	var waiting []*sample
	deadline := time.Now().Add(60 * time.Second)
	for seen := 0; seen < n && time.Now().Before(deadline); {
		<-t.C
		for more := true; more; {
			select {
			case s := <-open:
				waiting = append(waiting, s)
			default:
				more = false
			}
		}
		now := time.Now()
		waiting = slices.DeleteFunc(waiting, func(s *sample) bool {
			if e, ok := siteB.Snapshot().Get(s.key); ok && e.Total >= 1 {
				s.visible = now
				seen++
				return true
			}
			return false
		})
	}
}

func reportPropagation(b *testing.B, samples []*sample) {
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	var total []time.Duration
	var stage [5]time.Duration
	complete := 0
	for _, s := range samples {
		if s.visible.IsZero() {
			b.Fatalf("key %s never became visible at site B", s.key)
		}
		total = append(total, s.visible.Sub(s.decided))
		if s.hitSeen.IsZero() || s.countSeen.IsZero() {
			continue // the observer missed it; the stage means use the others
		}
		complete++
		bucketEnd := time.UnixMilli(s.bucketStart).Add(producer.DefaultBucketWidth)
		asOf := time.UnixMilli(s.asOf)
		stage[0] += bucketEnd.Sub(s.decided)
		stage[1] += s.hitSeen.Sub(bucketEnd)
		stage[2] += asOf.Sub(s.hitSeen)
		stage[3] += s.countSeen.Sub(asOf)
		stage[4] += s.visible.Sub(s.countSeen)
	}
	slices.Sort(total)
	var sum time.Duration
	for _, d := range total {
		sum += d
	}
	pct := func(p float64) float64 { return ms(total[int(p*float64(len(total)-1))]) }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(ms(total[len(total)-1]), "max-ms")
	b.ReportMetric(ms(sum)/float64(len(total)), "mean-ms")
	if complete > 0 {
		for i, unit := range []string{"bucket-ms", "flush-ms", "agg-ms", "counts-ms", "snap-ms"} {
			b.ReportMetric(ms(stage[i])/float64(complete), unit)
		}
	}
	b.ReportMetric(float64(len(total)), "samples")
}

func waitUntil(b *testing.B, what string, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatalf("not within 60s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
