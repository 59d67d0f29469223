package aggregator

import (
	"slices"
	"strings"
	"time"

	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// counterID names one counter: a (key, window) pair.
type counterID struct {
	key    string
	window int64 // ms
}

// entry is the aggregator's bookkeeping around one counter's window state. Its fields are
// ordered to pack into 128 bytes (a size class) on 64-bit machines.
type entry struct {
	id   counterID
	spec *window.Spec
	c    window.Counter
	next *entry // the next counter whose key has the same hash (another window, or a collision)

	lastEmitted float64 // total last published
	lastEmitAt  int64   // ms
	nextEval    int64   // ms: re-evaluate for decay no later than this

	slot    int32  // partition number the key's hits come from
	hash    uint32 // murmur2(key): its bucket in state.m
	idx     int32  // position in state.list
	dirty   bool   // hits were added since the last emission
	emitted bool   // a non-zero count has been published (so zero needs a tombstone)
}

// addResult says what state.add did with a hit.
type addResult int

const (
	added addResult = iota
	refusedKey
	outsideRing
	duplicate
)

// stateConfig is the part of Config the pure state needs.
type stateConfig struct {
	subBuckets   int
	tau          int64 // ms, the demand time constant
	siteForget   int64 // ms
	maxSkew      time.Duration
	maxKeys      int
	emitInterval int64 // ms
	maxSpecs     int
}

// state is every counter the instance owns, by source slot (partition number). It is not
// safe for concurrent use: the Aggregator guards it with its mutex.
type state struct {
	cfg   stateConfig
	specs map[int64]*window.Spec
	// m indexes the counters (their positions in list) by the murmur2 hash of their key,
	// which the ownership check computes for every hit anyway; counters whose keys share a
	// hash (a key's several windows, or a collision) are chained from the first. Indexed
	// by a uint32 it is markedly cheaper per hit than a string-keyed map: no string hash,
	// and no read of the key bytes in the table (index.go).
	m    index
	list []*entry // every counter, for iteration; len(list) is the number held
	// seen dedupes re-routed hits per slot: origin id → expiry (ms).
	seen     map[int32]map[string]int64
	seenSize int
	// paused slots publish nothing (replaying, or between revocation and re-assignment).
	paused map[int32]bool
	sites  map[string]string // interned site names (bounded by maxInternedSites)
	// heard holds, per source partition, what it has heard of each site (sites.go). Sites
	// are few: one entry per site per source partition.
	heard map[tp]map[string]*siteSeen
	// instances holds, per site, the producer instances heard from and what each counts
	// its site with, to find two instances of one site that count apart.
	instances map[string]map[string]instanceSeen
}

// instanceSeen is one producer instance's latest site heartbeat.
type instanceSeen struct {
	counter string
	at      int64 // ms, the aggregator's clock
}

// instanceWindow is how long an instance counts as live after its last heartbeat.
const instanceWindow = 10_000 // ms

// maxInstancesPerSite bounds instances per site; beyond it new ones are not tracked.
const maxInstancesPerSite = 1024

const maxInternedSites = 4096

// aheadRoom is how far past the aggregator's clock a counter's rings keep buckets. It
// serves two things: hits stamped by producers whose clocks are ahead, and counting a site
// as of its last heartbeat (state.heardAt), up to a heartbeat interval and a flush behind
// the site's newest hits, which the ring must still hold together with the window before
// it. Two seconds cover both with the default 500 ms site heartbeats; it is at most a
// quarter of the window (window.NewSpec). With 60 sub-buckets of a one-minute window that
// is 2 buckets: 63 slots, 252 bytes, inside one 256-byte size class.
const aheadRoom = 2 * time.Second

func newState(cfg stateConfig) *state {
	return &state{
		cfg:    cfg,
		specs:  map[int64]*window.Spec{},
		seen:   map[int32]map[string]int64{},
		paused: map[int32]bool{},
		sites:  map[string]string{},
		heard:  map[tp]map[string]*siteSeen{},

		instances: map[string]map[string]instanceSeen{},
	}
}

// sawInstance records that instance of site counts with counter, at now (ms).
func (s *state) sawInstance(now int64, site, instance, counter string) {
	if instance == "" || counter == "" {
		return
	}
	m := s.instances[site]
	if m == nil {
		if len(s.instances) >= maxInternedSites {
			return
		}
		m = map[string]instanceSeen{}
		s.instances[s.intern([]byte(site))] = m
	}
	if _, ok := m[instance]; !ok && len(m) >= maxInstancesPerSite {
		return
	}
	m[instance] = instanceSeen{counter: counter, at: now}
}

// conflicts returns the sites, sorted, that have two or more live instances counting
// apart, at least one of them in its own process ("process:…"), and forgets instances
// silent for longer than instanceWindow.
func (s *state) conflicts(now int64) []string {
	var out []string
	for site, m := range s.instances {
		first, apart, process := "", false, false
		for inst, seen := range m {
			if now-seen.at > instanceWindow {
				delete(m, inst)
				continue
			}
			if first == "" {
				first = seen.counter
			} else if seen.counter != first {
				apart = true
			}
			process = process || strings.HasPrefix(seen.counter, "process:")
		}
		if len(m) == 0 {
			delete(s.instances, site)
		}
		if apart && process {
			out = append(out, site)
		}
	}
	slices.Sort(out)
	return out
}

// countNow counts every site at the emission's instant. A live site's count is not frozen
// at the last time it was heard from: heartbeat jitter would then make the sites' counts
// disagree by up to a heartbeat period of hits, and shares flip with that noise. A site
// cut off from here is counted as of its last heartbeat instead (cutSites).
func countNow(string) (int64, bool) { return 0, false }

func (s *state) spec(w int64) *window.Spec {
	if sp, ok := s.specs[w]; ok {
		return sp
	}
	// The rings keep room for aheadRoom past the aggregator's clock (MaxClockSkew still
	// bounds what is accepted; a hit further ahead is counted in the furthest bucket the
	// ring holds): every bucket of room costs 4 bytes per (key, site).
	skew := min(s.cfg.maxSkew, aheadRoom)
	sp := window.NewSpec(time.Duration(w)*time.Millisecond, s.cfg.subBuckets, skew)
	sp.Tau = s.cfg.tau
	if len(s.specs) < s.cfg.maxSpecs {
		s.specs[w] = &sp
	}
	return &sp
}

func (s *state) intern(site []byte) string {
	if v, ok := s.sites[string(site)]; ok {
		return v
	}
	v := string(site)
	if len(s.sites) < maxInternedSites {
		s.sites[v] = v
	}
	return v
}

// add counts hit h (window already defaulted) from slot at aggregator time now (ms).
// origin is non-empty for a re-routed hit; expiry is when its dedupe entry may go.
func (s *state) add(now int64, slot int32, h *topics.Hit, origin string, expiry int64) addResult {
	return s.addRaw(now, slot, hitRef{key: []byte(h.Key), site: []byte(h.Site), bucketStart: h.BucketStart, window: h.Window, count: h.Count, denied: h.Denied}, origin, expiry)
}

// hitRef is a decoded hit whose key and site still point into the record.
type hitRef struct {
	key, site                  []byte
	bucketStart, window, count int64
	denied                     int64
	hash                       uint32 // murmur2(key), valid when hashed
	hashed                     bool
}

// addRaw is add without allocating for counters and sites already held.
func (s *state) addRaw(now int64, slot int32, h hitRef, origin string, expiry int64) addResult {
	if origin != "" {
		ss := s.seen[slot]
		if _, dup := ss[origin]; dup {
			return duplicate
		}
		if s.seenSize >= s.cfg.maxKeys {
			s.pruneSeen(now)
		}
		if s.seenSize >= s.cfg.maxKeys {
			return refusedKey
		}
		if ss == nil {
			ss = map[string]int64{}
			s.seen[slot] = ss
		}
		ss[origin] = expiry
		s.seenSize++
	}
	if !h.hashed {
		h.hash = topics.Murmur2(h.key)
	}
	var e *entry
	for e = s.head(h.hash); e != nil && (e.id.window != h.window || e.id.key != string(h.key)); e = e.next {
	}
	if e == nil {
		if len(s.list) >= s.cfg.maxKeys {
			return refusedKey
		}
		e = &entry{id: counterID{string(h.key), h.window}, spec: s.spec(h.window), slot: slot, hash: h.hash, idx: int32(len(s.list))}
		e.next = s.head(h.hash)
		s.m.set(h.hash, e.idx)
		s.list = append(s.list, e)
	}
	if !e.c.AddSite(e.spec, now, h.site, s.intern, h.bucketStart, h.count, h.denied) {
		return outsideRing
	}
	e.dirty = true
	return added
}

// get returns the counter of (key, w), or nil.
func (s *state) get(key string, w int64) *entry {
	for e := s.head(topics.Murmur2([]byte(key))); e != nil; e = e.next {
		if e.id.window == w && e.id.key == key {
			return e
		}
	}
	return nil
}

// size returns the number of counters held.
func (s *state) size() int { return len(s.list) }

func (s *state) remove(e *entry) {
	switch head := s.head(e.hash); {
	case head == e && e.next == nil:
		s.m.del(e.hash)
	case head == e:
		s.m.set(e.hash, e.next.idx)
	default:
		for p := head; p != nil; p = p.next {
			if p.next == e {
				p.next = e.next
				break
			}
		}
	}
	e.next = nil
	// The last counter takes e's place in list; if it heads its chain, the index follows.
	last := s.list[len(s.list)-1]
	if last != e {
		if s.head(last.hash) == last {
			s.m.set(last.hash, e.idx)
		}
		s.list[e.idx] = last
		last.idx = e.idx
	}
	s.list = s.list[:len(s.list)-1]
}

// head returns the first counter whose key hashes to h, or nil.
func (s *state) head(h uint32) *entry {
	if i := s.m.get(h); i >= 0 {
		return s.list[i]
	}
	return nil
}

// dropSlot forgets every counter and dedupe entry of slot.
func (s *state) dropSlot(slot int32) {
	for i := len(s.list) - 1; i >= 0; i-- {
		if e := s.list[i]; e.slot == slot {
			s.remove(e)
		}
	}
	s.seenSize -= len(s.seen[slot])
	delete(s.seen, slot)
}

// markDirty makes every counter of slot due for emission (after its replay).
func (s *state) markDirty(slot int32) {
	for _, e := range s.list {
		if e.slot == slot {
			e.dirty = true
		}
	}
}

func (s *state) pruneSeen(now int64) {
	for slot, ss := range s.seen {
		for k, exp := range ss {
			if exp < now {
				delete(ss, k)
				s.seenSize--
			}
		}
		if len(ss) == 0 {
			delete(s.seen, slot)
		}
	}
}

// emission is one record to publish: a count, or a tombstone when count is nil.
type emission struct {
	key   string
	slot  int32
	count *topics.Count
}

type candidate struct {
	e     *entry
	total float64
	zero  bool
	prio  float64
}

// collect returns the emissions due at now (ms), at most budget of them, the biggest
// changes first, and updates the counters' bookkeeping; counters that reached zero are
// forgotten. Counters not chosen stay due for the next call. cands is scratch space.
//
// Due means: hits were added and the last emission is at least emitInterval old, or the
// counter's decay re-evaluation time has come. A decay re-evaluation that finds the value
// unchanged publishes nothing. Re-evaluation happens every max(bucket width, emit interval).
func (s *state) collect(now int64, budget int, cands []candidate, out []emission) ([]candidate, []emission) {
	cands = cands[:0]
	cuts := s.cutSites(now)
	for i := len(s.list) - 1; i >= 0; i-- {
		e := s.list[i]
		if s.paused[e.slot] {
			continue
		}
		if !(e.dirty && now >= e.lastEmitAt+s.cfg.emitInterval) && now < e.nextEval {
			continue
		}
		at := cuts.at(e.slot)
		if at == nil {
			at = countNow
		}
		total, zero := e.c.SumAt(e.spec, now, at)
		if zero {
			if !e.emitted {
				s.remove(e) // nothing published: forget silently
				continue
			}
			cands = append(cands, candidate{e: e, zero: true, prio: e.lastEmitted + 1})
			continue
		}
		// An unchanged count is not published again, except that a count older than half
		// its window is refreshed: readers treat a count whose window has passed since its
		// as-of time as gone (that is how a key no instance owns any more expires).
		if total == e.lastEmitted && e.emitted && now-e.lastEmitAt < e.id.window/2 {
			e.dirty = false
			e.nextEval = now + max(e.spec.Width, s.cfg.emitInterval)
			continue
		}
		d := total - e.lastEmitted
		if d < 0 {
			d = -d
		}
		cands = append(cands, candidate{e: e, total: total, prio: d})
	}
	if len(cands) > budget {
		slices.SortFunc(cands, func(a, b candidate) int {
			switch {
			case a.prio > b.prio:
				return -1
			case a.prio < b.prio:
				return 1
			}
			return 0
		})
		cands = cands[:budget]
	}
	for _, c := range cands {
		e := c.e
		if c.zero {
			out = append(out, emission{key: e.id.key, slot: e.slot})
			s.remove(e)
			continue
		}
		cnt := &topics.Count{Key: e.id.key, Window: e.id.window, AsOf: now, SubBuckets: s.cfg.subBuckets}
		at := cuts.at(e.slot)
		if at == nil {
			at = countNow
		}
		cnt.Sites, cnt.Total, _ = e.c.AppendSitesAt(make([]topics.SiteCount, 0, e.c.Sites()), e.spec, now, at)
		out = append(out, emission{key: e.id.key, slot: e.slot, count: cnt})
		e.dirty, e.emitted = false, true
		e.lastEmitted, e.lastEmitAt = c.total, now
		e.nextEval = now + max(e.spec.Width, s.cfg.emitInterval)
	}
	return cands, out
}
