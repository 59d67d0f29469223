package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

// The WAN between the data centers of the multi-cluster tests, each way.
const (
	wanLatency = 40 * time.Millisecond
	wanJitter  = 10 * time.Millisecond
)

// hitsPartitions is every hits topic's partition count in the multi-cluster tests: the
// same in every data center, as MirrorMaker keeps partition numbers (invariant 2).
const hitsPartitions = 2

// mirrorConfig is the MirrorMaker 2 configuration that compose.yaml mounts; the tests run
// the same file with their own bootstrap addresses.
const mirrorConfig = "deploy/mm2.properties"

// dc is one data center of the multi-cluster harness: its own Kafka cluster, whose WAN
// holds the links into it, one from each other data center (its MirrorMaker).
type dc struct {
	*testenv.KafkaCluster
}

// startMirroredDCs starts one Kafka cluster per name (deploy/mm2.properties generalised to
// these names, testenv.MirrorConfigFor), a link into each from every other with WAN
// latency, the topics each data center needs (its hits, the copies of the others' hits,
// and counts), and one MirrorMaker per data center that consumes the others' hits through
// their links and produces locally. It returns once a record has crossed every direction.
func startMirroredDCs(t *testing.T, names ...string) []*dc {
	t.Helper()
	start := time.Now()
	clusters := testenv.StartKafkaClusters(t, names...)
	t.Logf("FIGURE mirror: %d Kafka clusters started in %v", len(clusters), time.Since(start).Round(100*time.Millisecond))
	dcs := make([]*dc, len(clusters))
	for i, c := range clusters {
		dcs[i] = &dc{KafkaCluster: c}
		for _, link := range c.WAN {
			if err := link.SetLatency(wanLatency, wanJitter); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, d := range dcs {
		hits := []string{topics.DefaultHitsTopic}
		for _, o := range dcs {
			if o != d {
				// Created before MirrorMaker and the aggregator start, so that the
				// aggregator's subscription holds it from the beginning.
				hits = append(hits, topics.RemoteHitsTopic(o.Name, topics.DefaultHitsTopic))
			}
		}
		createTopics(t, []string{d.Addr}, hitsPartitions, nil, hits...)
		createTopics(t, []string{d.Addr}, 2, compacted(), topics.DefaultCountsTopic)
	}
	start = time.Now()
	for _, d := range dcs {
		boot := map[string]string{d.Name: d.Addr}
		for _, o := range dcs {
			if o != d {
				boot[o.Name] = o.WAN[d.Name].Addr()
			}
		}
		testenv.StartMirrorMaker(t, testenv.MirrorOptions{
			Config:    testenv.RepoPath(t, mirrorConfig),
			Clusters:  names,
			Bootstrap: boot,
			Target:    d.Name,
		})
	}
	for _, from := range dcs {
		for _, to := range dcs {
			if from != to {
				waitCrossed(t, from, to, 3*time.Minute)
			}
		}
	}
	t.Logf("FIGURE mirror: MirrorMaker started and replicating every direction in %v", time.Since(start).Round(100*time.Millisecond))
	return dcs
}

// cutBetween cuts the links between a and b, both ways: neither's MirrorMaker reaches the
// other's cluster, while both still reach every other data center.
func cutBetween(a, b *dc) {
	a.WAN[b.Name].Cut()
	b.WAN[a.Name].Cut()
}

// healBetween heals what cutBetween cut.
func healBetween(a, b *dc) {
	a.WAN[b.Name].Heal()
	b.WAN[a.Name].Heal()
}

// waitCrossed produces a probe hit to from's hits topic and waits until it arrives in
// to's copy of it, the same partition. The probe is a valid hit of a key no rule uses.
func waitCrossed(t *testing.T, from, to *dc, timeout time.Duration) time.Duration {
	t.Helper()
	lag, err := crossed(from, to, timeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE mirror: a hit crossed %s → %s in %v", from.Name, to.Name, lag.Round(time.Millisecond))
	return lag
}

// crossed produces a probe hit to from's hits topic and returns how long it took to arrive
// in to's copy of it, in the same partition; an error when it did not within timeout.
func crossed(from, to *dc, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	key := fmt.Sprintf("probe|from=%s,n=%d#1s", from.Name, time.Now().UnixNano())
	val, err := topics.Hit{Key: key, Site: from.Name, BucketStart: time.Now().UnixMilli(), Window: 1000, Count: 1}.MarshalBinary()
	if err != nil {
		return 0, err
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(from.Addr), kgo.DefaultProduceTopic(topics.DefaultHitsTopic))
	if err != nil {
		return 0, err
	}
	defer prod.Close()
	remote := topics.RemoteHitsTopic(from.Name, topics.DefaultHitsTopic)
	cons, err := kgo.NewClient(kgo.SeedBrokers(to.Addr), kgo.ConsumeTopics(remote),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return 0, err
	}
	defer cons.Close()

	start := time.Now()
	res := prod.ProduceSync(ctx, &kgo.Record{Key: []byte(key), Value: val})
	if err := res.FirstErr(); err != nil {
		return 0, fmt.Errorf("producing the probe to %s: %w", from.Name, err)
	}
	part := res[0].Record.Partition
	for {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			return 0, fmt.Errorf("the probe from %s did not reach %s's %s within %v", from.Name, to.Name, remote, timeout)
		}
		var found bool
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Key) == key && r.Partition == part && bytes.Equal(r.Value, val) {
				found = true
			}
		})
		if found {
			return time.Since(start), nil
		}
	}
}

// probeBlocked returns an error if a hit produced in from reaches to within wait. It
// runs beside the load, off the test's goroutine, so it reports instead of failing.
func probeBlocked(from, to *dc, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	key := fmt.Sprintf("probe|blocked=%s,n=%d#1s", from.Name, time.Now().UnixNano())
	val, err := topics.Hit{Key: key, Site: from.Name, BucketStart: time.Now().UnixMilli(), Window: 1000, Count: 1}.MarshalBinary()
	if err != nil {
		return err
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(from.Addr), kgo.DefaultProduceTopic(topics.DefaultHitsTopic))
	if err != nil {
		return err
	}
	defer prod.Close()
	if err := prod.ProduceSync(ctx, &kgo.Record{Key: []byte(key), Value: val}).FirstErr(); err != nil {
		return fmt.Errorf("producing to %s: %w", from.Name, err)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(to.Addr), kgo.ConsumeTopics(topics.RemoteHitsTopic(from.Name, topics.DefaultHitsTopic)),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer cons.Close()
	for ctx.Err() == nil {
		var crossed bool
		cons.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			crossed = crossed || string(r.Key) == key
		})
		if crossed {
			return fmt.Errorf("a hit crossed %s → %s while the link was cut", from.Name, to.Name)
		}
	}
	return nil
}
