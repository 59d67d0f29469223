package aggregator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/internal/windowref"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

const testPartitions = 4

// env is one test's Kafka and topics: a local hits topic, its "us." MirrorMaker copy, and
// counts. It is built on the real broker (newEnv) or on a kfake cluster of its own on an
// in-memory network (newVirtualEnv, in a synctest bubble); every client of a test, the
// aggregators' too, comes from the env, so that a test body runs the same on either.
type env struct {
	t            *testing.T
	hits, usHits string
	counts       string
	group        string
	brokers      []string
	// opts go to every client of this Kafka after its seed brokers, the aggregators'
	// through Config.KafkaOpts: on kfake, the dialer of its in-memory network.
	opts          []kgo.Opt
	adm           *kadm.Client
	prod          *kgo.Client
	countsRecs    *recorder
	hitsMu        sync.Mutex
	hitsByCounter map[counterID][]topics.Hit
}

// newEnv builds an env on the real broker (testenv.Kafka), with topics of names of their
// own: the broker is shared by every test.
func newEnv(t *testing.T) *env {
	t.Helper()
	return setupEnv(t, testenv.Brokers(t), nil)
}

// newVirtualEnv builds an env on a kfake cluster of its own (virtualKafka). It must be
// called in a synctest bubble, which the cluster's goroutines then belong to.
func newVirtualEnv(t *testing.T) *env {
	t.Helper()
	brokers, dial := virtualKafka(t, nil)
	return setupEnv(t, brokers, []kgo.Opt{dial})
}

func setupEnv(t *testing.T, brokers []string, opts []kgo.Opt) *env {
	t.Helper()
	e := &env{t: t, brokers: brokers, opts: opts, group: testenv.TopicName(t, "group"),
		hitsByCounter: map[counterID][]topics.Hit{}}
	e.adm = kadm.NewClient(e.client())
	var tc topics.Config
	tc, err := tc.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	e.hits = testenv.TopicName(t, "hits")
	e.usHits = topics.RemoteHitsTopic("us", e.hits)
	e.counts = testenv.TopicName(t, "counts")
	// The "us." topic must be visible with leaders before anything joins the group:
	// createTopic waits for that.
	e.createTopic(e.hits, testPartitions, tc.HitsConfigs())
	e.createTopic(e.usHits, testPartitions, tc.HitsConfigs())
	e.createTopic(e.counts, testPartitions, tc.CountsConfigs())
	e.prod = e.client(kgo.DefaultProduceTopic(e.hits), kgo.ProducerLinger(0))
	e.countsRecs = startRecorder(t, e, e.counts)
	return e
}

// client returns a client of the env's Kafka with opts, closed when the test ends.
func (e *env) client(opts ...kgo.Opt) *kgo.Client {
	e.t.Helper()
	all := append(append([]kgo.Opt{kgo.SeedBrokers(e.brokers...)}, e.opts...), opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		e.t.Fatalf("kgo.NewClient: %v", err)
	}
	e.t.Cleanup(cl.Close)
	return cl
}

// createTopic creates topic with configs (nil for the broker's defaults), waits until it
// has a leader on every partition, and deletes it when the test ends.
func (e *env) createTopic(topic string, partitions int32, configs map[string]*string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if r, err := e.adm.CreateTopic(ctx, partitions, 1, configs, topic); err != nil || r.Err != nil {
		e.t.Fatalf("create %s: %v %v", topic, err, r.Err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Best effort: a leftover topic only costs the shared broker a little disk.
		_, _ = e.adm.DeleteTopics(ctx, topic)
	})
	for {
		md, err := e.adm.Metadata(ctx, topic)
		if err == nil && md.Topics[topic].Err == nil && len(md.Topics[topic].Partitions) == int(partitions) && allLeaders(md.Topics[topic].Partitions) {
			return
		}
		if ctx.Err() != nil {
			e.t.Fatalf("topic %s not ready", topic)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func allLeaders(ps kadm.PartitionDetails) bool {
	for _, p := range ps {
		if p.Err != nil || p.Leader < 0 {
			return false
		}
	}
	return true
}

func (e *env) config(reg prometheus.Registerer) Config {
	return Config{
		Brokers:       e.brokers,
		KafkaOpts:     e.opts,
		Group:         e.group,
		Topics:        []string{e.hits, e.usHits},
		CountsTopic:   e.counts,
		SubBuckets:    20,
		EmitInterval:  50 * time.Millisecond,
		Lateness:      2 * time.Second,
		MaxClockSkew:  5 * time.Second,
		DefaultWindow: 20 * time.Second,
		MaxWindow:     30 * time.Second,
		Registerer:    reg,
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// produce writes hits (binary) to topic with Kafka's key partitioning and record timestamps
// equal to the bucket start, and remembers them for the brute-force reference.
func (e *env) produce(topic string, hs ...topics.Hit) {
	e.t.Helper()
	recs := make([]*kgo.Record, 0, len(hs))
	for _, h := range hs {
		v, err := h.MarshalBinary()
		if err != nil {
			e.t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(h.Key), Value: v, Timestamp: time.UnixMilli(h.BucketStart)})
	}
	e.produceRecords(recs...)
	e.remember(hs...)
}

func (e *env) remember(hs ...topics.Hit) {
	e.hitsMu.Lock()
	defer e.hitsMu.Unlock()
	for _, h := range hs {
		id := counterID{h.Key, h.Window}
		e.hitsByCounter[id] = append(e.hitsByCounter[id], h)
	}
}

func (e *env) produceRecords(recs ...*kgo.Record) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatalf("produce: %v", err)
	}
}

// reference returns the brute-force count of a counter at asOf over the remembered hits.
func (e *env) reference(key string, w int64, asOf int64, subBuckets int, skew time.Duration) (float64, map[string]float64) {
	e.hitsMu.Lock()
	hs := append([]topics.Hit(nil), e.hitsByCounter[counterID{key, w}]...)
	e.hitsMu.Unlock()
	return windowref.Reference(window.NewSpec(time.Duration(w)*time.Millisecond, subBuckets, skew), hs, asOf)
}

// run starts an aggregator and returns it with a stop function that waits for Run.
func (e *env) run(cfg Config) (*Aggregator, func()) {
	e.t.Helper()
	a, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return a, e.start(a)
}

// start runs a until the test ends, and returns a stop function that waits for Run.
func (e *env) start(a *Aggregator) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("Run: %v", err)
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

// eventually waits for f four times as long as timeout says: on the real broker the machine
// may be loaded. In a synctest bubble the wait is on virtual time, and a failing test
// reaches its timeout in a fraction of the real time.
func eventually(t *testing.T, what string, timeout time.Duration, f func() bool) {
	t.Helper()
	testenv.Eventually(t, 4*timeout, what, f)
}

// recorder follows the counts topic from its start.
type recorder struct {
	mu   sync.Mutex
	recs []*kgo.Record
}

// startRecorder records topic of e's Kafka from its start until the test ends.
func startRecorder(t *testing.T, e *env, topic string) *recorder {
	cl := e.client(kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond))
	r := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			r.mu.Lock()
			fs.EachRecord(func(rec *kgo.Record) { r.recs = append(r.recs, rec) })
			r.mu.Unlock()
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r
}

func (r *recorder) all() []*kgo.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*kgo.Record(nil), r.recs...)
}

// counts decodes every count record (tombstones and heartbeats left out).
func (r *recorder) counts(t *testing.T) []topics.Count {
	var out []topics.Count
	for _, rec := range r.all() {
		if topics.IsReservedKey(rec.Key) || len(rec.Value) == 0 {
			continue
		}
		c, err := topics.DecodeCount(rec.Value)
		if err != nil {
			t.Fatalf("bad count record %q: %v", rec.Key, err)
		}
		if c.Key != string(rec.Key) {
			t.Fatalf("count for %q under key %q", c.Key, rec.Key)
		}
		out = append(out, c)
	}
	return out
}

// latest returns the newest count per key (by AsOf), and which keys ended with a tombstone.
func (r *recorder) latest(t *testing.T) (map[string]topics.Count, map[string]bool) {
	cs := map[string]topics.Count{}
	dead := map[string]bool{}
	for _, rec := range r.all() {
		if topics.IsReservedKey(rec.Key) {
			continue
		}
		k := string(rec.Key)
		if len(rec.Value) == 0 {
			dead[k] = true
			continue
		}
		c, err := topics.DecodeCount(rec.Value)
		if err != nil {
			t.Fatal(err)
		}
		if c.AsOf >= cs[k].AsOf {
			cs[k] = c
			delete(dead, k)
		}
	}
	return cs, dead
}

// checkExact asserts that every count equals the brute-force reference at its AsOf.
func (e *env) checkExact(cs []topics.Count, cfg Config, filter func(topics.Count) bool) int {
	e.t.Helper()
	n := 0
	for _, c := range cs {
		if filter != nil && !filter(c) {
			continue
		}
		n++
		wantT, wantS := e.reference(c.Key, c.Window, c.AsOf, cfg.SubBuckets, cfg.MaxClockSkew)
		if math.Abs(c.Total-wantT) > 1e-6 {
			e.t.Fatalf("key %q at %d: total %v, brute force %v", c.Key, c.AsOf, c.Total, wantT)
		}
		// A site whose hits have all left the window stays listed, with count 0, while its
		// demand lasts.
		listed := 0
		for _, s := range c.Sites {
			if s.Count != 0 {
				listed++
			} else if s.Demand < window.DemandFloor {
				e.t.Fatalf("key %q at %d: site %s listed with count 0 and demand %v", c.Key, c.AsOf, s.Site, s.Demand)
			}
		}
		if listed != len(wantS) {
			e.t.Fatalf("key %q at %d: sites %v, brute force %v", c.Key, c.AsOf, c.Sites, wantS)
		}
		for _, s := range c.Sites {
			if math.Abs(s.Count-wantS[s.Site]) > 1e-6 {
				e.t.Fatalf("key %q site %s at %d: %v, brute force %v", c.Key, s.Site, c.AsOf, s.Count, wantS[s.Site])
			}
		}
	}
	return n
}

// randomHits returns hits for n keys from three sites, stamped in [from, to).
func randomHits(rng *rand.Rand, prefix string, n int, from, to time.Time, w time.Duration) (local, remote []topics.Hit) {
	sites := []string{"eu-1", "us-1", "ap-1"}
	for k := range n {
		key := fmt.Sprintf("%s|user=%d", prefix, k)
		for range 1 + rng.IntN(4) {
			site := sites[rng.IntN(3)]
			ts := from.UnixMilli() + rng.Int64N(to.Sub(from).Milliseconds())
			h := topics.Hit{Key: key, Site: site, BucketStart: ts, Window: w.Milliseconds(), Count: 1 + rng.Int64N(3)}
			if site == "us-1" {
				remote = append(remote, h)
			} else {
				local = append(local, h)
			}
		}
	}
	return local, remote
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func keysOf(hs ...[]topics.Hit) map[string]bool {
	out := map[string]bool{}
	for _, h := range hs {
		for _, x := range h {
			out[x.Key] = true
		}
	}
	return out
}
