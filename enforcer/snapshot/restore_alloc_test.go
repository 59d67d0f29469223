//go:build !race

// A million records through the race detector would take minutes and measure its shadow
// memory; make test runs this file in its race-free pass (the real-parts tier also runs
// it without -race).

package snapshot

import (
	"context"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

// TestRestoreAllocatesWithinBudget restores a counts topic of a million keys (8
// partitions, on the real broker) into a snapshot given the enforcer's share of a 256 MiB
// memory target (a quarter of half: 32 MiB), with the Go soft memory limit at the target
// as `streamlimit enforcer --max-memory 256MiB` sets it, and checks that the Go runtime's
// memory stays within the target throughout the restore, and that the snapshot is full
// (it holds what its budget allows, and refused the rest).
func TestRestoreAllocatesWithinBudget(t *testing.T) {
	const (
		target = 256 << 20
		keys   = 1_000_000
	)
	brokers := testenv.Brokers(t)
	topic := testenv.CreateTopic(t, "counts", 8, nil)
	now := time.Now()
	func() {
		cl := testenv.KafkaClient(t, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(10*time.Millisecond))
		defer cl.Close()
		ctx := context.Background()
		for i := range keys {
			key := "api|user=" + strconv.Itoa(i) + "#3600s"
			c := topics.Count{Key: key, Window: 3_600_000, AsOf: now.UnixMilli(), Total: 3,
				Sites: []topics.SiteCount{{Site: "eu", Count: 1, Demand: 1}, {Site: "us", Count: 2, Demand: 2}}}
			v, err := c.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			cl.Produce(ctx, &kgo.Record{Key: []byte(key), Value: v}, func(_ *kgo.Record, err error) {
				if err != nil {
					t.Errorf("produce: %v", err)
				}
			})
		}
		if err := cl.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}()
	runtime.GC()
	debug.FreeOSMemory()
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(target))

	s, err := New(Config{Brokers: brokers, Topic: topic, Site: "eu", MaxBytes: target / 2 / 4})
	if err != nil {
		t.Fatal(err)
	}
	sample := []rtmetrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	var peak uint64
	measure := func() {
		rtmetrics.Read(sample)
		peak = max(peak, sample[0].Value.Uint64()-sample[1].Value.Uint64())
	}
	measure()
	base := peak
	start := time.Now()
	runSnapshot(t, s)
	for !s.Ready() {
		measure()
		time.Sleep(5 * time.Millisecond)
	}
	measure()
	t.Logf("restored %d records in %v: %d keys held (%d MiB), Go memory %d MiB before, peak %d MiB (target %d MiB)",
		keys, time.Since(start).Round(time.Millisecond), s.Len(), s.Bytes()>>20, base>>20, peak>>20, target>>20)
	if peak > target {
		t.Errorf("Go memory peaked at %d MiB during the restore, above the %d MiB target", peak>>20, target>>20)
	}
	if s.Bytes() < target/2/4*9/10 {
		t.Errorf("the snapshot holds %d bytes of its %d", s.Bytes(), target/2/4)
	}
}
