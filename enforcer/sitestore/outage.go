package sitestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
)

// This file bounds what an outage of Redis costs (docs/redis.md, "While Redis is away"):
//
//   - Every answer from Redis leaves the counter's last known use (how much of its limit
//     the site had used, and when), and what this process itself had Redis admit lately.
//     When Redis becomes unavailable, the first in-process decision on a counter raises
//     the fallback's count to this process's share of that use, or to its own admissions
//     when they were more, so that the fallback spends only its share of what was left,
//     not a fresh limit. The processes of a site last heard from Redis at different
//     instants: one that admitted most of a count the others never saw charges itself
//     what it admitted, not a share of the count it saw.
//   - Every hit admitted in process while Redis is unavailable is kept, per counter, as a
//     pending write back. Before Redis decides anything again (the breaker's probe
//     included), the pending hits are added to Redis, each batch with a marker key so that
//     a retried write back (after a timeout that hid a success) does not count twice.

// knownShards is the number of shards of the last-known-use table.
const knownShards = 64

// knownPerShard bounds the counters whose last known use a shard keeps: past it, an
// arbitrary entry is dropped (that counter then falls back from zero).
const knownPerShard = 1 << 14

// knownUse is a counter's use as Redis last reported it.
type knownUse struct {
	used, limit int64 // the Decision's Limit − Remaining, and Limit
	at          int64 // unix ns of that decision
	// own is what this process had Redis admit since ownSince (unix ns), less than a
	// window before at: within the window of any instant up to at, or a little earlier.
	own, ownSince int64
	window        time.Duration
	seeded        uint64    // the outage whose fallback was raised to it (0: none)
	restore       writeBack // the counter, to restore this process's share of used
}

type knownTable struct {
	seed   maphash.Seed
	shards [knownShards]struct {
		mu sync.Mutex
		m  map[string]*knownUse
	}
}

func newKnownTable() *knownTable {
	t := &knownTable{seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].m = make(map[string]*knownUse)
	}
	return t
}

// note records a Redis decision of key, which admitted own of this process's hits.
func (t *knownTable) note(key string, window time.Duration, at int64, limit, remaining, own int64, restore *writeBack) {
	sh := &t.shards[maphash.String(t.seed, key)%knownShards]
	sh.mu.Lock()
	e := sh.m[key]
	if e == nil {
		if len(sh.m) >= knownPerShard {
			for k := range sh.m {
				delete(sh.m, k)
				break
			}
		}
		e = &knownUse{}
		sh.m[key] = e
	}
	e.used, e.limit, e.at, e.window, e.seeded = max(limit-remaining, 0), limit, at, window, 0
	if at-e.ownSince >= int64(window) {
		e.own, e.ownSince = 0, at
	}
	e.own += own
	e.restore = *restore
	sh.mu.Unlock()
}

// live returns the entries still inside their window at now.
func (t *knownTable) live(now int64) []knownUse {
	var out []knownUse
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			if now-e.at < int64(e.window) && e.used > 0 {
				out = append(out, *e)
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// claim returns key's last known use if it is still inside its window at now and has not
// been claimed in this outage yet, and marks it claimed.
func (t *knownTable) claim(key string, now int64, outage uint64) (knownUse, bool) {
	sh := &t.shards[maphash.String(t.seed, key)%knownShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	if e == nil || e.seeded == outage || now-e.at >= int64(e.window) {
		return knownUse{}, false
	}
	e.seeded = outage
	return *e, true
}

// writeBack is one batch of hits admitted in process, to be added to Redis.
type writeBack struct {
	id     string
	c      *Counter      // a global-scope site count (gop) of c, or nil: a site-scope op
	op     algo.Op       // N is the batch's total
	gop    sitecount.Op  // N is the batch's total
	last   int64         // unix ns of the batch's newest hit
	window time.Duration // hits older than this at write-back time no longer matter
	// envoy marks FallbackEnvoy's hits of op.Key, a key in envoyproxy/ratelimit's layout,
	// whose window ends at end (unix ns).
	envoy bool
	end   int64
}

// pending holds the write backs not yet in Redis: open batches (still growing, one per
// counter) and sealed ones (a write back was tried; retried with the same id).
type pending struct {
	prefix string // unique to this Store: batch ids are prefix + sequence number
	seq    atomic.Uint64
	n      atomic.Int64 // open + sealed batches: the request path's cheap "anything to do?"

	mu     sync.Mutex
	open   map[string]*writeBack
	sealed []*writeBack
}

func newPending() *pending {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &pending{prefix: hex.EncodeToString(b[:]) + ":", open: make(map[string]*writeBack)}
}

// add records n hits of key admitted in process at now.
func (p *pending) add(mapKey string, now int64, mk func() *writeBack, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	wb := p.open[mapKey]
	if wb == nil {
		wb = mk()
		wb.id = p.prefix + strconv.FormatUint(p.seq.Add(1), 36)
		p.open[mapKey] = wb
		p.n.Add(1)
	}
	if wb.c != nil {
		wb.gop.N += n
	} else {
		wb.op.N += n
	}
	wb.last = max(wb.last, now)
}

// seal moves every open batch to the sealed list and returns the sealed list.
func (p *pending) seal() []*writeBack {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, wb := range p.open {
		p.sealed = append(p.sealed, wb)
		delete(p.open, k)
	}
	return p.sealed
}

// done removes the first k sealed batches (written back or too old to matter).
func (p *pending) done(k int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sealed = p.sealed[k:]
	p.n.Add(-int64(k))
}

// Pending returns the number of batches of in-process hits waiting to be written back to
// Redis.
func (s *Store) Pending() int { return int(s.pend.n.Load()) }

// seedFallback raises the fallback's count of each op to this process's share of the
// counter's last known use in Redis, once per outage (see the top of this file).
func (s *Store) seedFallback(now time.Time, ops []algo.Op) {
	t := now.UnixNano()
	outage := s.outage.Load()
	for i := range ops {
		k, ok := s.known.claim(ops[i].Key, t, outage)
		if !ok || k.used == 0 && k.own == 0 {
			continue
		}
		op := ops[i]
		op.Limit = scaleLimit(op.Limit, s.fallbackShare)
		op.N = 1
		cur := s.fallback.Peek(now, op)
		target := min(max(int64(math.Ceil(float64(k.used)*s.fallbackShare)), k.own), cur.Limit)
		if add := target - (cur.Limit - cur.Remaining); add > 0 {
			op.N = add
			var out [1]algo.Decision
			s.fallback.AllowAll(now, []algo.Op{op}, out[:])
		}
	}
}

// errWriteBackBusy is flush's answer while another call is writing back.
var errWriteBackBusy = errors.New("sitestore: another call is writing back")

// recover makes Redis fit to decide again after a failure: with check (the breaker's
// probe) or after any failed call, it checks whether Redis lost its data (checkRestart),
// then writes the pending batches back. While another call is doing so it returns
// errWriteBackBusy at once rather than wait: a queue of callers behind a Redis that is
// down would each add a timeout to the next one's wait (run decides whether to wait for
// that other call instead, waitWriteBack).
func (s *Store) recover(ctx context.Context, now time.Time, check bool) error {
	if !s.flushMu.TryLock() {
		return errWriteBackBusy
	}
	defer s.flushMu.Unlock()
	done := make(chan struct{})
	s.recovering.Store(&done)
	defer func() {
		s.recovering.Store(nil)
		close(done)
	}()
	fails := s.fails.Load()
	if check || fails != s.checked.Load() {
		if err := s.checkRestart(ctx, now); err != nil {
			return err
		}
	}
	if err := s.flush(ctx, now); err != nil {
		return err
	}
	s.checked.Store(fails)
	return nil
}

// waitWriteBack waits, up to the Store's timeout or the end of ctx, for the recover that
// another call is running, and reports whether it ended (successfully or not: the caller
// looks at what is still pending).
func (s *Store) waitWriteBack(ctx context.Context) bool {
	p := s.recovering.Load()
	if p == nil {
		return true
	}
	t := time.NewTimer(s.timeout)
	defer t.Stop()
	select {
	case <-*p:
		return true
	case <-ctx.Done():
		return false
	case <-t.C:
		return false
	}
}

// flush writes the pending batches back to Redis, oldest first, each with its own
// timeout. It stops at the first failure (the rest stay pending, with their ids). The
// caller holds flushMu.
func (s *Store) flush(ctx context.Context, now time.Time) error {
	batches := s.pend.seal()
	for i, wb := range batches {
		if err := s.writeBackOne(ctx, now, wb); err != nil {
			s.pend.done(i)
			return err
		}
		s.m.writtenBack.Inc()
	}
	s.pend.done(len(batches))
	return nil
}

// writeBackOne adds one batch to Redis at now (hits that happened earlier are counted as
// if now: never less than they were), unless they have all left their window.
func (s *Store) writeBackOne(ctx context.Context, now time.Time, wb *writeBack) error {
	if wb.envoy {
		return s.writeBackEnvoy(ctx, now, wb)
	}
	t := now.UnixNano()
	if t-wb.last >= int64(wb.window) {
		return nil
	}
	ttl := wb.window.Milliseconds() + 2*s.slackMs
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var err error
	if wb.c != nil {
		ops := []sitecount.Op{wb.gop}
		ops[0].Cap = math.Inf(1)
		keys, args := wb.c.args(now, ops, true)
		keys = append(keys, wb.c.RedisKey(wb.gop.Key)+":wb:"+wb.id)
		args[0] = "2"
		args = append(args, ttl)
		err = wb.c.script.Run(cctx, s.client, keys, args...).Err()
	} else {
		k := s.redisKey(wb.op.Key)
		args := []any{t / 1e9, t % 1e9, strconv.FormatInt(t, 10), s.slackMs, "2", 1}
		args = s.appendOpArgs(args, t, &wb.op)
		args = append(args, ttl)
		err = s.script.Run(cctx, s.client, []string{k, k + ":log", k + ":wb:" + wb.id}, args...).Err()
	}
	if err != nil {
		return fmt.Errorf("sitestore: writing back %d hits of %q: %w", max(wb.op.N, wb.gop.N), wb.op.Key+wb.gop.Key, err)
	}
	return nil
}

// noteAll records the use Redis reported for each op.
func (s *Store) noteAll(now time.Time, ops []algo.Op, out []algo.Decision) {
	t := now.UnixNano()
	for i := range ops {
		var own int64
		if out[i].Allowed {
			own = ops[i].N
		}
		s.known.note(ops[i].Key, ops[i].Limit.Window, t, out[i].Limit, out[i].Remaining, own,
			&writeBack{op: ops[i], window: ops[i].Limit.Window})
		if !keyBefore(ops, i) {
			// A later op on the same key was decided as if the earlier ones had taken:
			// its retry time is not the counter's.
			s.over.note(t, &ops[i], &out[i])
		}
	}
}

// pendAll records the hits of ops, just admitted in process during an outage.
func (s *Store) pendAll(now time.Time, ops []algo.Op) {
	t := now.UnixNano()
	for i := range ops {
		op := ops[i]
		if op.N <= 0 {
			continue
		}
		s.pend.add("s"+op.Key, t, func() *writeBack {
			wb := &writeBack{op: op, window: op.Limit.Window}
			wb.op.N = 0
			return wb
		}, op.N)
	}
}

// seedCounter raises the fallback counter's count of each op to this process's share of
// the site's last known count, once per outage.
func (c *Counter) seedCounter(ctx context.Context, now time.Time, ops []sitecount.Op) {
	t := now.UnixNano()
	outage := c.s.outage.Load()
	var cur [1]float64
	for i := range ops {
		k, ok := c.s.known.claim("g"+ops[i].Key, t, outage)
		if !ok || k.used == 0 && k.own == 0 {
			continue
		}
		op := ops[i]
		_ = c.fallback.Counts(ctx, now, []sitecount.Op{op}, cur[:])
		if add := int64(math.Ceil(max(float64(k.used)*c.share, float64(k.own)) - cur[0])); add > 0 {
			op.N, op.Cap = add, math.Inf(1)
			_, _ = c.fallback.Commit(ctx, now, []sitecount.Op{op}, nil)
		}
	}
}

// noteCounts records the site's counts Redis reported (after the request's own N when it
// was committed).
func (c *Counter) noteCounts(now time.Time, ops []sitecount.Op, counts []float64, committed bool) {
	t := now.UnixNano()
	for i := range ops {
		n, own := counts[i], int64(0)
		if committed {
			n += float64(ops[i].N)
			own = ops[i].N
		}
		c.s.known.note("g"+ops[i].Key, ops[i].Window, t, int64(math.Ceil(n)), 0, own,
			&writeBack{c: c, gop: ops[i], window: ops[i].Window})
	}
}

// pendCounts records the hits of ops, just committed in process during an outage.
func (c *Counter) pendCounts(now time.Time, ops []sitecount.Op) {
	t := now.UnixNano()
	for i := range ops {
		op := ops[i]
		if op.N <= 0 {
			continue
		}
		c.s.pend.add("g"+op.Key+"#"+op.Window.String(), t, func() *writeBack {
			wb := &writeBack{c: c, gop: op, window: op.Window}
			wb.gop.N = 0
			return wb
		}, op.N)
	}
}

// aliveRefresh is how often a Store re-sets its alive key while Redis answers, and
// aliveTTL how long the key lives: Redis losing its data (a restart without persistence)
// is told by the key's absence when Redis comes back.
const (
	aliveRefresh = time.Minute
	aliveTTL     = 10 * time.Minute
)

// keepAlive sets the alive key when it is due.
func (s *Store) keepAlive(ctx context.Context, now time.Time) {
	t := now.UnixNano()
	last := s.aliveAt.Load()
	if t-last < int64(aliveRefresh) || !s.aliveAt.CompareAndSwap(last, t) {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.client.Set(cctx, s.aliveKey, 1, aliveTTL).Err(); err != nil {
		s.aliveAt.Store(last) // try again with the next call
	}
}

// checkRestart runs in the breaker's probe, before the write back: when the alive key
// this Store had set is gone, Redis lost its data, and each counter this process knew
// within its window gets back this process's share of its last known use (the site's N
// enforcers together restore about all of it), as write-back batches.
func (s *Store) checkRestart(ctx context.Context, now time.Time) error {
	if s.aliveAt.Load() == 0 {
		return nil // never set: nothing to compare with
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	n, err := s.client.Exists(cctx, s.aliveKey).Result()
	if err != nil {
		return fmt.Errorf("sitestore: checking for a Redis restart: %w", err)
	}
	if n == 1 {
		return nil
	}
	t := now.UnixNano()
	restored := 0
	for _, k := range s.known.live(t) {
		wb := k.restore
		amount := int64(math.Ceil(float64(k.used) * s.fallbackShare))
		if wb.c != nil {
			amount = int64(math.Ceil(float64(k.used) * wb.c.share))
		}
		if amount <= 0 {
			continue
		}
		key := "s" + wb.op.Key
		if wb.c != nil {
			key = "g" + wb.gop.Key + "#" + wb.gop.Window.String()
		}
		s.pend.add("r"+key, t, func() *writeBack {
			b := wb
			b.op.N, b.gop.N = 0, 0
			return &b
		}, amount)
		restored++
	}
	s.log.Warn("sitestore: Redis came back without its data; restoring this enforcer's share of the last known counts",
		"counters", restored)
	s.aliveAt.Store(0)
	return nil
}

// keyBefore reports whether an op before ops[i] has its key.
func keyBefore(ops []algo.Op, i int) bool {
	for j := range i {
		if ops[j].Key == ops[i].Key {
			return true
		}
	}
	return false
}
