package producer

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// ErrClosed is returned by Flush and Close once Close has been called.
var ErrClosed = errors.New("producer closed")

// UndeliveredError reports hits that Flush or Close could not get acknowledged by Kafka.
type UndeliveredError struct {
	// Hits is the sum of the counts not acknowledged. After Close these are lost; some of
	// them may still have reached Kafka if they were in flight when the deadline passed
	// (with a caller-provided client, which Close leaves open, they may yet arrive).
	Hits int64
	// Records is the number of (key, window, bucket) records they make up.
	Records int64
	// Err is the cause: the context's error, or the last produce error.
	Err error
}

func (e *UndeliveredError) Error() string {
	return fmt.Sprintf("producer: %d hits in %d records not delivered: %v", e.Hits, e.Records, e.Err)
}

func (e *UndeliveredError) Unwrap() error { return e.Err }

// numShards splits the counters so that Hits on different keys rarely share a lock. A power
// of two.
const numShards = 64

// counterKey names one counter: a (key, window) pair.
type counterKey struct {
	key    string
	window int64 // ms
}

// entry is a known counter and the count of its current bucket. Guarded by its shard's mu.
type entry struct {
	ck     counterKey
	bucket int64 // start of the bucket n counts toward, unix ms
	end    int64 // end of that bucket, unix ms
	n      int64 // hits in bucket not yet drained
	d      int64 // denied requests in bucket not yet drained
	dirty  bool  // on the shard's dirty list
}

// record is one (key, window, bucket) count on its way to Kafka.
type record struct {
	ck     counterKey
	bucket int64
	n, d   int64
}

// counts is a merged (hits, denied) pair waiting for Kafka.
type counts struct{ n, d int64 }

type recordKey struct {
	ck     counterKey
	bucket int64
}

type shard struct {
	mu sync.Mutex
	// m finds entries by a 64-bit hash of (key, window), so that a lookup hashes the key
	// once (the same hash picks the shard); coll holds the rare entries whose hash another
	// entry already has.
	m       map[uint64]*entry
	coll    map[counterKey]*entry
	dirty   []*entry // entries with n > 0
	pending []record // finished buckets pushed out of entries by a newer bucket
	hitsIn  int64    // guarded by mu
	dropped atomic.Int64
	invalid atomic.Int64
	_       [64]byte // keep shards on separate cache lines
}

func (s *shard) get(h uint64, ck counterKey) *entry {
	if e := s.m[h]; e != nil && e.ck == ck {
		return e
	}
	if len(s.coll) > 0 {
		return s.coll[ck]
	}
	return nil
}

func (s *shard) put(h uint64, e *entry) {
	if _, taken := s.m[h]; !taken {
		s.m[h] = e
		return
	}
	if s.coll == nil {
		s.coll = make(map[counterKey]*entry)
	}
	s.coll[e.ck] = e
}

// Producer publishes hits to the Kafka hits topic, coalesced per (key, window, bucket). See
// the package documentation for the model. Create one with New; it is safe for
// simultaneous use by multiple goroutines.
type Producer struct {
	cfg       Config
	cl        *kgo.Client
	ownClient bool
	widthMs   int64
	idleMs    int64
	maxKeys   int64
	seed      maphash.Seed
	shards    [numShards]shard
	parts     partitioner // the client's partitioner when the Producer built the client

	hbNext int64 // unix ms of the next site heartbeat, guarded by flushMu

	buffered atomic.Int64 // entries + pending + unsent records; ≤ maxKeys
	closed   atomic.Bool

	flushMu     sync.Mutex // serialises drains and hand-offs
	batch       []record   // reused by flush, guarded by flushMu
	sweepNext   int        // next shard the idle sweep visits, guarded by flushMu
	lastDropped int64      // dropped count at the previous flush, guarded by flushMu
	lastLog     time.Time  // last produce-failure log, guarded by flushMu

	unsentMu   sync.Mutex
	unsent     map[recordKey]counts // counts Kafka could not take yet, merged
	unsentHits atomic.Int64

	maxInflight   int64
	inflightRecs  atomic.Int64
	inflightHits  atomic.Int64
	recordsOut    atomic.Int64
	heartbeatsOut atomic.Int64
	bytesOut      atomic.Int64
	produceErrs   atomic.Int64
	lastErr       atomic.Pointer[error]
	flushes       atomic.Int64

	metrics *metrics
	stop    chan struct{}
	done    chan struct{}
}

// New returns a Producer for cfg, building its Kafka client from cfg.Brokers unless
// cfg.Client is given, registering its metrics on cfg.Registerer, and starting the
// background flush. It does not wait for Kafka to be reachable.
func New(cfg Config) (*Producer, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Producer{
		cfg:     cfg,
		widthMs: cfg.BucketWidth.Milliseconds(),
		idleMs:  cfg.IdleTimeout.Milliseconds(),
		maxKeys: int64(cfg.MaxBufferedKeys),
		seed:    maphash.MakeSeed(),
		unsent:  make(map[recordKey]counts),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	for i := range p.shards {
		p.shards[i].m = make(map[uint64]*entry)
	}
	if cfg.Client != nil {
		p.cl = cfg.Client
		p.maxInflight = DefaultMaxInFlightRecords
		if v, ok := p.cl.OptValue(kgo.MaxBufferedRecords).(int64); ok && v > 0 {
			p.maxInflight = v
		}
	} else {
		p.maxInflight = int64(cfg.MaxInFlightRecords)
		p.parts.inner = kgo.StickyKeyPartitioner(nil)
		opts := append([]kgo.Opt{
			kgo.SeedBrokers(cfg.Brokers...),
			// StickyKeyPartitioner(nil) is documented to place keyed records exactly as
			// Java does (before and after 3.3): murmur2, high bit masked, mod the
			// partition count. Non-Go producers can match it (librdkafka:
			// partitioner=murmur2_random).
			//
			// The wrapper sends site heartbeats to the partition they name, and learns the
			// partition count from every record it places.
			kgo.RecordPartitioner(&p.parts),
			kgo.MaxBufferedRecords(cfg.MaxInFlightRecords),
		}, cfg.KafkaOpts...)
		p.cl, err = kgo.NewClient(opts...)
		if err != nil {
			return nil, fmt.Errorf("producer: kafka client: %w", err)
		}
		p.ownClient = true
	}
	if cfg.Registerer != nil {
		p.metrics, err = newMetrics(p, cfg.Registerer)
		if err != nil {
			if p.ownClient {
				p.cl.Close()
			}
			return nil, fmt.Errorf("producer: metrics: %w", err)
		}
	}
	if cfg.FlushInterval > 0 {
		go p.loop()
	} else {
		close(p.done)
	}
	return p, nil
}

// Hit records n hits of key, toward a window of length window, at the Producer's clock's
// current time. It is HitAt(key, window, cfg.Clock.Now(), n).
func (p *Producer) Hit(key string, window time.Duration, n int) {
	p.HitAt(key, window, p.cfg.Clock.Now(), n)
}

// HitAt records n hits of key, toward a window of length window (whole milliseconds; the
// rest is truncated), in the bucket that contains t. The (key, window) pair is one counter:
// hits with different windows are counted apart. A bucket is BucketWidth long, cut short at
// the sub-bucket boundaries of the window (window.Width with SubBuckets), so that every
// record the aggregator receives lies in one of its sub-buckets.
//
// HitAt never blocks on Kafka and never performs I/O; it takes a per-shard mutex that is
// only ever held for in-memory map and slice operations. Once the counter is known and
// its bucket current, it does not allocate. Invalid input (empty key, key longer than
// topics.MaxKeyLen, not valid UTF-8 or starting with topics.ReservedPrefix, window < 1 ms,
// n < 1) is ignored and counted in invalid_hits_total. Hits that the memory bound cannot take, or
// that arrive after Close, are dropped and counted in dropped_hits_total.
func (p *Producer) HitAt(key string, window time.Duration, t time.Time, n int) {
	p.add(key, window, t, int64(n), 0)
}

// Denied records n requests for key, toward a window of length window, that were refused at
// this site at the Producer's clock's current time. It is DeniedAt(key, window,
// cfg.Clock.Now(), n).
func (p *Producer) Denied(key string, window time.Duration, n int) {
	p.DeniedAt(key, window, p.cfg.Clock.Now(), n)
}

// DeniedAt records n refused requests for key in the bucket that contains t. They count
// toward no limit: they are the site's demand for the key, from which sites share a hot
// key's room (a site where a client has just arrived has demand before it has hits). It is
// coalesced with the hits of the same bucket and behaves as HitAt otherwise.
func (p *Producer) DeniedAt(key string, window time.Duration, t time.Time, n int) {
	p.add(key, window, t, 0, int64(n))
}

func (p *Producer) add(key string, wd time.Duration, t time.Time, n64, d64 int64) {
	w := int64(wd / time.Millisecond)
	n := n64 + d64
	h := maphash.String(p.seed, key)
	s := &p.shards[h&(numShards-1)]
	h ^= uint64(w) * 0x9e3779b97f4a7c15
	if n < 1 || w < 1 || len(key) == 0 || len(key) > topics.MaxKeyLen || strings.HasPrefix(key, topics.ReservedPrefix) || !utf8.ValidString(key) {
		s.invalid.Add(1)
		return
	}
	ms := t.UnixMilli()
	b := ms - floorMod(ms, p.widthMs)
	end := b + p.widthMs
	if sub := window.Width(time.Duration(w)*time.Millisecond, p.cfg.SubBuckets); sub%p.widthMs != 0 {
		sb := ms - floorMod(ms, sub)
		b, end = max(b, sb), min(end, sb+sub)
	}
	ck := counterKey{key: key, window: w}

	s.mu.Lock()
	if p.closed.Load() {
		s.dropped.Add(n64)
		s.mu.Unlock()
		return
	}
	e := s.get(h, ck)
	if e == nil {
		if !p.reserve() {
			s.dropped.Add(n64)
			s.mu.Unlock()
			return
		}
		e = &entry{ck: ck, bucket: b, end: end}
		s.put(h, e)
	} else if e.bucket != b {
		if e.n > 0 || e.d > 0 {
			// The counter moved to a new bucket before its old one was drained: park
			// the old count so the entry can take the new bucket.
			if !p.reserve() {
				s.dropped.Add(n64)
				s.mu.Unlock()
				return
			}
			s.pending = append(s.pending, record{ck: e.ck, bucket: e.bucket, n: e.n, d: e.d})
			e.n, e.d = 0, 0
		}
		e.bucket, e.end = b, end
	}
	e.n += n64
	e.d += d64
	if !e.dirty {
		e.dirty = true
		s.dirty = append(s.dirty, e)
	}
	s.hitsIn += n64
	s.mu.Unlock()
}

func floorMod(a, m int64) int64 {
	r := a % m
	if r < 0 {
		r += m
	}
	return r
}

// reserve takes one slot of the memory bound, reporting false when it is full.
func (p *Producer) reserve() bool {
	for {
		c := p.buffered.Load()
		if c >= p.maxKeys {
			return false
		}
		if p.buffered.CompareAndSwap(c, c+1) {
			return true
		}
	}
}

// loop is the background flush.
func (p *Producer) loop() {
	defer close(p.done)
	t := time.NewTicker(p.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.flush(false)
		}
	}
}

// flush drains the shards and hands records to the Kafka client without waiting for
// acknowledgements. With all false, only finished buckets (those whose end is not after
// the clock's now) are drained, so that a bucket normally becomes exactly one record;
// with all true, the current buckets go too.
func (p *Producer) flush(all bool) {
	p.flushMu.Lock()
	defer p.flushMu.Unlock()
	start := p.cfg.Clock.Now()
	nowMs := start.UnixMilli()
	p.flushes.Add(1)

	var dropped int64
	for i := range p.shards {
		dropped += p.shards[i].dropped.Load()
	}
	pressure := dropped != p.lastDropped
	p.lastDropped = dropped

	batch := p.batch[:0]
	room := p.maxInflight - p.inflightRecs.Load()
	// Older counts first: what Kafka could not take before, as much as fits.
	p.unsentMu.Lock()
	for rk, c := range p.unsent {
		if int64(len(batch)) >= room {
			break
		}
		batch = append(batch, record{ck: rk.ck, bucket: rk.bucket, n: c.n, d: c.d})
		delete(p.unsent, rk)
		p.unsentHits.Add(-c.n)
		p.buffered.Add(-1)
	}
	p.unsentMu.Unlock()

	var released int64
	// watermark is the start of the oldest bucket still held back: every hit of an
	// earlier bucket is in this flush's batch or was handed to Kafka before.
	watermark := nowMs
	for i := range p.shards {
		s := &p.shards[i]
		s.mu.Lock()
		batch = append(batch, s.pending...)
		released += int64(len(s.pending))
		clear(s.pending)
		s.pending = s.pending[:0]
		keep := s.dirty[:0]
		for _, e := range s.dirty {
			if !all && e.end > nowMs {
				keep = append(keep, e)
				watermark = min(watermark, e.bucket)
				continue
			}
			batch = append(batch, record{ck: e.ck, bucket: e.bucket, n: e.n, d: e.d})
			e.n, e.d = 0, 0
			e.dirty = false
		}
		clear(s.dirty[len(keep):])
		s.dirty = keep
		if pressure || i == p.sweepNext {
			evict := func(e *entry) bool {
				return !e.dirty && (pressure || nowMs-e.end >= p.idleMs)
			}
			for h, e := range s.m {
				if evict(e) {
					delete(s.m, h)
					released++
				}
			}
			for ck, e := range s.coll {
				if evict(e) {
					delete(s.coll, ck)
					released++
				}
			}
		}
		s.mu.Unlock()
	}
	p.sweepNext = (p.sweepNext + 1) % numShards
	p.buffered.Add(-released)

	for _, r := range batch {
		if room > 0 {
			p.send(r)
			room--
		} else {
			p.keepUnsent(r)
		}
	}
	clear(batch)
	p.batch = batch[:0]
	if !all {
		p.siteHeartbeat(nowMs, watermark)
	}

	if p.metrics != nil {
		p.metrics.flushSeconds.Observe(p.cfg.Clock.Now().Sub(start).Seconds())
	}
	if errs := p.produceErrs.Swap(0); errs > 0 {
		if now := p.cfg.Clock.Now(); now.Sub(p.lastLog) >= 10*time.Second || now.Before(p.lastLog) {
			p.lastLog = now
			var last error
			if e := p.lastErr.Load(); e != nil {
				last = *e
			}
			p.cfg.Logger.Warn("producer: Kafka did not take hits; keeping them merged for a retry",
				"failed_records", errs, "unsent_hits", p.unsentHits.Load(),
				"buffered_keys", p.buffered.Load(), "err", last)
		}
	}
}

// send hands r to the Kafka client.
func (p *Producer) send(r record) {
	h := topics.Hit{Key: r.ck.key, Site: p.cfg.Site, BucketStart: r.bucket, Window: r.ck.window, Count: r.n, Denied: r.d}
	buf := make([]byte, 0, 2*len(r.ck.key)+len(p.cfg.Site)+32)
	buf = append(buf, r.ck.key...)
	buf, err := h.AppendBinary(buf)
	if err != nil {
		// Unreachable: HitAt validated the key and window, New the site.
		p.cfg.Logger.Error("producer: encoding a hit", "key", r.ck.key, "err", err)
		return
	}
	kr := &kgo.Record{Topic: p.cfg.Topic, Key: buf[:len(r.ck.key):len(r.ck.key)], Value: buf[len(r.ck.key):]}
	p.inflightRecs.Add(1)
	p.inflightHits.Add(r.n)
	p.cl.TryProduce(context.Background(), kr, func(kr *kgo.Record, err error) {
		p.inflightRecs.Add(-1)
		p.inflightHits.Add(-r.n)
		if err == nil {
			p.recordsOut.Add(1)
			p.bytesOut.Add(int64(len(kr.Key) + len(kr.Value)))
			return
		}
		// With the idempotent producer, kgo fails a record only when it is sure the
		// broker did not write it (never sent, or an error response), so the count can be
		// merged back without risk of counting it twice.
		p.produceErrs.Add(1)
		p.lastErr.Store(&err)
		p.keepUnsent(r)
	})
}

// keepUnsent merges r into the counts waiting for Kafka, or drops it when that needs a new
// slot and the memory bound is full.
func (p *Producer) keepUnsent(r record) {
	rk := recordKey{ck: r.ck, bucket: r.bucket}
	p.unsentMu.Lock()
	defer p.unsentMu.Unlock()
	c, ok := p.unsent[rk]
	if !ok && !p.reserve() {
		p.shards[0].dropped.Add(r.n)
		return
	}
	c.n += r.n
	c.d += r.d
	p.unsent[rk] = c
	p.unsentHits.Add(r.n)
}

// Flush hands every pending count to Kafka, the current buckets included, and waits until
// Kafka has acknowledged or failed them, or ctx is done. Counts of the current buckets that
// keep receiving hits after Flush drained them become further records. It returns nil when
// nothing is left unsent, an *UndeliveredError describing what is (kept for a later
// retry), or ErrClosed after Close.
func (p *Producer) Flush(ctx context.Context) error {
	if p.closed.Load() {
		return ErrClosed
	}
	return p.flushWait(ctx)
}

func (p *Producer) flushWait(ctx context.Context) error {
	p.flush(true)
	err := p.cl.Flush(ctx)
	if hits := p.unsentHits.Load() + p.inflightHits.Load(); hits > 0 || err != nil {
		if err == nil {
			if e := p.lastErr.Load(); e != nil {
				err = *e
			} else {
				err = errors.New("kafka client buffer full")
			}
		}
		p.unsentMu.Lock()
		recs := int64(len(p.unsent))
		p.unsentMu.Unlock()
		return &UndeliveredError{Hits: hits, Records: recs + p.inflightRecs.Load(), Err: err}
	}
	return nil
}

// Close stops the background flush, refuses further hits (they are dropped and counted),
// and delivers everything pending, retrying until it is acknowledged or ctx is done: give
// ctx a deadline, since Close waits for an unreachable Kafka until then. It closes the
// Kafka client if the Producer built it. It returns nil when everything was delivered, an
// *UndeliveredError with the hits it could not deliver, or ErrClosed if already closed.
// The Producer's metrics stay registered.
func (p *Producer) Close(ctx context.Context) error {
	if !p.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	close(p.stop)
	<-p.done
	var err error
	for {
		out := p.recordsOut.Load()
		err = p.flushWait(ctx)
		if err == nil || ctx.Err() != nil {
			break
		}
		if p.recordsOut.Load() > out {
			continue // progress: more is waiting for room in the client
		}
		select { // Kafka refused everything: pace the retries
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	var ue *UndeliveredError
	if errors.As(err, &ue) && ctx.Err() != nil && !errors.Is(ue.Err, ctx.Err()) {
		ue.Err = fmt.Errorf("%w (last produce error: %v)", ctx.Err(), ue.Err)
	}
	if p.ownClient {
		p.cl.Close()
	}
	p.cfg.Logger.Info("producer: closed", "records_out", p.recordsOut.Load(), "err", err)
	return err
}
