package snapshot

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topicadmin"
	"github.com/streamlimit/streamlimit/topics"
)

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, time.Minute, what, cond)
}

// produce writes records synchronously, in order.
func produce(t *testing.T, cl *kgo.Client, topic string, kvs ...[]byte) {
	t.Helper()
	var recs []*kgo.Record
	for i := 0; i+1 < len(kvs); i += 2 {
		recs = append(recs, &kgo.Record{Topic: topic, Key: kvs[i], Value: kvs[i+1]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// runSnapshot starts Run in the background and stops it at cleanup, checking that it
// returned nil.
func runSnapshot(t *testing.T, s *Snapshot) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(time.Minute):
			t.Errorf("Run did not return after cancel")
		}
	})
}

func waitReady(t *testing.T, s *Snapshot) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatalf("snapshot not ready: %v", err)
	}
}

// countsTopic creates a compacted counts topic of 3 partitions with topicadmin.Ensure.
func countsTopic(t *testing.T) string {
	t.Helper()
	cfg := topics.Config{
		HitsTopic: testenv.TopicName(t, "hits"), CountsTopic: testenv.TopicName(t, "counts"),
		HitsPartitions: 1, CountsPartitions: 3, ReplicationFactor: 1,
	}
	adm := testenv.AdminClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := topicadmin.Ensure(ctx, adm, cfg); err != nil {
		t.Fatalf("EnsureTopics: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, cfg.HitsTopic, cfg.CountsTopic)
	})
	return cfg.CountsTopic
}

func TestKafkaRestoreFollowTombstoneStaleness(t *testing.T) {
	brokers := testenv.Brokers(t)
	topic := countsTopic(t)
	prod := testenv.KafkaClient(t)
	clk := clock.NewFake(t0)

	// What the topic holds before the snapshot starts: 40 keys written twice (the second
	// value must win), 5 of them then tombstoned, a bad record, and a heartbeat.
	var kvs [][]byte
	for v := 1; v <= 2; v++ {
		for i := range 40 {
			k := fmt.Sprint("user=", i)
			kvs = append(kvs, []byte(k), countValue(t, k, time.Minute, t0, map[string]float64{"eu": float64(v), "us": float64(i)}))
		}
	}
	for i := range 5 {
		kvs = append(kvs, []byte(fmt.Sprint("user=", i)), nil)
	}
	kvs = append(kvs, []byte("garbage"), []byte{0xff})
	hk, hv := heartbeat(t, "hits", 0, t0, false)
	kvs = append(kvs, hk, hv)
	produce(t, prod, topic, kvs...)

	reg := prometheus.NewRegistry()
	s, err := New(Config{Brokers: brokers, Topic: topic, Site: "eu", Clock: clk, Registerer: reg, MaxStaleness: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{s: s, clk: clk, reg: reg}
	if s.Ready() || f.metric(t, "streamlimit_snapshot_ready") != 0 {
		t.Fatal("ready before Run")
	}
	runSnapshot(t, s)
	waitReady(t, s)

	// Ready means every record present at start has been applied: check at once.
	if s.Len() != 35 {
		t.Fatalf("Len = %d at ready, want 35", s.Len())
	}
	for i := range 40 {
		e, ok := s.Get(fmt.Sprint("user=", i))
		if i < 5 {
			if ok {
				t.Fatalf("user=%d survived its tombstone", i)
			}
			continue
		}
		if !ok || e.Mine != 2 || e.Total != float64(2+i) || e.Site("us") != float64(i) {
			t.Fatalf("user=%d = %+v, %v; want mine 2, total %d", i, e, ok, 2+i)
		}
	}
	if f.metric(t, "streamlimit_snapshot_bad_records_total", "reason", "unknown_version") != 1 || f.metric(t, "streamlimit_snapshot_ready") != 1 {
		t.Fatal("bad record not counted or ready gauge not set")
	}
	if s.Stale() {
		t.Fatalf("stale right after restore with a fresh heartbeat: age %v", s.Age())
	}

	// Follow: new keys, updates and tombstones written after start arrive.
	produce(t, prod, topic,
		[]byte("new"), countValue(t, "new", time.Hour, t0, map[string]float64{"ap": 7}),
		[]byte("user=10"), countValue(t, "user=10", time.Minute, t0, map[string]float64{"eu": 9}),
		[]byte("user=11"), nil)
	eventually(t, "follow", func() bool {
		n, ok1 := s.Get("new")
		u, ok2 := s.Get("user=10")
		_, ok3 := s.Get("user=11")
		return ok1 && n.Total == 7 && n.Mine == 0 && ok2 && u.Total == 9 && u.Mine == 9 && !ok3
	})

	// Heartbeats stop: the snapshot turns stale once the oldest is past MaxStaleness...
	clk.Advance(10*time.Second + time.Millisecond)
	if !s.Stale() {
		t.Fatalf("not stale at age %v", s.Age())
	}
	if e, ok := s.Get("new"); !ok || e.Total != 7 {
		t.Fatal("stale snapshot stopped serving its last data")
	}
	// ...and fresh again when they resume. A replaying source keeps it stale meanwhile.
	hk, hv = heartbeat(t, "hits", 0, clk.Now(), true)
	produce(t, prod, topic, hk, hv)
	eventually(t, "replaying heartbeat", func() bool {
		srcs := s.Sources(clk.Now())
		return len(srcs) == 1 && srcs[0].Replaying
	})
	if !s.Stale() {
		t.Fatal("not stale while the source replays")
	}
	hk, hv = heartbeat(t, "hits", 0, clk.Now(), false)
	produce(t, prod, topic, hk, hv)
	eventually(t, "fresh heartbeat", func() bool { return !s.Stale() })
	if s.Age() != 0 {
		t.Fatalf("Age = %v after a heartbeat as of now", s.Age())
	}
}

func TestKafkaEmptyTopicReady(t *testing.T) {
	topic := countsTopic(t)
	s, err := New(Config{Brokers: testenv.Brokers(t), Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	runSnapshot(t, s)
	waitReady(t, s)
	if s.Len() != 0 {
		t.Fatalf("Len = %d", s.Len())
	}
	// Nothing ever said the counts are fresh.
	if len(s.Sources(time.Now())) != 0 {
		t.Fatal("sources from an empty topic")
	}
}

// TestKafkaUnreachable stops the broker under a running follower (an in-process kfake
// cluster, which can be stopped): the snapshot keeps serving its last data, its age grows
// because no heartbeat arrives, and Run keeps running until cancelled (runSnapshot's
// cleanup fails the test if it returned early or does not return). That the follower
// reads a broker again once it is back is e2e's TestFaultKafkaDown, on a real broker that
// keeps its data across the restart.
func TestKafkaUnreachable(t *testing.T) {
	const topic = "counts"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			cluster.Close()
		}
	})
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	hk, hv := heartbeat(t, "hits", 0, t0, false)
	produce(t, prod, topic, []byte("k"), countValue(t, "k", time.Hour, t0, map[string]float64{"eu": 1, "us": 4}), hk, hv)

	clk := clock.NewFake(t0)
	s, err := New(Config{Brokers: cluster.ListenAddrs(), Topic: topic, Site: "eu", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	runSnapshot(t, s)
	waitReady(t, s)
	if s.Stale() {
		t.Fatal("stale with a fresh heartbeat")
	}

	prod.Close()
	cluster.Close()
	closed = true
	clk.Advance(15 * time.Second)
	if s.Age() != 15*time.Second || !s.Stale() {
		t.Fatalf("Kafka down 15s: Age %v, Stale %v", s.Age(), s.Stale())
	}
	if e, ok := s.Get("k"); !ok || e.Remote() != 4 || e.Mine != 1 {
		t.Fatalf("last data not served while Kafka is down: %+v, %v", e, ok)
	}
}

// TestKafkaTopicCreatedLater starts the follower before the counts topic exists: it keeps
// retrying, is not ready, becomes ready once the topic appears, and follows it. The count is
// written after the topic is created, so the follower may find the topic, empty, before the
// count is in it, be ready at once and read the count after: the count is awaited, not
// required at the moment of readiness (it was, and a run under three CPU burners found the
// topic empty first).
func TestKafkaTopicCreatedLater(t *testing.T) {
	topicName := testenv.TopicName(t, "counts")
	s, err := New(Config{Brokers: testenv.Brokers(t), Topic: topicName})
	if err != nil {
		t.Fatal(err)
	}
	runSnapshot(t, s)
	if s.Ready() {
		t.Fatal("ready without a topic")
	}
	adm := testenv.AdminClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tc, err := topics.Config{}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := adm.CreateTopic(ctx, 2, 1, tc.CountsConfigs(), topicName); err != nil || resp.Err != nil {
		t.Fatalf("create topic: %v, %v", err, resp.Err)
	}
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), topicName) })
	produce(t, testenv.KafkaClient(t), topicName, []byte("k"), countValue(t, "k", time.Minute, t0, map[string]float64{"us": 2}))
	waitReady(t, s)
	eventually(t, "the count written after the topic appeared", func() bool {
		e, ok := s.Get("k")
		return ok && e.Total == 2
	})
}

// TestKafkaUnknownWriterRefused: a snapshot configured with its aggregators' names
// believes only the records that carry one (topics.InstanceHeader): a forged count (total
// 0) and a forged tombstone from another writer, or from one that names nobody, are
// skipped and counted as unknown_instance, and the aggregator's count stays. Before,
// every record of the topic was believed.
func TestKafkaUnknownWriterRefused(t *testing.T) {
	topic := countsTopic(t)
	reg := prometheus.NewRegistry()
	s, err := New(Config{Brokers: testenv.Brokers(t), Topic: topic, Aggregators: []string{"agg-1", "agg-2"}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	cl := testenv.KafkaClient(t, kgo.DefaultProduceTopic(topic))
	now := time.Now()
	count := func(total float64) []byte {
		c := topics.Count{Key: "k", Window: 3_600_000, AsOf: now.UnixMilli(), Total: total, Sites: []topics.SiteCount{{Site: "us", Count: total, Demand: total}}}
		v, err := c.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	from := func(inst string) []kgo.RecordHeader {
		if inst == "" {
			return nil
		}
		return []kgo.RecordHeader{{Key: topics.InstanceHeader, Value: []byte(inst)}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, r := range []*kgo.Record{
		{Key: []byte("k"), Value: count(3), Headers: from("agg-2")},
		{Key: []byte("k"), Value: count(0), Headers: from("mallory")},
		{Key: []byte("k"), Value: count(0)},
		{Key: []byte("k"), Headers: from("mallory")}, // a tombstone
		{Key: []byte("last"), Value: func() []byte {
			c := topics.Count{Key: "last", Window: 60_000, AsOf: now.UnixMilli(), Total: 1, Sites: []topics.SiteCount{{Site: "us", Count: 1, Demand: 1}}}
			v, _ := c.MarshalBinary()
			return v
		}(), Headers: from("agg-1")},
	} {
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	runSnapshot(t, s)
	waitReady(t, s)
	eventually(t, "the last record applied", func() bool { _, ok := s.Get("last"); return ok })
	if e, ok := s.Get("k"); !ok || e.Total != 3 {
		t.Fatalf("k = %+v, %v: want the aggregator's count, 3", e, ok)
	}
	if got := testutil.ToFloat64(s.met.badVec.WithLabelValues(ReasonUnknownInstance)); got != 3 {
		t.Fatalf("bad_records_total{unknown_instance} = %v, want 3", got)
	}
}
