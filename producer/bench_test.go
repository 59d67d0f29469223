package producer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"golang.org/x/time/rate"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// BenchmarkHit measures Hit on 10 000 known keys with the real clock and the background
// flush running against an in-process kfake broker, serially and from parallel goroutines
// (run with -cpu 1,2), against a baseline timed in the same run: golang.org/x/time/rate's
// Allow on a map of 10 000 limiters, one per key, found by a map lookup under a read lock
// (as enforcer's BenchmarkXTimeRateAllow) — the same work of finding a key's state and
// updating it at the current time. The two alternate in rounds of hitRound calls, so that
// the machine's noise falls on both alike. ns/op is Hit's time per call, xtimerate-ns/op
// the baseline's, ratio their quotient; cpu-ratio is the quotient of the CPU time each
// took on its thread (Linux), which leaves out the time other processes held the core.
func BenchmarkHit(b *testing.B) {
	c := newFake(b, 4, "hits")
	p, err := New(Config{Brokers: c.ListenAddrs(), Site: "eu-1", Logger: discard})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(context.Background())
	keys := make([]string, 10_000)
	var mu sync.RWMutex
	lims := make(map[string]*rate.Limiter, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("api:POST /articles|user=%d", i)
		p.Hit(keys[i], time.Minute, 1)
		lims[keys[i]] = rate.NewLimiter(rate.Limit(1e9), 1e9)
	}
	hit := func(i int) { p.Hit(keys[i], time.Minute, 1) }
	allow := func(i int) {
		mu.RLock()
		l := lims[keys[i]]
		mu.RUnlock()
		if !l.Allow() {
			b.Error("denied")
		}
	}
	run := func(b *testing.B, step int, loop func(round func(m int, i *int))) {
		b.ReportAllocs()
		var mu sync.Mutex
		var hitT, allowT roundTimes
		loop(func(m int, i *int) {
			var h, a roundTimes
			timeRound(m, i, len(keys), step, hit, &h)
			timeRound(m, i, len(keys), step, allow, &a)
			mu.Lock()
			hitT.add(h)
			allowT.add(a)
			mu.Unlock()
		})
		if hitT.calls == 0 || allowT.wall == 0 {
			return
		}
		n := float64(hitT.calls)
		b.ReportMetric(float64(hitT.wall)/n, "ns/op")
		b.ReportMetric(float64(allowT.wall)/n, "xtimerate-ns/op")
		b.ReportMetric(float64(hitT.wall)/float64(allowT.wall), "ratio")
		if hitT.cpu > 0 && allowT.cpu > 0 {
			b.ReportMetric(float64(hitT.cpu)/n, "cpu-ns/op")
			b.ReportMetric(float64(hitT.cpu)/float64(allowT.cpu), "cpu-ratio")
		}
	}
	b.Run("serial", func(b *testing.B) {
		run(b, 1, func(round func(int, *int)) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			i := 0
			for n := 0; n < b.N; n += hitRound {
				round(min(hitRound, b.N-n), &i)
			}
		})
	})
	b.Run("parallel", func(b *testing.B) {
		run(b, 7, func(round func(int, *int)) {
			b.RunParallel(func(pb *testing.PB) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				i := int(time.Now().UnixNano()) % len(keys)
				for {
					m := 0
					for m < hitRound && pb.Next() {
						m++
					}
					if m == 0 {
						return
					}
					round(m, &i)
				}
			})
		})
	})
}

// hitRound is how many calls BenchmarkHit times in one go, of Hit and of its baseline in
// turn: enough that reading the clocks around them costs little, few enough that both
// share every second of the machine's noise.
const hitRound = 2000

// roundTimes adds up rounds of calls: their number, wall time and thread CPU time (ns).
type roundTimes struct{ calls, wall, cpu int64 }

func (r *roundTimes) add(o roundTimes) {
	r.calls += o.calls
	r.wall += o.wall
	r.cpu += o.cpu
}

// timeRound calls f(k) for m keys k from *i on, stepping by step modulo n, and records the
// calls and the time they took in t. The caller locks its goroutine to its thread.
func timeRound(m int, i *int, n, step int, f func(int), t *roundTimes) {
	k := *i
	cpu0, start := threadCPU(), time.Now()
	for range m {
		f(k)
		if k += step; k >= n {
			k -= n
		}
	}
	wall, cpu1 := time.Since(start), threadCPU()
	*i = k
	t.add(roundTimes{calls: int64(m), wall: int64(wall), cpu: cpu1 - cpu0})
}

// BenchmarkCoalescingRealBroker drives 1 000 keys at 1 000 hits/s each for 10 s of fake
// time through the real flush path (a background flush every 50 ms of fake time) into the
// real broker, and reports hits per record written.
func BenchmarkCoalescingRealBroker(b *testing.B) {
	brokers := testenv.Brokers(b)
	for b.Loop() {
		topic := testenv.CreateTopic(b, "hits", 4, nil)
		clk := clock.NewFake(time.UnixMilli(1_763_740_000_000))
		p, err := New(Config{Brokers: brokers, Topic: topic, Site: "eu-1", Clock: clk, FlushInterval: -1, Logger: discard})
		if err != nil {
			b.Fatal(err)
		}
		keys := make([]string, 1000)
		for i := range keys {
			keys[i] = fmt.Sprintf("key-%d", i)
		}
		const step = 10 * time.Millisecond // 10 hits per key per step = 1 000 hits/s
		for s := range 1000 {              // 10 s
			for _, k := range keys {
				p.Hit(k, time.Minute, 10)
			}
			clk.Advance(step)
			if s%5 == 4 {
				p.flush(false) // what the background flush does every 50 ms
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := p.Close(ctx); err != nil {
			b.Fatal(err)
		}
		cancel()
		st := p.Stats()
		got := readTopic(b, brokers, topic)
		if got.records != int(st.RecordsOut) || st.HitsIn != 10_000_000 {
			b.Fatalf("topic has %d records, producer says %+v", got.records, st)
		}
		b.ReportMetric(float64(st.HitsIn)/float64(st.RecordsOut), "hits/record")
		b.ReportMetric(float64(st.RecordsOut), "records")
		b.ReportMetric(float64(st.BytesOut)/float64(st.RecordsOut), "bytes/record")
	}
}

// BenchmarkPublishLoad drives the publishing path as the serving bench's Kafka row does —
// Hit on 10 000 keys round-robin at publishRate hits/s for publishFor, so that every
// count is alone in its bucket — against the real broker, with the counts in hit batches
// (records=batches, the default) and as records of their own (records=single,
// SingleHitRecords), each after a run with no Hit at all (the pacing's own cost). It
// reports the process's CPU per hit above that baseline (cpu-ns/hit), the broker's when
// its process is the one e2e/services started (broker-cpu-ns/hit; the broker is shared, so
// its figure includes what other clients cost it), and the produce requests per second.
func BenchmarkPublishLoad(b *testing.B) {
	brokers := testenv.Brokers(b)
	topic := testenv.CreateTopic(b, "hits", 4, nil)
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("api|user=%d#60s", i)
	}
	bpid := ""
	if dir := os.Getenv("STREAMLIMIT_RUN_DIR"); dir != "" {
		if v, err := os.ReadFile(filepath.Join(dir, "kafka", "kafka.pid")); err == nil {
			bpid = strings.TrimSpace(string(v))
		}
	}
	// run paces Hits (none with noHits) for d and returns the hits, the process's and the
	// broker's CPU, and the produce requests the client wrote.
	run := func(b *testing.B, single, noHits bool, d time.Duration) (hits int, cpu, broker time.Duration, reqs int64) {
		var produces atomic.Int64
		p, err := New(Config{Brokers: brokers, Topic: topic, Site: "eu-1", SingleHitRecords: single, Logger: discard,
			KafkaOpts: []kgo.Opt{kgo.WithHooks(produceCounter{&produces})}})
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close(context.Background())
		pace := func(d time.Duration) int {
			n, k := 0, 0
			start := time.Now()
			for time.Since(start) < d {
				for range publishRate / 1000 {
					if !noHits {
						p.Hit(keys[k], time.Minute, 1)
					}
					k = (k + 1) % len(keys)
					n++
				}
				time.Sleep(time.Millisecond - time.Since(start)%time.Millisecond)
			}
			return n
		}
		pace(time.Second) // every counter known, the partition count learned
		cpu0, b0, r0 := processCPU(), procCPU(bpid), produces.Load()
		hits = pace(d)
		return hits, processCPU() - cpu0, procCPU(bpid) - b0, produces.Load() - r0
	}
	for _, c := range []struct {
		name   string
		single bool
	}{{"records=batches", false}, {"records=single", true}} {
		b.Run(c.name, func(b *testing.B) {
			var cpuHit, brokerHit, reqsPerSec float64
			for b.Loop() {
				n0, cpu0, broker0, _ := run(b, c.single, true, publishFor)
				n, cpu, broker, reqs := run(b, c.single, false, publishFor)
				cpuHit = float64(cpu.Nanoseconds())/float64(n) - float64(cpu0.Nanoseconds())/float64(n0)
				brokerHit = float64(broker.Nanoseconds())/float64(n) - float64(broker0.Nanoseconds())/float64(n0)
				reqsPerSec = float64(reqs) / publishFor.Seconds()
			}
			b.ReportMetric(cpuHit, "cpu-ns/hit")
			if bpid != "" {
				b.ReportMetric(brokerHit, "broker-cpu-ns/hit")
			}
			b.ReportMetric(reqsPerSec, "produce-req/s")
		})
	}
}

// The load of BenchmarkPublishLoad: the serving bench's Kafka row admits 30-40 k calls/s.
const (
	publishRate = 30_000
	publishFor  = 4 * time.Second
)

// produceCounter counts the produce requests a client writes.
type produceCounter struct{ n *atomic.Int64 }

func (h produceCounter) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	if key == 0 { // Produce
		h.n.Add(1)
	}
}
