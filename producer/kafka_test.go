package producer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// 32 goroutines hit 1000 keys on two windows with random n while the background flush
// runs; after Close the topic holds exactly what was sent, every record on the partition
// Java's default partitioner gives its key.
func TestConcurrentHitsExact(t *testing.T) {
	const partitions = 4
	brokers := testenv.Brokers(t)
	topic := testenv.CreateTopic(t, "hits", partitions, nil)
	p, err := New(Config{Brokers: brokers, Topic: topic, Site: "eu-1", FlushInterval: 5 * time.Millisecond,
		BucketWidth: 10 * time.Millisecond, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("api:POST /articles|user=%d", i)
	}
	windows := []time.Duration{time.Minute, time.Hour}
	const goroutines, perG = 32, 5000
	sent := make([]map[counter]int64, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			m := map[counter]int64{}
			for range perG {
				k, w, n := keys[rng.IntN(len(keys))], windows[rng.IntN(2)], 1+rng.IntN(5)
				p.Hit(k, w, n)
				m[counter{k, w.Milliseconds()}] += int64(n)
			}
			sent[g] = m
		}()
	}
	wg.Wait()
	want := map[counter]int64{}
	var total int64
	for _, m := range sent {
		for c, n := range m {
			want[c] += n
			total += n
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	st := p.Stats()
	if st.HitsIn != total || st.DroppedHits != 0 || st.UnsentHits != 0 || st.InFlightHits != 0 {
		t.Fatalf("stats %+v, sent %d hits", st, total)
	}
	got := readTopic(t, brokers, topic)
	if len(got.counts) != len(want) {
		t.Errorf("topic has %d counters, sent %d", len(got.counts), len(want))
	}
	for c, n := range want {
		if got.counts[c] != n {
			t.Errorf("%v: topic says %d, sent %d", c, got.counts[c], n)
		}
	}
	if int64(got.records) != st.RecordsOut {
		t.Errorf("topic has %d records, producer acknowledged %d", got.records, st.RecordsOut)
	}
	// Once the partition count is known, the counts of a flush travel in hit batches (whose
	// hits readTopic checks are on the partitions that own them).
	if got.batches == 0 || int64(got.batches) != st.BatchesOut {
		t.Errorf("topic has %d hit batches, producer acknowledged %d", got.batches, st.BatchesOut)
	}
	for i, h := range got.hits {
		if want := javaPartition([]byte(h.Key), partitions); got.parts[i] != want {
			t.Fatalf("key %q on partition %d, Java's partitioner says %d", h.Key, got.parts[i], want)
		}
		if h.BucketStart%10 != 0 || h.Site != "eu-1" {
			t.Fatalf("record %+v: bucket not aligned to 10 ms or wrong site", h)
		}
	}
	t.Logf("%d hits in %d records, %d hit batches", total, got.records, got.batches)
}

// With SingleHitRecords, every count is a record of its own keyed by its counter key, as
// aggregators older than hit batches read them.
func TestSingleHitRecords(t *testing.T) {
	brokers := testenv.Brokers(t)
	topic := testenv.CreateTopic(t, "hits", 4, nil)
	p, err := New(Config{Brokers: brokers, Topic: topic, Site: "eu-1", FlushInterval: 5 * time.Millisecond,
		BucketWidth: 10 * time.Millisecond, SingleHitRecords: true, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	want := map[counter]int64{}
	for r := range 20 {
		for i := range 100 {
			k := fmt.Sprintf("k%d", i)
			p.Hit(k, time.Minute, 1)
			want[counter{k, 60000}]++
		}
		if r%5 == 4 {
			time.Sleep(15 * time.Millisecond) // several flushes
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	got := readTopic(t, brokers, topic)
	if got.batches != 0 || p.Stats().BatchesOut != 0 || !maps.Equal(got.counts, want) {
		t.Fatalf("%d hit batches (%d acknowledged), counts %v; want none and %v", got.batches, p.Stats().BatchesOut, got.counts, want)
	}
}

// 100 000 hits on 10 keys within one flush interval make one record per key.
func TestCoalescingBound(t *testing.T) {
	brokers := testenv.Brokers(t)
	topic := testenv.CreateTopic(t, "hits", 3, nil)
	clk := clock.NewFake(time.UnixMilli(1_763_740_000_000))
	p, err := New(Config{Brokers: brokers, Topic: topic, Site: "eu-1", Clock: clk, FlushInterval: -1, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100_000 {
		p.Hit(fmt.Sprintf("key-%d", i%10), time.Minute, 1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.RecordsOut > 10 {
		t.Fatalf("100000 hits on 10 keys made %d records, want at most 10", st.RecordsOut)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	got := readTopic(t, brokers, topic)
	if got.records > 10 {
		t.Fatalf("topic has %d records, want at most 10", got.records)
	}
	for i := range 10 {
		if n := got.counts[counter{fmt.Sprintf("key-%d", i), 60000}]; n != 10_000 {
			t.Errorf("key-%d: %d hits, want 10000", i, n)
		}
	}
}

// hitAll runs f in a goroutine and fails the test if it has not returned within a generous
// deadline: Hit must never block, whatever Kafka does.
func mustNotBlock(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("%s: Hit calls still running after 20s: blocked", what)
	}
}

// With nothing listening on the broker address, Hit still returns, memory stays under the
// bound, the excess is dropped and counted, and Close reports what it kept.
func TestBrokerUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	const bound = 500
	p, err := New(Config{Brokers: []string{dead}, Site: "eu-1", FlushInterval: 2 * time.Millisecond,
		MaxBufferedKeys: bound, MaxInFlightRecords: 100, BucketWidth: time.Millisecond, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	var maxSeen atomic.Int64
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			if b := p.Stats().BufferedKeys; b > maxSeen.Load() {
				maxSeen.Store(b)
			}
			select {
			case <-stopWatch:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	}()
	var sent int64
	mustNotBlock(t, "dead broker", func() {
		for round := range 20 {
			for i := range 2000 {
				p.Hit(fmt.Sprintf("k%d", i), time.Minute, 1+round%3)
				sent += int64(1 + round%3)
			}
			time.Sleep(3 * time.Millisecond) // let flushes run and buckets move on
		}
	})
	close(stopWatch)
	<-watchDone
	st := p.Stats()
	if maxSeen.Load() > bound || st.BufferedKeys > bound {
		t.Fatalf("buffered keys reached %d (now %d), bound %d", maxSeen.Load(), st.BufferedKeys, bound)
	}
	if st.DroppedHits == 0 || st.RecordsOut != 0 {
		t.Fatalf("stats %+v: want drops and no records out", st)
	}
	if st.HitsIn+st.DroppedHits < sent || st.HitsIn > sent {
		t.Fatalf("stats %+v do not account for %d hits sent", st, sent)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = p.Close(ctx)
	var ue *UndeliveredError
	if !errors.As(err, &ue) || ue.Hits <= 0 || ue.Hits > st.HitsIn || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want an UndeliveredError with 0 < hits <= %d wrapping the deadline", err, st.HitsIn)
	}
}

// gate is a TCP proxy to the real broker that the test can cut (existing connections are
// closed, new ones are refused) and restore.
type gate struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	open   bool
	conns  map[net.Conn]struct{}
}

func newGate(t *testing.T, target string) *gate {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { ln.Close(); g.set(false) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go g.serve(c)
		}
	}()
	return g
}

func (g *gate) serve(c net.Conn) {
	g.mu.Lock()
	if !g.open {
		g.mu.Unlock()
		c.Close()
		return
	}
	up, err := net.Dial("tcp", g.target)
	if err != nil {
		g.mu.Unlock()
		c.Close()
		return
	}
	g.conns[c], g.conns[up] = struct{}{}, struct{}{}
	g.mu.Unlock()
	go func() { io.Copy(up, c); up.Close(); c.Close() }()
	io.Copy(c, up)
	c.Close()
	up.Close()
}

func (g *gate) set(open bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = open
	if !open {
		for c := range g.conns {
			c.Close()
		}
		clear(g.conns)
	}
}

// Hits recorded while the broker is unreachable are kept and arrive exactly once when it
// is back, including after a cut in the middle of producing.
func TestBrokerComesBack(t *testing.T) {
	brokers := testenv.Brokers(t)
	topic := testenv.CreateTopic(t, "hits", 3, nil)
	g := newGate(t, brokers[0])
	// Every connection, to the seed or to the broker metadata names, goes through the gate.
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, g.ln.Addr().String())
	}
	p, err := New(Config{Brokers: []string{g.ln.Addr().String()}, Topic: topic, Site: "eu-1",
		FlushInterval: 5 * time.Millisecond, BucketWidth: 5 * time.Millisecond,
		MaxInFlightRecords: 50, Logger: discard,
		KafkaOpts: []kgo.Opt{kgo.Dialer(dial), kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond })}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[counter]int64{}
	hit := func(rounds int) {
		for r := range rounds {
			for i := range 200 {
				k := fmt.Sprintf("k%d", i)
				p.Hit(k, time.Minute, 1+r%2)
				want[counter{k, 60000}] += int64(1 + r%2)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	// Down from the start.
	mustNotBlock(t, "broker down", func() { hit(30) })
	if st := p.Stats(); st.RecordsOut != 0 || st.UnsentHits+st.InFlightHits == 0 {
		t.Fatalf("while down: %+v, want nothing out and hits kept", st)
	}
	// Up, then cut while producing, then hits while down again.
	g.set(true)
	mustNotBlock(t, "broker up", func() { hit(30) })
	g.set(false)
	mustNotBlock(t, "broker cut", func() { hit(30) })
	kept := p.Stats()
	// Back for good.
	g.set(true)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	st := p.Stats()
	if st.DroppedHits != 0 || st.UnsentHits != 0 || st.InFlightHits != 0 {
		t.Fatalf("after Close: %+v", st)
	}
	got := readTopic(t, brokers, topic)
	for c, n := range want {
		if got.counts[c] != n {
			t.Errorf("%v: topic says %d, sent %d", c, got.counts[c], n)
		}
	}
	if len(got.counts) != len(want) {
		t.Errorf("topic has %d counters, sent %d", len(got.counts), len(want))
	}
	if got.batches == 0 {
		t.Error("no hit batches: the counts kept while the broker was away were not sent in batches")
	}
	t.Logf("before the broker came back: %d hits kept (%d unsent, %d in flight); %d records in all, %d hit batches",
		kept.UnsentHits+kept.InFlightHits, kept.UnsentHits, kept.InFlightHits, got.records, got.batches)
}

// Site heartbeats reach every partition, and each promises what it says: on its partition,
// no hit record that follows it starts before its time.
func TestSiteHeartbeatsOnEveryPartition(t *testing.T) {
	const partitions = 4
	brokers := testenv.Brokers(t)
	topic := testenv.CreateTopic(t, "hits", partitions, nil)
	p, err := New(Config{Brokers: brokers, Topic: topic, Site: "eu-1", FlushInterval: 5 * time.Millisecond,
		BucketWidth: 10 * time.Millisecond, SiteHeartbeatInterval: 50 * time.Millisecond, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		p.Hit(fmt.Sprintf("k%d", i%64), time.Minute, 1)
		if i%64 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	got := readTopic(t, brokers, topic)
	for part := range int32(partitions) {
		hbs := got.siteHeartbeats[part]
		if len(hbs) < 5 {
			t.Fatalf("partition %d got %d site heartbeats in 1 s at 50 ms", part, len(hbs))
		}
		var last int64 = -1
		for _, h := range got.seq[part] {
			if h.IsSiteHeartbeat() {
				if h.Site != "eu-1" || h.BucketStart < last {
					t.Fatalf("partition %d: heartbeat %+v after %d", part, h, last)
				}
				last = h.BucketStart
				continue
			}
			if h.BucketStart < last {
				t.Fatalf("partition %d: hit %+v after a heartbeat at %d", part, h, last)
			}
		}
	}
	if st := p.Stats(); st.SiteHeartbeatsOut < 5*partitions {
		t.Fatalf("stats %+v", st)
	}
}
