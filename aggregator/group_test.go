package aggregator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// On kfake, in a synctest bubble (virtual time), members of one group over three hits topics of six partitions (by
// pattern, as deployed) join and leave: each always holds partition s of every topic
// together (one key, one owner), no slot is ever seen held by two members, a join takes
// only the slots that move from the members that give them up (cooperative: nobody else
// revokes anything), and a member that stops leaves at once and its slots go to the others.
func TestGroupCooperativeCoPartitioned(t *testing.T) {
	synctest.Test(t, testGroupCooperativeCoPartitioned)
}

func testGroupCooperativeCoPartitioned(t *testing.T) {
	const parts = 6
	hits, counts, group := "hits", "counts", "aggregators"
	brokers, dial := virtualKafka(t, map[string]int32{hits: parts, topics.RemoteHitsTopic("us", hits): parts,
		topics.RemoteHitsTopic("ap", hits): parts, counts: 2})

	type member struct {
		a    *Aggregator
		reg  *prometheus.Registry
		stop func()
	}
	members := map[string]*member{}
	var mu sync.Mutex
	start := func(id string) *member {
		reg := prometheus.NewRegistry()
		a, err := New(Config{Brokers: brokers, Group: group, TopicPattern: topics.HitsPattern(hits),
			CountsTopic: counts, InstanceID: id, MetadataMaxAge: 2 * time.Second, KafkaOpts: []kgo.Opt{dial},
			Registerer: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(runCtx) }()
		var once sync.Once
		m := &member{a: a, reg: reg, stop: func() {
			once.Do(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("%s: %v", id, err)
				}
			})
		}}
		t.Cleanup(m.stop)
		mu.Lock()
		members[id] = m
		mu.Unlock()
		return m
	}

	// Watch every member's assignment all along.
	var (
		violations []string
		watchStop  = make(chan struct{})
		watchDone  = make(chan struct{})
	)
	holders := func() map[int32][]string {
		mu.Lock()
		defer mu.Unlock()
		out := map[int32][]string{}
		for id, m := range members {
			for _, s := range slotsOf(m.a.Assigned()) {
				out[s] = append(out[s], id)
			}
		}
		return out
	}
	var stopOnce sync.Once
	stopWatch := func() {
		stopOnce.Do(func() { close(watchStop) })
		<-watchDone
	}
	// Also when the test fails early: a bubble ends only when all its goroutines have.
	t.Cleanup(stopWatch)
	go func() {
		defer close(watchDone)
		for {
			select {
			case <-watchStop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			// A slot seen with two holders in two passes in a row was held by both at once.
			first, second := holders(), holders()
			for s, ids := range first {
				if len(ids) > 1 && len(second[s]) > 1 {
					violations = append(violations, fmt.Sprintf("slot %d held by %v", s, second[s]))
				}
			}
		}
	}()
	stable := func(want ...string) {
		t.Helper()
		eventually(t, fmt.Sprintf("%v hold every slot, ready", want), 30*time.Second, func() bool {
			h := holders()
			if len(h) != parts {
				return false
			}
			// Each member holds slots of its own: a member that has just joined is ready
			// before the rebalance that gives it any, while the others still hold them all.
			for _, id := range want {
				if !members[id].a.Ready() || len(slotsOf(members[id].a.Assigned())) == 0 {
					return false
				}
			}
			return true
		})
		for _, id := range want {
			as := members[id].a.Assigned()
			var first []int32
			for _, tp := range []string{hits, topics.RemoteHitsTopic("us", hits), topics.RemoteHitsTopic("ap", hits)} {
				ps := slices.Sorted(slices.Values(as[tp]))
				if first == nil {
					first = ps
				}
				if !slices.Equal(ps, first) {
					t.Fatalf("%s holds %v of %s but %v of %s: not co-partitioned", id, ps, tp, first, hits)
				}
			}
		}
	}
	revoked := func(id string) float64 {
		return metricValue(t, members[id].reg, "streamlimit_aggregator_group_partitions_total", "event", eventRevoked)
	}

	start("A")
	stable("A")
	start("B")
	stable("A", "B")
	aRev := revoked("A")
	if aRev != 3*parts/2 {
		t.Fatalf("A revoked %v partitions when B joined, want the %d of the slots B took", aRev, 3*parts/2)
	}
	start("C")
	stable("A", "B", "C")
	// C took 2 slots, 6 partitions, from A and B together, and nothing else moved.
	if n := revoked("A") + revoked("B") - aRev; n != 3*parts/3 {
		t.Fatalf("A and B revoked %v partitions when C joined, want %d", n, 3*parts/3)
	}
	aBefore, cBefore := revoked("A"), revoked("C")
	members["B"].stop()
	mu.Lock()
	delete(members, "B")
	mu.Unlock()
	stable("A", "C")
	// B left: A and C only took its slots.
	if revoked("A") != aBefore || revoked("C") != cBefore {
		t.Fatalf("B left: A revoked %v partitions, C %v", revoked("A")-aBefore, revoked("C")-cBefore)
	}
	for _, id := range []string{"A", "C"} {
		if got := metricValue(t, members[id].reg, "streamlimit_aggregator_group_events_total", "event", eventLost); got != 0 {
			t.Fatalf("%s lost partitions %v times", id, got)
		}
	}
	stopWatch()
	if len(violations) > 0 {
		t.Fatalf("one key, one owner broken: %v", violations[:min(len(violations), 5)])
	}
}
