// Package sitecount keeps a site's exact sliding-window count of each global counter key:
// the count a site adds to the snapshot of the other sites' counts to decide a global
// limit (docs/architecture.md, invariant 3). Counter is what the enforcer asks of it; Local
// is the in-process one, for a site that is one process (package sitestore keeps the count
// of a site of several enforcers in its Redis). Counts use the aggregator's rule (package
// window: sub-buckets, the oldest one interpolated or taken by the span of its hits), so
// that the snapshot's count of this site and its own count are the same measure.
package sitecount

import (
	"context"
	"hash/maphash"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/memsize"
	"github.com/streamlimit/streamlimit/window"
)

// Op is one global limit of a request, as a Counter sees it.
type Op struct {
	// Key is the counter key.
	Key string
	// Window is the limit's sliding window.
	Window time.Duration
	// N is the request's cost.
	N int64
	// Cap is the most this site's count may reach with N added (Commit).
	Cap float64
	// Hard counts the oldest sub-bucket whole until it has left the window
	// (window.Ring.CountHard), so that this site never admits more than Cap in any window.
	Hard bool

	// Handle, when set, caches where a Local keeps the key's count, so that a caller that
	// decides the same key again (the enforcer keeps one Handle per interned key) spares
	// the Local its map lookup. Nil: looked up by Key.
	Handle *Handle
}

// Handle caches a key's entry in a Local (Op.Handle). Its zero value is empty; one Handle
// serves one key, and may be shared by concurrent decisions of it.
type Handle struct {
	e atomic.Pointer[entry]
}

// DefaultMaxKeys is LocalOptions.MaxKeys when zero.
const DefaultMaxKeys = 1 << 20

// Counter keeps this site's exact sliding-window count of each global counter key (the
// "local_exact" of docs/architecture.md). Implementations must be safe for simultaneous
// use by multiple goroutines.
type Counter interface {
	// Counts sets out[i] to the site's count of ops[i] at now.
	Counts(ctx context.Context, now time.Time, ops []Op, out []float64) error
	// Commit adds ops[i].N to each counter if, for every i, the count at now plus N is at
	// most ops[i].Cap, as one atomic step, and reports whether it did. When counts is not
	// nil, counts[i] receives op i's count at now before adding (as Counts would report),
	// so that a caller with nothing else to check needs one call, not two.
	Commit(ctx context.Context, now time.Time, ops []Op, counts []float64) (bool, error)
}

// FallbackReporter is a Counter that can say whether a Commit was answered by an
// in-process fallback instead of the store the site shares (sitestore.Counter can, while
// Redis is away): such a decision is reported as a fallback, as a site limit's is.
type FallbackReporter interface {
	CommitReport(ctx context.Context, now time.Time, ops []Op, counts []float64) (ok, fellBack bool, err error)
}

// SiteCommitter is a Counter that can take a request's global counts and its site-scope
// limits in one atomic step, when those limits are kept in the same store as the counts
// (sitestore.Counter with its Store): one round trip where checking the counts, taking
// the site limits and committing the counts would be three.
type SiteCommitter interface {
	// CommitWithSite checks every op against its cap as Commit does, filling counts
	// (len ≥ len(ops)) with the counts before the request; only if all fit does it decide
	// siteOps as the site store's AllowAll would (siteOut, len ≥ len(siteOps)); only if
	// those are taken does it add ops. site is the store that decides the request's site
	// limits: when it is not the one the Counter counts in, or the step cannot be taken as
	// one (see the implementation), nothing is done and Joint.Done is false.
	CommitWithSite(ctx context.Context, now time.Time, site any, ops []Op, counts []float64, siteOps []algo.Op, siteOut []algo.Decision) Joint
}

// Joint is what a SiteCommitter's CommitWithSite did.
type Joint struct {
	// Done says the call decided the request; when false, nothing was done.
	Done bool
	// Taken says both the global ops and the site ops were taken: the request is admitted
	// by them.
	Taken bool
	// SiteRan says the site ops were decided (every global op fit): siteOut holds their
	// decisions. SiteOK says they admitted the request.
	SiteRan, SiteOK bool
	// GlobalFellBack and SiteFellBack say the counts or the site limits were decided by
	// an in-process fallback instead of the shared store.
	GlobalFellBack, SiteFellBack bool
}

// LocalOptions configures a Local.
type LocalOptions struct {
	// SubBuckets is the number of sub-buckets per window; it should equal the
	// aggregator's. Default window.DefaultSubBuckets.
	SubBuckets int
	// MaxKeys bounds the counters held; idle counters (zero count) are dropped first, then,
	// of a sample, the counter that used the smallest share of its cap at its last decision
	// (the least recently used among equals). When every sampled counter used
	// algo.NearLimit of its cap or more, none is dropped: the new key is refused (Refused)
	// and its request admitted uncounted at this site, so that the bound on memory never
	// frees a client at its limit. Default DefaultMaxKeys.
	MaxKeys int
	// MaxBytes bounds the bytes the counters keep alive, by an estimate per counter
	// (Bytes), with the same eviction as MaxKeys; both bounds apply. Default 0: no bound
	// in bytes.
	MaxBytes int64
	// Interpolate counts the window's oldest sub-bucket by the fraction of it inside the
	// window, as the aggregator does, instead of by the span of its hits (the default, more
	// exact for a site that knows its own hits' times). A hard limit counts it whole either
	// way.
	Interpolate bool
}

// Local is the in-process Counter, for a site that is one process. It holds a
// ring of sub-window buckets per key in 64 mutex-guarded shards. Once a key exists, Counts
// and Commit do not allocate.
type Local struct {
	sub         int
	interpolate bool
	maxPerShard int
	maxBytes    int64 // per shard; 0: no bound
	seed        maphash.Seed
	shards      [64]countShard
	evicted     atomic.Uint64
	refused     atomic.Uint64
}

type countShard struct {
	mu sync.Mutex
	m  map[string]*entry
	// bytes is what the shard's entries keep alive (entryBytes), under mu.
	bytes int64
	// nextSweep is when a full shard may next scan itself for idle entries (unix ms), so
	// that a flood of new keys costs O(1) per key, not O(shard).
	nextSweep int64
	_         [32]byte
}

type entry struct {
	spec  window.Spec
	last  int64 // unix ms of the last add
	owner *Local
	shard uint8
	// dead is set, under the shard lock, when the entry leaves its shard's map, so that a
	// keyHandle still pointing at it looks the key up again.
	dead bool
	// fill is the share of its cap the count reached at its last decision (1: denied or at
	// the cap), what a full shard keeps counters by; it only overstates the share as the
	// count drains.
	fill float32
	// seeded hits (seedFrom) were counted at seededAt (unix ms) for hits a previous
	// instance of the site made; forgot of them are known to have left the window since
	// (reseed) and were taken out of the ring.
	seeded, forgot int32
	seededAt       int64
	ring           window.Ring
	// buf holds the ring's buckets and their spans when they fit (the default 60
	// sub-buckets make 62 slots), so that a decision reads the entry and its buckets from
	// adjacent cache lines.
	buf [inlineSlots]uint32
}

// NewLocal returns an empty Local.
func NewLocal(opts LocalOptions) *Local {
	if opts.SubBuckets <= 0 {
		opts.SubBuckets = window.DefaultSubBuckets
	}
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	c := &Local{sub: opts.SubBuckets, interpolate: opts.Interpolate, maxPerShard: max(opts.MaxKeys/64, 1), seed: maphash.MakeSeed()}
	if opts.MaxBytes > 0 {
		c.maxBytes = max(opts.MaxBytes/int64(len(c.shards)), 1)
	}
	for i := range c.shards {
		c.shards[i].m = make(map[string]*entry)
	}
	return c
}

func (c *Local) shardOf(key string) int {
	return int(maphash.String(c.seed, key) & 63)
}

// shardFor is shardOf(op.Key), taken from op's handle when it knows the key's entry.
func (c *Local) shardFor(op *Op) int {
	if op.Handle != nil {
		if e := op.Handle.e.Load(); e != nil && e.owner == c {
			return int(e.shard)
		}
	}
	return c.shardOf(op.Key)
}

// lookup returns op's entry in sh, the shard of op.Key, whose lock the caller holds; nil
// when there is none. It goes through op's handle when it can, and refreshes it.
func (c *Local) lookup(sh *countShard, op *Op) *entry {
	if op.Handle != nil {
		if e := op.Handle.e.Load(); e != nil && e.owner == c && !e.dead && &c.shards[e.shard] == sh {
			return e
		}
	}
	e := sh.m[op.Key]
	if e != nil && op.Handle != nil {
		op.Handle.e.Store(e)
	}
	return e
}

// newEntry returns a new entry for op.
func (c *Local) newEntry(op *Op, shard uint8) *entry {
	e := &entry{spec: window.NewSpec(op.Window, c.sub, 0), owner: c, shard: shard}
	e.ring.UseSpans(&e.spec, e.buf[:])
	return e
}

// Per-counter byte estimates: a entry rounded up to its size class, and a map slot
// (key header, value pointer, control byte) at the map's lowest load after it grows,
// which also covers the old table kept while it grows.
const (
	entrySize    = 640 // unsafe.Sizeof(entry{}) is 616, checked by TestEntrySize
	mapSlotBytes = 64
)

// entryBytes is what counter e of key keeps alive: the entry, its buckets when they do
// not fit in it, its key's bytes and its map slot.
func entryBytes(key string, e *entry) int64 {
	n := entrySize + memsize.Alloc(int64(len(key))) + mapSlotBytes
	if slots := 2 * e.spec.Slots; slots > inlineSlots {
		n += memsize.Alloc(int64(4 * slots))
	}
	return n
}

// add puts e in sh (locked) under key.
func (sh *countShard) add(key string, e *entry) {
	sh.m[key] = e
	sh.bytes += entryBytes(key, e)
}

// remove deletes key from sh (locked) and marks its entry dead.
func remove(sh *countShard, key string, e *entry) {
	e.dead = true
	delete(sh.m, key)
	sh.bytes -= entryBytes(key, e)
}

// Bytes returns what the counters keep alive, by the estimate of entryBytes.
func (c *Local) Bytes() int64 {
	var n int64
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += c.shards[i].bytes
		c.shards[i].mu.Unlock()
	}
	return n
}

// Len returns the number of counters held.
func (c *Local) Len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].m)
		c.shards[i].mu.Unlock()
	}
	return n
}

// Evicted returns how many counters were dropped to keep within MaxKeys.
func (c *Local) Evicted() uint64 { return c.evicted.Load() }

// Refused returns how many new keys were not counted because the counter was full of
// counters at or near their caps (LocalOptions.MaxKeys).
func (c *Local) Refused() uint64 { return c.refused.Load() }

// mode is how op's own-site count treats the oldest sub-bucket: whole for a hard limit,
// else by the span of its hits (the times of this site's own hits are known exactly, so
// a burst that filled part of a sub-bucket leaves the window when it does).
func (c *Local) mode(op *Op) window.Mode {
	switch {
	case op.Hard:
		return window.Hard
	case c.interpolate:
		return window.Interpolate
	}
	return window.Span
}

// Recent returns op's count at now, the part of it after t0 (unix ms), and the count with
// the oldest sub-bucket taken whole: what the enforcer needs to count this site as the
// other data centers see it.
func (c *Local) Recent(now time.Time, op *Op, t0 int64) (count, since, hard float64) {
	sh := &c.shards[c.shardFor(op)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := c.lookup(sh, op)
	if e == nil || e.spec.Window != op.Window.Milliseconds() {
		return 0, 0, 0
	}
	since = e.ring.CountSince(&e.spec, t0)
	if e.seeded > 0 && e.seededAt > t0 {
		// The seeded hits were made before this instance started: the other sites have
		// seen them as much as the snapshot has.
		since = max(since-float64(e.seeded-e.forgot), 0)
	}
	ms := now.UnixMilli()
	return e.ring.CountMode(&e.spec, ms, c.mode(op)), since, e.ring.CountHard(&e.spec, ms)
}

// Seed counts n hits of op's key at instant at (unix ms) when it has no counter for the
// key yet: hits a previous instance of the site made, which a restarted process learns
// from the snapshot.
func (c *Local) Seed(now time.Time, op *Op, n, at int64) {
	sid := c.shardFor(op)
	sh := &c.shards[sid]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := c.lookup(sh, op); e != nil {
		return
	}
	ms := now.UnixMilli()
	e := c.newEntry(op, uint8(sid))
	c.makeRoom(sh, ms, entryBytes(op.Key, e), nil)
	sh.add(op.Key, e)
	if op.Handle != nil {
		op.Handle.e.Store(e)
	}
	e.ring.AddAt(&e.spec, e.spec.Bucket(at), at, n)
	e.seeded, e.seededAt = int32(min(n, math.MaxInt32)), at
	e.last = ms
}

// Reseed forgets seeded hits that have left the window since (Seed): the snapshot counts mine of this site's hits in the window as
// of t (unix ms), which are the seeded hits still in it and this instance's hits before t
// (the aggregators have counted every hit of the site made before t). So at most mine less
// this instance's own hits before t of the seeded hits remain; the others left the window
// since they were seeded, and are taken out of the count. It only ever takes out more.
func (c *Local) Reseed(now time.Time, op *Op, mine float64, t int64) {
	sh := &c.shards[c.shardFor(op)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := c.lookup(sh, op)
	if e == nil || e.seeded <= 0 || e.spec.Window != op.Window.Milliseconds() {
		return
	}
	ms := now.UnixMilli()
	left := float64(e.seeded - e.forgot) // the seeded hits still counted
	// This instance's hits before t: all it counts, less the seeded hits and its hits from
	// t on (those made in the very millisecond t may not have been counted).
	after := e.ring.CountSince(&e.spec, t-1)
	if e.seededAt > t-1 {
		after -= left
	}
	own := e.ring.CountHard(&e.spec, ms) - left - max(after, 0)
	keep := int32(max(math.Ceil(mine-max(own, 0)), 0))
	gone := e.seeded - min(keep, e.seeded)
	// The seeded hits' bucket holds at least the seeded hits still counted; once it has
	// left the ring, Add takes nothing out.
	if gone > e.forgot && e.ring.Add(&e.spec, e.spec.Bucket(ms), e.spec.Bucket(e.seededAt), -int64(gone-e.forgot)) {
		e.forgot = gone
	}
}

// FallsTo returns how long until op's count falls to target if nothing is added, and
// whether it ever does.
func (c *Local) FallsTo(now time.Time, op *Op, target float64) (time.Duration, bool) {
	ms := now.UnixMilli()
	sh := &c.shards[c.shardFor(op)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := c.lookup(sh, op)
	if e == nil || e.spec.Window != op.Window.Milliseconds() {
		return 0, target >= 0
	}
	at, ok := e.ring.FallsTo(&e.spec, ms, target, c.mode(op))
	return time.Duration(at-ms) * time.Millisecond, ok
}

// Counts implements Counter.
func (c *Local) Counts(_ context.Context, now time.Time, ops []Op, out []float64) error {
	ms := now.UnixMilli()
	for i := range ops {
		sh := &c.shards[c.shardFor(&ops[i])]
		sh.mu.Lock()
		if e := c.lookup(sh, &ops[i]); e != nil && e.spec.Window == ops[i].Window.Milliseconds() {
			out[i] = e.ring.CountMode(&e.spec, ms, c.mode(&ops[i]))
		} else {
			out[i] = 0
		}
		sh.mu.Unlock()
	}
	return nil
}

// Commit implements Counter.
func (c *Local) Commit(_ context.Context, now time.Time, ops []Op, counts []float64) (bool, error) {
	ms := now.UnixMilli()
	var mask uint64
	for i := range ops {
		mask |= 1 << uint(c.shardFor(&ops[i]))
	}
	for m := mask; m != 0; m &= m - 1 {
		c.shards[bits.TrailingZeros64(m)].mu.Lock()
	}
	defer func() {
		for m := mask; m != 0; m &= m - 1 {
			c.shards[bits.TrailingZeros64(m)].mu.Unlock()
		}
	}()
	// Look each key up once; requests have few limits, so the entries fit on the stack.
	// Every op is counted, even after one does not fit, so that counts is complete.
	fits := true
	var stack [8]*entry
	var fillStack [8]float32
	entries, fills := stack[:0], fillStack[:0]
	if len(ops) > len(stack) {
		entries, fills = make([]*entry, 0, len(ops)), make([]float32, 0, len(ops))
	}
	for i := range ops {
		e := c.lookup(&c.shards[c.shardFor(&ops[i])], &ops[i])
		if e != nil && e.spec.Window != ops[i].Window.Milliseconds() {
			e = nil // the window changed with the rules: the counter restarts
		}
		entries = append(entries, e)
		var cur float64
		if e != nil {
			cur = e.ring.CountMode(&e.spec, ms, c.mode(&ops[i]))
		}
		if counts != nil {
			counts[i] = cur
		}
		// Ops of one request may share a key; their costs add up.
		for j := range i {
			if ops[j].Key == ops[i].Key {
				cur += float64(ops[j].N)
			}
		}
		fill := float32(1)
		if ops[i].Cap > 0 {
			fill = float32(min((cur+float64(ops[i].N))/ops[i].Cap, 1))
		}
		fills = append(fills, fill)
		if cur+float64(ops[i].N) > ops[i].Cap {
			fits = false
			if e != nil {
				e.fill = 1
			}
		}
	}
	if !fits {
		return false, nil
	}
	for i, e := range entries {
		if e == nil {
			sid := c.shardOf(ops[i].Key)
			sh := &c.shards[sid]
			if e = sh.m[ops[i].Key]; e == nil || e.spec.Window != ops[i].Window.Milliseconds() {
				if e != nil {
					remove(sh, ops[i].Key, e) // replaced: the window changed with the rules
				}
				e = c.newEntry(&ops[i], uint8(sid))
				if !c.makeRoom(sh, ms, entryBytes(ops[i].Key, e), entries) {
					c.refused.Add(1) // admitted, uncounted here: see LocalOptions.MaxKeys
					continue
				}
				sh.add(ops[i].Key, e)
				entries[i] = e
			}
			if ops[i].Handle != nil {
				ops[i].Handle.e.Store(e)
			}
		}
		e.ring.AddAt(&e.spec, e.spec.Bucket(ms), ms, ops[i].N)
		e.last = ms
		e.fill = fills[i]
	}
	return true, nil
}

// makeRoom drops counters of sh (locked) until a new one of cost bytes fits in both
// bounds, and reports whether it fits: idle counters (their count is zero, so nothing is
// lost), found by a scan of the shard at most once a second, else, of a sample, an idle
// one or the one that used the least of its cap (the least recently used among equals).
// It stops, reporting false, when every sampled counter used algo.NearLimit of its cap or
// more. Counters in keep (the request's own) are never dropped.
func (c *Local) makeRoom(sh *countShard, ms, cost int64, keep []*entry) bool {
	full := func() bool {
		return len(sh.m) >= c.maxPerShard || (c.maxBytes > 0 && sh.bytes+cost > c.maxBytes)
	}
	if !full() {
		return true
	}
	if ms >= sh.nextSweep {
		sh.nextSweep = ms + 1000
		for k, e := range sh.m {
			if ms-e.last > e.spec.Window+e.spec.Width && !slices.Contains(keep, e) {
				remove(sh, k, e)
			}
		}
	}
	for full() && len(sh.m) > 0 {
		var (
			victim  string
			victimE *entry
		)
		n := 0
		for k, e := range sh.m {
			if slices.Contains(keep, e) {
				continue
			}
			if ms-e.last > e.spec.Window+e.spec.Width {
				victim, victimE = k, e
				break
			}
			if victimE == nil || e.fill < victimE.fill || e.fill == victimE.fill && e.last < victimE.last {
				victim, victimE = k, e
			}
			if n++; n == 16 {
				break
			}
		}
		if victimE == nil || victimE.fill >= algo.NearLimit && ms-victimE.last <= victimE.spec.Window+victimE.spec.Width {
			return false
		}
		remove(sh, victim, victimE)
		c.evicted.Add(1)
	}
	return !full()
}

// Sweep drops every counter whose count is zero at now, and returns how many it dropped.
func (c *Local) Sweep(now time.Time) int {
	ms := now.UnixMilli()
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if ms-e.last > e.spec.Window+e.spec.Width {
				remove(sh, k, e)
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n
}

// inlineSlots is how many buckets and spans a entry holds without a separate
// allocation: enough for the default 60 sub-buckets (window.NewSpec makes 62 slots).
const inlineSlots = 128
