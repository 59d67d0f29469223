package topicadmin_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topicadmin"
	"github.com/streamlimit/streamlimit/topics"
)

func testConfig(t *testing.T) topics.Config {
	return topics.Config{
		HitsTopic:        testenv.TopicName(t, "hits"),
		CountsTopic:      testenv.TopicName(t, "counts"),
		HitsPartitions:   3,
		CountsPartitions: 2,
	}
}

func configOf(t *testing.T, adm *kadm.Client, topic, key string) string {
	t.Helper()
	rcs, err := adm.DescribeTopicConfigs(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rcs.On(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rc.Configs {
		if c.Key == key && c.Value != nil {
			return *c.Value
		}
	}
	return ""
}

func TestEnsureTopicsCreatesAndIsIdempotent(t *testing.T) {
	ctx := context.Background()
	adm := testenv.AdminClient(t)
	cfg := testConfig(t)

	res, err := topicadmin.Ensure(ctx, adm, cfg)
	if err != nil {
		t.Fatalf("EnsureTopics: %v", err)
	}
	if len(res.Created) != 2 || len(res.Verified) != 0 {
		t.Fatalf("first call: %+v, want both created", res)
	}
	details, err := adm.ListTopics(ctx, cfg.HitsTopic, cfg.CountsTopic)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(details[cfg.HitsTopic].Partitions); n != 3 {
		t.Errorf("hits partitions = %d, want 3", n)
	}
	if n := len(details[cfg.CountsTopic].Partitions); n != 2 {
		t.Errorf("counts partitions = %d, want 2", n)
	}
	for topic, want := range map[string]map[string]string{
		cfg.HitsTopic:   {"cleanup.policy": "delete", "retention.ms": "86400000", "message.timestamp.type": "CreateTime"},
		cfg.CountsTopic: {"cleanup.policy": "compact", "segment.ms": "60000", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "600000"},
	} {
		for k, v := range want {
			if got := configOf(t, adm, topic, k); got != v {
				t.Errorf("%s %s = %q, want %q", topic, k, got, v)
			}
		}
	}

	res, err = topicadmin.Ensure(ctx, adm, cfg)
	if err != nil {
		t.Fatalf("second EnsureTopics: %v", err)
	}
	if len(res.Created) != 0 || len(res.Verified) != 2 {
		t.Fatalf("second call: %+v, want both verified", res)
	}
}

func TestEnsureTopicsRejectsMisconfiguredTopics(t *testing.T) {
	ctx := context.Background()
	adm := testenv.AdminClient(t)
	cfg := testConfig(t)
	// A counts topic that someone created by hand without compaction, and a hits topic with
	// the wrong partition count.
	for _, c := range []struct {
		name string
		n    int32
	}{{cfg.CountsTopic, 2}, {cfg.HitsTopic, 5}} {
		resp, err := adm.CreateTopic(ctx, c.n, -1, map[string]*string{"cleanup.policy": ptr("delete")}, c.name)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := topicadmin.Ensure(ctx, adm, cfg)
	var mm *topicadmin.MismatchError
	if !errors.As(err, &mm) {
		t.Fatalf("EnsureTopics on misconfigured topics: %v, want a MismatchError", err)
	}
	msg := err.Error()
	for _, want := range []string{
		fmt.Sprintf("topic %q: cleanup.policy is \"delete\", want \"compact\"", cfg.CountsTopic),
		fmt.Sprintf("topic %q: partitions is 5, want 3", cfg.HitsTopic),
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	// Never silently altered.
	if got := configOf(t, adm, cfg.CountsTopic, "cleanup.policy"); got != "delete" {
		t.Fatalf("EnsureTopics altered counts cleanup.policy to %q", got)
	}
}

func ptr(s string) *string { return &s }

// TestCountsTopicCompacts proves that the counts topic, as Ensure configures it,
// really compacts on a real broker: after several counts for one key only the last is read
// back, and a tombstoned key's values are gone.
func TestCountsTopicCompacts(t *testing.T) {
	ctx := context.Background()
	adm := testenv.AdminClient(t)
	cfg := testConfig(t)
	cfg.CountsPartitions = 1
	// Short segments and tombstone retention so the test sees compaction within seconds;
	// the broker's log.cleaner.backoff.ms is set low by the test harness.
	cfg.CountsSegment = 500 * time.Millisecond
	cfg.CountsDeleteRetention = 500 * time.Millisecond
	if _, err := topicadmin.Ensure(ctx, adm, cfg); err != nil {
		t.Fatal(err)
	}
	cl := testenv.KafkaClient(t, kgo.DefaultProduceTopic(cfg.CountsTopic))

	produce := func(key string, total float64, tombstone bool) {
		t.Helper()
		r := &kgo.Record{Key: []byte(key)}
		if !tombstone {
			c := topics.Count{Key: key, Window: 60000, AsOf: time.Now().UnixMilli(), Total: total, Sites: []topics.SiteCount{{Site: "eu", Count: total}}}
			v, err := c.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			r.Value = v
		}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 5; i++ {
		produce("kept", float64(i), false)
		produce("gone", float64(i), false)
	}
	produce("gone", 0, true)

	deadline := time.Now().Add(3 * time.Minute)
	for {
		// New records roll the active segment (only closed segments are compacted).
		time.Sleep(700 * time.Millisecond)
		produce("roller", 1, false)
		kept, gone := readAll(t, cfg.CountsTopic)
		if len(kept) == 1 && kept[0] == 5 && len(gone) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not compacted after 3 min: kept=%v gone=%v", kept, gone)
		}
	}
}

// readAll reads the whole counts topic and returns the totals of key "kept" and the
// non-tombstone totals of key "gone", in log order.
func readAll(t *testing.T, topic string) (kept, gone []float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := testenv.AdminClient(t)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup(topic, 0)
	cl := testenv.KafkaClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("reading %s: %v", topic, err)
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end.Offset-1 {
				done = true
			}
			if r.Value == nil {
				return
			}
			c, err := topics.DecodeCount(r.Value)
			if err != nil {
				t.Fatalf("offset %d: %v", r.Offset, err)
			}
			switch string(r.Key) {
			case "kept":
				kept = append(kept, c.Total)
			case "gone":
				gone = append(gone, c.Total)
			}
		})
		if done {
			return kept, gone
		}
	}
}

// TestEnsureTopicsUsableAtOnce creates the topics from several callers at once (as several
// deployment scripts might) and uses them the moment Ensure returns: every caller succeeds
// (the losers of the race verify a topic that was only just created), every partition is
// described with a leader, and a record produced to each partition of both topics is
// acknowledged.
func TestEnsureTopicsUsableAtOnce(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	const callers = 3
	errs := make(chan error, callers)
	for range callers {
		// The client is made here, not in the goroutine: AdminClient may end the test
		// (skip it under -short), which only the test's own goroutine may do.
		adm := testenv.AdminClient(t)
		go func() {
			_, err := topicadmin.Ensure(ctx, adm, cfg)
			errs <- err
		}()
	}
	for range callers {
		if err := <-errs; err != nil {
			t.Fatalf("Ensure: %v", err)
		}
	}
	adm := testenv.AdminClient(t)
	details, err := adm.ListTopics(ctx, cfg.HitsTopic, cfg.CountsTopic)
	if err != nil {
		t.Fatal(err)
	}
	cl := testenv.KafkaClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for topic, n := range map[string]int32{cfg.HitsTopic: cfg.HitsPartitions, cfg.CountsTopic: cfg.CountsPartitions} {
		td := details[topic]
		if td.Err != nil || int32(len(td.Partitions)) != n {
			t.Fatalf("%s right after Ensure: err %v, %d partitions, want %d", topic, td.Err, len(td.Partitions), n)
		}
		for p, pd := range td.Partitions {
			if pd.Leader < 0 || pd.Err != nil {
				t.Errorf("%s partition %d right after Ensure: leader %d, err %v", topic, p, pd.Leader, pd.Err)
			}
			r := &kgo.Record{Topic: topic, Partition: p, Key: []byte("k"), Value: []byte("v")}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Errorf("produce to %s/%d right after Ensure: %v", topic, p, err)
			}
		}
	}
}
