package producer

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
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

// Reasons for dropped hits, the values of dropped_hits_total's reason label.
const (
	// DropNoRoom: a hit of a counter the Producer did not hold, while MaxBufferedKeys
	// counters and counts all held hits not yet handed to Kafka (none idle to evict).
	DropNoRoom = "no_room"
	// DropKafkaBacklog: counts Kafka could not take (down or slow) while the buffer of
	// counts waiting for it was full.
	DropKafkaBacklog = "kafka_backlog"
	// DropClosed: a hit after Close.
	DropClosed = "closed"
	// DropBulkNoRoom: a bulk hit (Bulk) of a counter the Producer did not hold, or a bulk
	// count Kafka could not take, while bulk counters and counts held their part of
	// MaxBufferedKeys (none of them idle to evict).
	DropBulkNoRoom = "bulk_no_room"
)

// dropReasons lists the reasons in the order of Stats.DroppedByReason.
var dropReasons = [...]string{DropNoRoom, DropKafkaBacklog, DropClosed, DropBulkNoRoom}

const (
	dropNoRoom = iota
	dropKafkaBacklog
	dropClosed
	dropBulkNoRoom
	numDropReasons
)

// bulkShare is the part of MaxBufferedKeys that bulk counters and counts (Bulk) may
// hold: the rest stays for the hits of decisions, whatever the bulk publisher sends.
const bulkShare = 0.5

// flushLag is how long after a bucket's end the background flush drains it: enough for
// the hits decided at its last instant to have been recorded.
const flushLag = time.Millisecond

// evictSample is how many held counters a new counter looks at to find an idle one to
// evict when the bound is full.
const evictSample = 32

// counterKey names one counter: a (key, window) pair.
type counterKey struct {
	key    string
	window int64 // ms
}

// entry is a known counter and the count of its current bucket. Guarded by its shard's mu.
// It is 64 bytes, one cache line of its size class, so that a Hit reads one line of it.
type entry struct {
	ck     counterKey
	bucket int64  // start of the bucket n counts toward, unix ms
	end    int64  // end of that bucket, unix ms
	n      int64  // hits in bucket not yet drained
	d      int64  // denied requests in bucket not yet drained
	heat   uint32 // Hit calls since the counter was created (saturating): eviction keeps hot counters
	dirty  bool   // on the shard's dirty list
	bulk   bool   // created by a bulk hit: held against bulkShare
}

// record is one (key, window, bucket) count on its way to Kafka.
type record struct {
	ck     counterKey
	bucket int64
	n, d   int64
	bulk   bool // of a bulk counter
}

// counts is a merged (hits, denied) pair waiting for Kafka; bulk when its slot is held
// against bulkShare.
type counts struct {
	n, d int64
	bulk bool
}

// recordKey names a count waiting for Kafka. part tells apart the counts of one bucket
// that cannot be merged without overflowing int64.
type recordKey struct {
	ck     counterKey
	bucket int64
	part   int32
}

type shard struct {
	// What a Hit reads, first, in one cache line.
	mu     sync.Mutex
	hitsIn int64 // guarded by mu; saturating
	// tab finds entries by a 64-bit hash of (key, window), so that a lookup hashes the key
	// once (the same hash picks the shard).
	tab table
	// dirty lists the entries with a count not yet drained; minEnd is at most the
	// smallest end of their buckets, so that a flush tick skips a shard with nothing due
	// without reading its entries.
	dirty  []*entry
	minEnd int64
	// pending holds finished buckets pushed out of entries by a newer bucket (or split off
	// a count about to overflow). They are not held against MaxBufferedKeys: the next flush
	// drains them, and between two flushes an entry parks at most one per bucket boundary,
	// so they are bounded by the entries. Dropping them would lose hits of counters that
	// carry traffic.
	pending []record
	dropped [numDropReasons]atomic.Int64
	invalid atomic.Int64
	_       [64]byte // keep shards on separate cache lines
}

func (s *shard) get(h uint64, ck counterKey) *entry { return s.tab.get(h, ck) }

func (s *shard) put(h uint64, e *entry) { s.tab.put(h, e) }

// drop counts n dropped hits for reason r.
func (s *shard) drop(r int, n int64) { satAddAtomic(&s.dropped[r], n) }

// Producer publishes hits to the Kafka hits topic, coalesced per (key, window, bucket). See
// docs/producer.md for the model. Create one with New; it is safe for
// simultaneous use by multiple goroutines.
type Producer struct {
	cfg       Config
	cl        *kgo.Client
	ownClient bool
	widthMs   int64
	spreadMs  int64
	idleMs    int64
	maxKeys   int64
	seed      maphash.Seed
	clock     *msClock
	shards    [numShards]shard
	parts     partitioner // the client's partitioner when the Producer built the client
	// sendAll's scratch, guarded by flushMu: the counts in partition order, each count's
	// partition, and the partitions' counts.
	placed    []placed
	partOf    []int32
	partCount []int32

	hbNext int64 // unix ms of the next site heartbeat, guarded by flushMu

	buffered atomic.Int64 // entries + unsent counts; ≤ maxKeys
	bulk     atomic.Int64 // of them, bulk ones; ≤ maxBulk
	maxBulk  int64
	noIdle   atomic.Bool // a search of every shard found no idle counter since the last flush
	closed   atomic.Bool

	flushMu    sync.Mutex               // serialises drains and hand-offs
	batch      []record                 // reused by flush, guarded by flushMu
	sweepNext  int                      // next shard the idle sweep visits, guarded by flushMu
	lastLog    time.Time                // last produce-failure log, guarded by flushMu
	dropLogAt  time.Time                // last dropped-hits log, guarded by flushMu
	dropLogged [numDropReasons]int64    // drops already logged, by reason, guarded by flushMu
	outFree    sync.Pool                // *outRecord, reused once Kafka is done with them
	produced   func(*kgo.Record, error) // p.onProduced, made once

	unsentMu   sync.Mutex
	unsent     map[recordKey]counts // counts Kafka could not take yet, merged
	unsentHits wideSum

	maxInflight   int64
	inflightRecs  atomic.Int64
	inflightHits  wideSum
	recordsOut    atomic.Int64
	batchesOut    atomic.Int64
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
		cfg:      cfg,
		widthMs:  cfg.BucketWidth.Milliseconds(),
		spreadMs: cfg.FlushSpread.Milliseconds(),
		idleMs:   cfg.IdleTimeout.Milliseconds(),
		maxKeys:  int64(cfg.MaxBufferedKeys),
		maxBulk:  int64(float64(cfg.MaxBufferedKeys) * bulkShare),
		seed:     maphash.MakeSeed(),
		clock:    newMsClock(cfg.Clock),
		unsent:   make(map[recordKey]counts),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	p.produced = p.onProduced
	if cfg.Client != nil {
		p.cl = cfg.Client
		p.maxInflight = DefaultMaxInFlightRecords
		if v, ok := p.cl.OptValue(kgo.MaxBufferedRecords).(int64); ok && v > 0 {
			p.maxInflight = v
		}
	} else {
		p.maxInflight = int64(cfg.MaxInFlightRecords)
		opts := append([]kgo.Opt{
			kgo.SeedBrokers(cfg.Brokers...),
			// Keys placed as Java places them (topics.Partition), which non-Go producers
			// match (librdkafka: partitioner=murmur2_random); site records and hit
			// batches on the partition they name.
			kgo.RecordPartitioner(&p.parts),
			kgo.MaxBufferedRecords(cfg.MaxInFlightRecords),
			// A flush hands over its records within a millisecond or two: lingering
			// longer (kgo's default is 10 ms) would only delay them.
			kgo.ProducerLinger(2 * time.Millisecond),
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
// current time. It is HitAt(key, window, cfg.Clock.Now(), n), but for when the clock is
// read: as the hit is recorded, so that a site heartbeat never passes it (see
// siteHeartbeat). With the real clock, the time is the monotonic clock's plus the wall
// clock's offset from it, taken at most 10 ms before (msClock): one read of a clock per
// Hit instead of time.Now's two.
func (p *Producer) Hit(key string, window time.Duration, n int) {
	p.add(key, window, 0, true, int64(n), 0, false)
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
	p.add(key, window, t.UnixMilli(), false, int64(n), 0, false)
}

// Denied records n requests for key, toward a window of length window, that were refused at
// this site at the Producer's clock's current time. It is DeniedAt(key, window,
// cfg.Clock.Now(), n), with the clock read as for Hit.
func (p *Producer) Denied(key string, window time.Duration, n int) {
	p.add(key, window, 0, true, 0, int64(n), false)
}

// DeniedAt records n refused requests for key in the bucket that contains t. They count
// toward no limit: they are the site's demand for the key, from which sites share a hot
// key's room (a site where a client has just arrived has demand before it has hits). It is
// coalesced with the hits of the same bucket and behaves as HitAt otherwise.
func (p *Producer) DeniedAt(key string, window time.Duration, t time.Time, n int) {
	p.add(key, window, t.UnixMilli(), false, 0, int64(n), false)
}

// Bulk is a publisher of the Producer's for hits that arrive in bulk — usage that clients
// deciding on their own report (the enforcer's RLQS server) — whose new counters, and
// counts Kafka could not take yet, hold at most bulkShare of MaxBufferedKeys: however
// many counters they bring, the hits of decisions keep the rest, and are never dropped
// for want of room the bulk hits took. A bulk hit past that part is dropped and counted
// (dropped_hits_total{reason="bulk_no_room"}). Bulk hits of a counter the Producer holds
// merge with its other hits.
type Bulk struct{ p *Producer }

// Bulk returns the Producer's bulk publisher.
func (p *Producer) Bulk() Bulk { return Bulk{p: p} }

// Hit records n bulk hits of key as Producer.Hit does.
func (b Bulk) Hit(key string, window time.Duration, n int) {
	b.p.add(key, window, 0, true, int64(n), 0, true)
}

// Denied records n bulk denials of key as Producer.Denied does.
func (b Bulk) Denied(key string, window time.Duration, n int) {
	b.p.add(key, window, 0, true, 0, int64(n), true)
}

// takeBulk counts one more bulk counter or count against bulkShare, reporting false when
// the bulk part is full.
func (p *Producer) takeBulk() bool {
	for {
		c := p.bulk.Load()
		if c >= p.maxBulk {
			return false
		}
		if p.bulk.CompareAndSwap(c, c+1) {
			return true
		}
	}
}

// add records n64 hits and d64 denials of key toward window wd at ms (unix ms), or, with
// now, at the clock's time read under the shard's lock: a flush reads its time before it
// takes the lock, so a hit it did not see is not older than its time, and the site
// heartbeat it sends (stamped at most at the start of the current bucket) stays true.
func (p *Producer) add(key string, wd time.Duration, ms int64, now bool, n64, d64 int64, bulk bool) {
	w := int64(wd / time.Millisecond)
	h := maphash.String(p.seed, key)
	s := &p.shards[h&(numShards-1)]
	h ^= uint64(w) * 0x9e3779b97f4a7c15
	if n64 < 0 || d64 < 0 || n64+d64 < 1 || w < 1 { // one of n64, d64 is 0: no overflow
		s.invalid.Add(1)
		return
	}
	ck := counterKey{key: key, window: w}

	s.mu.Lock()
	if now {
		ms = p.clock.nowMs()
	}
	if p.closed.Load() {
		s.drop(dropClosed, n64)
		s.mu.Unlock()
		return
	}
	e := s.get(h, ck)
	if e == nil {
		// A key is checked once, when its counter is created: a held counter's key is
		// valid.
		if len(key) == 0 || len(key) > topics.MaxKeyLen || strings.HasPrefix(key, topics.ReservedPrefix) || !utf8.ValidString(key) {
			s.mu.Unlock()
			s.invalid.Add(1)
			return
		}
		if bulk && !p.takeBulk() {
			// The bulk part is full: only an idle bulk counter's place can be taken.
			if !p.evictIdle(s, ms, true) {
				s.drop(dropBulkNoRoom, n64)
				s.mu.Unlock()
				return
			}
			p.bulk.Add(1)
		} else if !p.reserve() && !p.evictIdle(s, ms, false) && !p.evictAnyIdle(ms) {
			if bulk {
				p.bulk.Add(-1)
			}
			s.drop(dropNoRoom, n64)
			s.mu.Unlock()
			return
		}
		e = &entry{ck: ck, bulk: bulk}
		e.bucket, e.end = p.bucketOf(e, ms)
		s.put(h, e)
	} else if ms < e.bucket || ms >= e.end {
		b, end := p.bucketOf(e, ms)
		if e.n > 0 || e.d > 0 {
			// The counter moved to a new bucket before its old one was drained: park
			// the old count so the entry can take the new bucket.
			s.pending = append(s.pending, record{ck: e.ck, bucket: e.bucket, n: e.n, d: e.d, bulk: e.bulk})
			e.n, e.d = 0, 0
		}
		e.bucket, e.end = b, end
	}
	if e.n+e.d > math.MaxInt64-n64-d64 {
		// One record holds at most MaxInt64 hits and denials together: split.
		s.pending = append(s.pending, record{ck: e.ck, bucket: e.bucket, n: e.n, d: e.d, bulk: e.bulk})
		e.n, e.d = 0, 0
	}
	e.n += n64
	e.d += d64
	if e.heat < math.MaxUint32 {
		e.heat++
	}
	if !e.dirty {
		e.dirty = true
		if len(s.dirty) == 0 || e.end < s.minEnd {
			s.minEnd = e.end
		}
		s.dirty = append(s.dirty, e)
	}
	s.hitsIn = satAdd(s.hitsIn, n64)
	s.mu.Unlock()
}

// bucketOf returns the bucket of e's counter that holds instant ms: BucketWidth long, cut
// at the window's sub-bucket boundaries.
func (p *Producer) bucketOf(e *entry, ms int64) (start, end int64) {
	start = ms - floorMod(ms, p.widthMs)
	end = start + p.widthMs
	// The sub-bucket width is worked out again at every bucket (a division) rather than
	// kept, so that the entry fits in 64 bytes.
	if sub := window.Width(time.Duration(e.ck.window)*time.Millisecond, p.cfg.SubBuckets); sub%p.widthMs != 0 {
		sb := ms - floorMod(ms, sub)
		start, end = max(start, sb), min(end, sb+sub)
	}
	return start, end
}

// evictIdle makes room for a new counter in s, whose lock the caller holds, by forgetting
// an idle one: a counter with nothing pending (forgetting it loses no hit, only the
// allocation-free path of its next hit). Among the held counters it samples, it takes one
// not hit in its last two buckets if there is one, the least hit first, so that counters
// that carry traffic stay and a flood of new keys evicts its own. With onlyBulk it looks
// at bulk counters only. It reports false when the sample holds no idle counter.
func (p *Producer) evictIdle(s *shard, nowMs int64, onlyBulk bool) bool {
	var (
		victim     *entry
		victimHash uint64
		recent     bool
	)
	better := func(e *entry) bool {
		r := e.end+p.widthMs > nowMs
		switch {
		case victim == nil:
			return true
		case r != recent:
			return !r
		}
		return e.heat < victim.heat
	}
	s.tab.sample(evictSample, func(h uint64, e *entry) {
		if !e.dirty && (!onlyBulk || e.bulk) && better(e) {
			victim, victimHash, recent = e, h, e.end+p.widthMs > nowMs
		}
	})
	if victim == nil {
		return false
	}
	s.tab.remove(victimHash, victim)
	if victim.bulk {
		p.bulk.Add(-1)
	}
	return true
}
