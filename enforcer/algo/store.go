package algo

import (
	"context"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/internal/memsize"
)

const (
	numShards = 64 // a power of two ≤ 64, so that AllowAll can hold a set of shards in one uint64
	// evictSample is how many entries a full shard looks at to pick a live victim.
	evictSample = 16
	// NearLimit is the share of its limit a counter must have used to be kept when its
	// shard is full: a new key is refused rather than such a counter evicted (see Options).
	NearLimit = 0.9
	// sweepEvery bounds how often a full shard scans itself for idle entries on insert,
	// so that a flood of new keys costs O(1) per key, not O(shard).
	sweepEvery = int64(time.Second)
	// stackOps is how many ops AllowAll handles without allocating its undo log.
	stackOps = 8
)

// DefaultMaxKeys is Options.MaxKeys when zero.
const DefaultMaxKeys = 1 << 20

// Options configures a Store.
type Options struct {
	// MaxKeys bounds the number of counters held. When a shard of the store is full, idle
	// counters (see Store) are removed first; if none is idle, the counter that has used the
	// smallest share of its limit among a small sample (the one closest to going idle among
	// equals) is evicted and counted in Stats.EvictedLive: its client gets back at most that
	// share. When every counter of the sample has used NearLimit of its limit or more, none
	// is evicted: the new key is refused (Stats.Refused) and its request decided as a new
	// counter's would be, taking nothing, so that the bound on memory never frees a client
	// at its limit. Default (0): DefaultMaxKeys.
	MaxKeys int
	// MaxBytes bounds the bytes the counters keep alive, by an estimate per counter (its
	// entry, key, map slot and sliding log), with the same eviction as MaxKeys; both
	// bounds apply. Default 0: no bound in bytes.
	MaxBytes int64
}

// Stats are the Store's counters since it was created.
type Stats struct {
	// Keys is the number of counters held now.
	Keys int
	// EvictedIdle counts counters removed because they were idle, by Sweep or on insert.
	EvictedIdle uint64
	// EvictedLive counts counters removed while still holding state, because the store was
	// full.
	EvictedLive uint64
	// Refused counts new keys not given a counter because the store was full of counters
	// at or near their limits (Options.MaxKeys): their requests were decided uncounted.
	Refused uint64
	// Bytes is what the counters keep alive now, by the estimate MaxBytes bounds.
	Bytes int64
}

// Store holds the state of many counters, one per counter key, and decides Ops against
// them with the six algorithms. It is exact: decisions depend only on the times passed in
// and the sequence of operations.
//
// A denied request consumes nothing. Allow decides one Op; AllowAll decides several as one
// atomic step (all are taken or none: the rule for a request with several limits); Peek
// decides without taking; Reserve and Wait shape traffic with the bucket algorithms.
//
// Memory is bounded by Options.MaxKeys. A counter is idle once it is indistinguishable from
// a new one (its window has passed or its bucket has refilled), so removing it changes no
// decision; Sweep removes idle counters and a full shard removes them on insert.
//
// The store is split into 64 shards by key hash, each with its own mutex. A Store is safe
// for simultaneous use by multiple goroutines. Once a key exists, Allow, AllowAll (up to 8
// ops), Peek and Reserve do not allocate, except SlidingLog growing its log toward
// min(allowance, MaxLogEntries) entries.
type Store struct {
	seed        maphash.Seed
	maxPerShard int
	maxBytes    int64 // per shard; 0: no bound
	shards      [numShards]shard

	evictedIdle atomic.Uint64
	evictedLive atomic.Uint64
	refused     atomic.Uint64
}

type shard struct {
	mu        sync.Mutex
	m         map[string]*entry
	nextSweep int64
	bytes     int64 // what the shard's counters keep alive (entryBytes)
	// scratch is the copy a peek decides on (see peek), here rather than on the stack
	// because the algorithms are called through their registration table, which would
	// move a stack copy to the heap on every call.
	scratch entry
	_       [32]byte // keep hot mutexes on separate cache lines
}

// New returns an empty Store.
func New(opts Options) *Store {
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	s := &Store{seed: maphash.MakeSeed(), maxPerShard: (opts.MaxKeys + numShards - 1) / numShards}
	if opts.MaxBytes > 0 {
		s.maxBytes = max(opts.MaxBytes/numShards, 1)
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*entry)
	}
	return s
}

func (s *Store) shardOf(key string) int {
	return int(maphash.String(s.seed, key) & (numShards - 1))
}

// get returns the entry of key, creating it if create is set, or nil: nil also when the
// shard is full of counters at or near their limits (makeRoom). The shard must be locked.
func (s *Store) get(sh *shard, key string, now int64, create bool) *entry {
	if e, ok := sh.m[key]; ok {
		return e
	}
	if !create {
		return nil
	}
	e := &entry{}
	if !s.makeRoom(sh, now, 1, entryBytes(key, e)) {
		s.refused.Add(1)
		return nil
	}
	sh.m[key] = e
	sh.bytes += entryBytes(key, e)
	return e
}

// Byte estimates of a counter: its entry rounded up to a size class, and a map slot (key
// header, value pointer, control byte) at the map's lowest load after it grows, which
// also covers the old table kept while it grows.
const (
	entrySize    = (int64(unsafe.Sizeof(entry{})) + 15) &^ 15
	mapSlotBytes = 64
)

// entryBytes is what counter e of key keeps alive: its entry, key bytes, map slot, and
// sliding log.
func entryBytes(key string, e *entry) int64 {
	return entrySize + memsize.Alloc(int64(len(key))) + mapSlotBytes + int64(cap(e.log))*int64(unsafe.Sizeof(logEntry{}))
}

// over reports whether sh would pass a bound with n more counters and cost more bytes.
func (s *Store) over(sh *shard, n int, cost int64) bool {
	return len(sh.m)+n > s.maxPerShard || (s.maxBytes > 0 && sh.bytes+cost > s.maxBytes)
}

// makeRoom removes entries from sh until n more counters of cost bytes fit in its bounds,
// and reports whether they fit: its idle entries (by a scan at most once per sweepEvery),
// then, of a sample, an idle entry, else the one that has used the smallest share of its
// limit (the one that goes idle first among equals). It stops, reporting false, when every
// sampled entry has used NearLimit of its limit or more: those are the clients the limits
// hold back, and evicting one would let it start over. Busy entries stay.
func (s *Store) makeRoom(sh *shard, now int64, n int, cost int64) bool {
	if !s.over(sh, n, cost) {
		return true
	}
	if now >= sh.nextSweep {
		sh.nextSweep = now + sweepEvery
		if s.sweepShard(sh, now) > 0 && !s.over(sh, n, cost) {
			return true
		}
	}
	for s.over(sh, n, cost) {
		var victim string
		var victimE *entry
		seen := 0
		for k, e := range sh.m {
			if e.busy {
				continue
			}
			if e.expires <= now {
				victim, victimE = k, e
				break
			}
			if victimE == nil || e.fill < victimE.fill || e.fill == victimE.fill && e.expires < victimE.expires {
				victim, victimE = k, e
			}
			if seen++; seen >= evictSample {
				break
			}
		}
		if victimE == nil || victimE.expires > now && victimE.fill >= NearLimit {
			return false
		}
		s.drop(sh, victim, victimE)
		if victimE.expires <= now {
			s.evictedIdle.Add(1)
		} else {
			s.evictedLive.Add(1)
		}
	}
	return true
}

// drop removes key's entry e from sh.
func (s *Store) drop(sh *shard, key string, e *entry) {
	delete(sh.m, key)
	sh.bytes -= entryBytes(key, e)
}

// grew accounts for e's log having been of logCap entries before an op, and keeps sh
// within its byte bound, e excepted.
func (s *Store) grew(sh *shard, key string, e *entry, logCap int, now int64) {
	if d := cap(e.log) - logCap; d != 0 {
		sh.bytes += int64(d) * int64(unsafe.Sizeof(logEntry{}))
		if d > 0 && s.maxBytes > 0 && sh.bytes > s.maxBytes {
			busy := e.busy
			e.busy = true
			s.makeRoom(sh, now, 0, 0)
			e.busy = busy
		}
	}
}

func (s *Store) sweepShard(sh *shard, now int64) int {
	removed := 0
	for k, e := range sh.m {
		if e.expires <= now && !e.busy {
			s.drop(sh, k, e)
			removed++
		}
	}
	s.evictedIdle.Add(uint64(removed))
	return removed
}

// Sweep removes every idle counter (one whose state equals a new counter's at now) and
// returns how many it removed. Call it periodically, e.g. every few seconds, to return
// memory between bursts of keys; correctness does not depend on it.
func (s *Store) Sweep(now time.Time) int {
	t, removed := now.UnixNano(), 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		removed += s.sweepShard(sh, t)
		sh.mu.Unlock()
	}
	return removed
}

// Len returns the number of counters held.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Bytes returns what the counters keep alive, by the estimate Options.MaxBytes bounds.
func (s *Store) Bytes() int64 {
	var n int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.bytes
		sh.mu.Unlock()
	}
	return n
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{Keys: s.Len(), EvictedIdle: s.evictedIdle.Load(), EvictedLive: s.evictedLive.Load(), Refused: s.refused.Load(), Bytes: s.Bytes()}
}

// Allow decides op at now and, if it fits, takes op.N from its counter.
func (s *Store) Allow(now time.Time, op Op) Decision {
	t := now.UnixNano()
	sh := &s.shards[s.shardOf(op.Key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !op.fits() {
		e := s.get(sh, op.Key, t, false)
		return sh.peek(e, t, &op)
	}
	e := s.get(sh, op.Key, t, true)
	if e == nil {
		return sh.peek(nil, t, &op) // refused: decided as a new counter, uncounted
	}
	logCap := cap(e.log)
	e.adopt(&op)
	d := e.decide(t, &op, true)
	e.note(d)
	s.grew(sh, op.Key, e, logCap, t)
	return d
}

// Peek decides op at now without taking anything and without creating its counter.
func (s *Store) Peek(now time.Time, op Op) Decision {
	t := now.UnixNano()
	sh := &s.shards[s.shardOf(op.Key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.peek(s.get(sh, op.Key, t, false), t, &op)
}

// fits reports whether op could ever be admitted, so that hopeless requests do not create
// counters (an attacker sending oversized requests costs no memory).
func (op *Op) fits() bool {
	if op.Algorithm.bucket() {
		return op.N <= op.Limit.Capacity()
	}
	return op.N <= op.Limit.Allowance()
}

// peek decides op on e (nil: a new counter) without changing it. The shard must be
// locked.
func (sh *shard) peek(e *entry, now int64, op *Op) Decision {
	// Decide on a copy: the sliding log only prunes, and pruning changes no decision, but a
	// copy keeps Peek free of side effects for every algorithm.
	tmp := &sh.scratch
	if e != nil {
		*tmp = *e
	}
	tmp.adopt(op)
	d := tmp.decide(now, op, false)
	*tmp = entry{} // hold no sliding log of a counter that may go
	return d
}

// AllowAll decides all ops at now as one atomic step: if every op fits, each takes its N
// and AllowAll returns true; if any does not, none takes anything and it returns false.
// out[i] receives op i's own decision (len(out) must be ≥ len(ops)): Allowed tells
// whether that limit alone admits the request, and Remaining is computed on the state
// actually left behind. Ops may name the same key; they are then applied in order.
//
// The shards of all keys are locked in ascending order for the duration, so concurrent
// AllowAll calls with overlapping keys serialize without deadlock. Up to 8 ops need no
// allocation.
func (s *Store) AllowAll(now time.Time, ops []Op, out []Decision) bool {
	out = out[:len(ops)]
	t := now.UnixNano()
	var mask uint64
	for i := range ops {
		mask |= 1 << uint(s.shardOf(ops[i].Key))
	}
	for m := mask; m != 0; m &= m - 1 {
		s.shards[bits.TrailingZeros64(m)].mu.Lock()
	}
	defer func() {
		for m := mask; m != 0; m &= m - 1 {
			s.shards[bits.TrailingZeros64(m)].mu.Unlock()
		}
	}()

	var undoBuf [stackOps]entry
	undo := undoBuf[:0]
	if len(ops) > stackOps {
		undo = make([]entry, 0, len(ops))
	}
	entries := [stackOps]*entry{}
	var es []*entry
	if len(ops) > stackOps {
		es = make([]*entry, len(ops))
	} else {
		es = entries[:len(ops)]
	}

	all := true
	for i := range ops {
		op := &ops[i]
		sh := &s.shards[s.shardOf(op.Key)]
		if !op.fits() {
			out[i] = sh.peek(s.get(sh, op.Key, t, false), t, op)
			all = false
			undo = append(undo, entry{})
			continue
		}
		e := s.get(sh, op.Key, t, true)
		if e == nil {
			// Refused (a full store): decided as a new counter, uncounted.
			out[i] = sh.peek(nil, t, op)
			if !out[i].Allowed {
				all = false
			}
			undo = append(undo, entry{})
			continue
		}
		e.busy = true
		es[i] = e
		logCap := cap(e.log)
		e.adopt(op)
		undo = append(undo, *e)
		out[i] = e.decide(t, op, true)
		s.grew(sh, op.Key, e, logCap, t)
		undo[i].noteUndo(e)
		if !out[i].Allowed {
			all = false
		}
	}
	if !all {
		// Roll back in reverse order, so that ops on the same key unwind correctly.
		for i := len(ops) - 1; i >= 0; i-- {
			e := es[i]
			if e == nil || !out[i].Allowed {
				continue
			}
			saved := &undo[i]
			algorithms[ops[i].Algorithm].undo(e, *saved, ops[i].N)
			e.expires = saved.expires
		}
		for i := range ops {
			if es[i] != nil && out[i].Allowed {
				allowed := out[i].Allowed
				out[i] = s.shards[s.shardOf(ops[i].Key)].peek(es[i], t, &ops[i])
				out[i].Allowed = allowed
			}
		}
	}
	for i, e := range es {
		if e != nil {
			e.busy = false
			e.note(out[i])
		}
	}
	return all
}

// Reserve is Allow for shaping with TokenBucket, LeakyBucket or GCRA: on success it takes
// op.N and returns how long the caller must wait before acting so that requests leave at
// the limit's constant rate (the leaky bucket as a queue). The reservation fails, taking
// nothing, when the bucket (queue) would overflow or the wait would exceed maxDelay; pass
// Never to be bounded by the capacity alone. For the window algorithms Reserve is Allow
// with a delay of 0.
func (s *Store) Reserve(now time.Time, op Op, maxDelay time.Duration) (time.Duration, Decision) {
	if !op.Algorithm.bucket() {
		return 0, s.Allow(now, op)
	}
	if maxDelay < 0 {
		maxDelay = 0
	}
	t := now.UnixNano()
	sh := &s.shards[s.shardOf(op.Key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !op.fits() {
		return 0, sh.peek(s.get(sh, op.Key, t, false), t, &op)
	}
	e := s.get(sh, op.Key, t, true)
	if e == nil {
		return 0, sh.peek(nil, t, &op) // refused: decided as a new counter, uncounted
	}
	logCap := cap(e.log)
	e.adopt(&op)
	d, delay := e.bucket(t, op.Limit, op.N, true, maxDelay)
	e.note(d)
	s.grew(sh, op.Key, e, logCap, t)
	if !d.Allowed {
		delay = 0
	}
	return delay, d
}

// SleepFunc waits for d or until ctx is done, returning ctx.Err() in the latter case.
type SleepFunc func(ctx context.Context, d time.Duration) error

// Sleep is the real-time SleepFunc.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wait reserves op at clk.Now() with Reserve and sleeps the returned delay with sleep
// (Sleep when nil; tests pass one that advances a fake clock). ctx's deadline is not
// compared with clk (which may be a fake clock): derive maxDelay from it if you need to.
// It returns the reservation's Decision; when !Allowed nothing was
// taken and nothing was slept. If the sleep is interrupted, the reserved slot stays taken
// (conservative: the queue does not move backwards) and ctx's error is returned.
func (s *Store) Wait(ctx context.Context, clk clock.Clock, op Op, maxDelay time.Duration, sleep SleepFunc) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	if sleep == nil {
		sleep = Sleep
	}
	delay, d := s.Reserve(clock.Or(clk).Now(), op, maxDelay)
	if !d.Allowed || delay == 0 {
		return d, nil
	}
	return d, sleep(ctx, delay)
}
