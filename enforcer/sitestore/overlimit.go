package sitestore

import (
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// The over-limit cache: a counter that Redis refused a single hit cannot admit one before
// the decision's RetryAfter has passed, since counts only fall with time and the site's
// other enforcers only add to them. Until then a request of one hit whose every counter is
// so refused is refused in process, without a round trip, so a hot abusive key costs
// Redis nothing. An answer from the cache is only ever a refusal, and only one that Redis
// would give, with the Decision Redis would report when nothing else was added meanwhile:
// no room (a refused hit leaves none), the same retry and reset instants. A request of
// more hits, or one with a counter not in the cache, asks Redis (what a peek of its other
// counters, or the room left for more hits, would report is not known here).

// overShards is the number of shards of the over-limit cache, and overPerShard the
// counters each holds (past it, an arbitrary entry is dropped: that counter's next request
// asks Redis).
const (
	overShards   = 64
	overPerShard = 1 << 12
)

// overEntry is a counter Redis refused a hit.
type overEntry struct {
	until, reset int64 // unix ns: when a hit may fit again; when the count resets
	alg          algo.Algorithm
	lim          algo.Limit
	limit        int64 // the Decision's Limit
}

type overTable struct {
	seed   maphash.Seed
	n      atomic.Int64 // entries in all shards: 0 lets a request skip the lookup
	shards [overShards]struct {
		mu sync.Mutex
		m  map[string]overEntry
		_  [40]byte
	}
}

func newOverTable() *overTable {
	t := &overTable{seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].m = make(map[string]overEntry)
	}
	return t
}

// note records Redis's decision d of op at now (unix ns): a refusal that says when the
// request may fit is cached until then; an admission clears the counter's entry.
func (t *overTable) note(now int64, op *algo.Op, d *algo.Decision) {
	over := !d.Allowed && d.RetryAfter > 0 && op.N == 1 && d.Remaining == 0
	if !over && t.n.Load() == 0 {
		return
	}
	sh := &t.shards[maphash.String(t.seed, op.Key)%overShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	_, had := sh.m[op.Key]
	if !over {
		if had {
			delete(sh.m, op.Key)
			t.n.Add(-1)
		}
		return
	}
	until := int64(math.MaxInt64)
	if d.RetryAfter != algo.Never && d.RetryAfter < time.Duration(math.MaxInt64-now) {
		until = now + int64(d.RetryAfter)
	}
	if !had {
		if len(sh.m) >= overPerShard {
			for k := range sh.m {
				delete(sh.m, k)
				t.n.Add(-1)
				break
			}
		}
		t.n.Add(1)
	}
	sh.m[op.Key] = overEntry{until: until, reset: now + int64(d.ResetAfter), alg: op.Algorithm, lim: op.Limit, limit: d.Limit}
}

// get returns the entry that refuses op at now, if any: a hit, under the same algorithm
// and limit, before the time it may fit.
func (t *overTable) get(now int64, op *algo.Op) (overEntry, bool) {
	sh := &t.shards[maphash.String(t.seed, op.Key)%overShards]
	sh.mu.Lock()
	e, ok := sh.m[op.Key]
	if ok && now >= e.until {
		delete(sh.m, op.Key)
		t.n.Add(-1)
		ok = false
	}
	sh.mu.Unlock()
	if !ok || op.N != 1 || op.Algorithm != e.alg || op.Limit != e.lim {
		return overEntry{}, false
	}
	return e, true
}

// overLimit reports whether the cache refuses the request ops at now (every op a hit of a
// counter in the cache), and then fills out as Redis refused them, with the retry and
// reset instants from now.
func (s *Store) overLimit(now time.Time, ops []algo.Op, out []algo.Decision) bool {
	if s.over.n.Load() == 0 {
		return false
	}
	t := now.UnixNano()
	for i := range ops {
		e, ok := s.over.get(t, &ops[i])
		if !ok {
			return false
		}
		out[i] = algo.Decision{Limit: e.limit, RetryAfter: time.Duration(e.until - t), ResetAfter: time.Duration(max(e.reset-t, 0))}
		if e.until == math.MaxInt64 {
			out[i].RetryAfter = algo.Never
		}
	}
	return true
}
