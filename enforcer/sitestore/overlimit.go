package sitestore

import (
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// The over-limit cache: a counter that Redis reported over its limit cannot admit the
// same request (or a larger one, under the same limit) before the decision's RetryAfter
// has passed, since counts only fall with time and the site's other enforcers only add to
// them. Until then a request that needs such a counter is refused in process, without a
// round trip, so a hot abusive key costs Redis nothing. An answer from the cache is only
// ever a refusal, and only one that Redis would give: it never admits anything.

// overShards is the number of shards of the over-limit cache, and overPerShard the
// counters each holds (past it, an arbitrary entry is dropped: that counter's next request
// asks Redis).
const (
	overShards   = 64
	overPerShard = 1 << 12
)

// overEntry is a counter Redis reported over its limit for requests of n or more.
type overEntry struct {
	until, reset int64 // unix ns: when a request of n may fit again; when the count resets
	n            int64
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
	over := !d.Allowed && d.RetryAfter > 0 && op.N > 0
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
	sh.m[op.Key] = overEntry{until: until, reset: now + int64(d.ResetAfter), n: op.N, alg: op.Algorithm, lim: op.Limit, limit: d.Limit}
}

// get returns the entry that refuses op at now, if any: same algorithm and limit, a
// request at least as large, before the time it may fit.
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
	if !ok || op.N < e.n || op.Algorithm != e.alg || op.Limit != e.lim {
		return overEntry{}, false
	}
	return e, true
}

// overLimit reports whether the cache refuses the request ops at now, and then fills out:
// the refusing ops as Redis refused them (RetryAfter and ResetAfter from now), the others
// as admitted on their own, with the room Redis last reported.
func (s *Store) overLimit(now time.Time, ops []algo.Op, out []algo.Decision) bool {
	if s.over.n.Load() == 0 {
		return false
	}
	t := now.UnixNano()
	refused := false
	for i := range ops {
		e, ok := s.over.get(t, &ops[i])
		if !ok {
			out[i] = algo.Decision{}
			continue
		}
		refused = true
		out[i] = algo.Decision{Limit: e.limit, RetryAfter: time.Duration(e.until - t), ResetAfter: time.Duration(max(e.reset-t, 0))}
		if e.until == math.MaxInt64 {
			out[i].RetryAfter = algo.Never
		}
	}
	if !refused {
		return false
	}
	for i := range ops {
		if out[i].Limit == 0 && out[i].RetryAfter == 0 {
			out[i] = s.known.room(ops[i].Key, t, ops[i].Limit.Allowance())
		}
	}
	return true
}
