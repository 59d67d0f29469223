package aggregator

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamlimit/streamlimit/topics"
)

// Positioning a newly assigned partition takes two listings: its end offset, and the first
// offset at or after the replay's start (by time). For an empty partition, or one whose
// records are all older than the replay's start, the broker answers the listing by time with
// "none" and kadm asks again for the end offset, in a request of its own. A hit written
// between the two requests is then behind the offset the listing by time answers; started
// there, the aggregator never reads it. That is how a hit an enforcer published as its
// aggregator joined the group was lost, with "partitions positioned; nothing to replay" in
// the log. The aggregator lists the end offsets first and never starts a partition past
// them.
//
// These tests run on kfake, whose control functions write the hit at the exact moment, so
// that the race is taken every time rather than once in many runs.

// positionHooks says where, in the listings of a positioning, the hit is written.
type positionHooks int

const (
	// duringEndRelisting writes it while kadm asks again for the end offset of a partition
	// the listing by time found nothing in.
	duringEndRelisting positionHooks = iota
	// beforeListingByTime writes it, with a record time older than the replay's start (a
	// producer's delayed batch), just before the listing by time.
	beforeListingByTime
)

func TestHitWrittenDuringEndRelistingIsCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { testHitWrittenWhilePositioning(t, duringEndRelisting) })
}

func TestHitWrittenBeforeListingByTimeIsCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { testHitWrittenWhilePositioning(t, beforeListingByTime) })
}

func testHitWrittenWhilePositioning(t *testing.T, at positionHooks) {
	const hits, counts = "hits", "counts"
	// In a synctest bubble, on kfake's in-memory network: time is virtual, and every wait
	// below ends when the aggregator has done what it would do, however loaded the machine.
	var network kfake.VirtualNetwork
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(9092), kfake.ListenFn(network.Listen),
		kfake.SeedTopics(testPartitions, hits, counts))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()
	dial := kgo.Dialer(network.DialContext)
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), dial, kgo.DefaultProduceTopic(hits), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)

	key := "api|user=joined#30s"
	now := time.Now()
	hit := topics.Hit{Key: key, Site: "eu", BucketStart: now.Add(-time.Second).UnixMilli(), Window: (30 * time.Second).Milliseconds(), Count: 3}
	stamp := now
	if at == beforeListingByTime {
		// A record time 40 s back (before the replay's start, MaxWindow + Lateness = 32 s
		// back) for a bucket 22 s back in a 30 s window: within the skew allowed below.
		hit.BucketStart, stamp = now.Add(-22*time.Second).UnixMilli(), now.Add(-40*time.Second)
	}
	v, err := hit.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	write := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte(key), Value: v, Timestamp: stamp}).FirstErr(); err != nil {
			t.Errorf("writing the hit: %v", err)
		}
	}

	// The listings of the hits topic, in order: a by-time listing has a timestamp ≥ 0, an
	// end-offset listing −1.
	var mu sync.Mutex
	var listings []int64
	written := false
	cluster.ControlKey(int16(kmsg.ListOffsets), func(r kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := r.(*kmsg.ListOffsetsRequest)
		for _, rt := range req.Topics {
			if rt.Topic != hits || len(rt.Partitions) == 0 {
				continue
			}
			ts := rt.Partitions[0].Timestamp
			mu.Lock()
			byTimeBefore := len(listings) > 0 && listings[len(listings)-1] >= 0
			listings = append(listings, ts)
			due := !written && (at == duringEndRelisting && ts == -1 && byTimeBefore || at == beforeListingByTime && ts >= 0)
			written = written || due
			mu.Unlock()
			if due {
				// The produce request goes on a connection of its own: the broker answers it
				// while this listing waits.
				cluster.SleepControl(write)
			}
		}
		return nil, nil, false
	})

	reg := prometheus.NewRegistry()
	a, err := New(Config{
		Brokers:       brokers,
		Group:         "aggregators",
		Topics:        []string{hits},
		CountsTopic:   counts,
		SubBuckets:    20,
		EmitInterval:  50 * time.Millisecond,
		Lateness:      2 * time.Second,
		MaxClockSkew:  20 * time.Second,
		DefaultWindow: 20 * time.Second,
		MaxWindow:     30 * time.Second,
		Registerer:    reg,
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		KafkaOpts:     []kgo.Opt{dial},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	reader, err := kgo.NewClient(kgo.SeedBrokers(brokers...), dial, kgo.ConsumeTopics(counts), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reader.Close)
	// A minute of virtual time: the hit is counted within a few emission intervals or not
	// at all.
	deadline := time.Now().Add(time.Minute)
	for {
		pctx, pcancel := context.WithTimeout(context.Background(), time.Second)
		fs := reader.PollFetches(pctx)
		pcancel()
		var got *topics.Count
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Key) == key && len(r.Value) > 0 {
				if c, err := topics.DecodeCount(r.Value); err == nil {
					got = &c
				}
			}
		})
		if got != nil {
			if got.Total != 3 {
				t.Fatalf("count of %s: %v, want 3", key, got.Total)
			}
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("the hit written while positioning was never counted (listings of %s by timestamp: %v; written: %v; records in: %v)",
				hits, listings, written, metricValue(t, reg, "streamlimit_aggregator_records_in_total"))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !written {
		t.Fatalf("the hit was never written: the listings did not take the expected course %v", listings)
	}
}
