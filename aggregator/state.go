package aggregator

import (
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// counterID names one counter: a (key, window) pair.
type counterID struct {
	key    string
	window int64 // ms
}

// entry is the aggregator's bookkeeping around one counter's window state. Entries are held
// by value in the state's chunks, 80 bytes each, so that a counter costs its entry, its key
// and its index slot and nothing else while it is compact (see compact.go): a counter whose
// hits so far are one record keeps that record in the entry itself, and takes a
// window.Counter (full) only with its second record. The counter's window is spec.Window.
type entry struct {
	key  string
	spec *window.Spec
	full *window.Counter // nil while the counter is compact

	lastEmitted float64 // total last published
	lastEmitAt  int64   // ms
	nextEval    int64   // ms: re-evaluate for decay no later than this

	// The compact counter's one record: its bucket start, its hits, its hits and denied
	// requests together (the demand it added), and its site (state.names). Once the
	// counter is full, start is when its latest record came (ms, the aggregator's clock);
	// either way it is how recently the counter was hit (lastHit), by which a full table
	// evicts.
	start  int64
	hits   uint32
	demand uint32

	slot   int32  // partition number the key's hits come from
	site   uint16 // compact: the record's site
	dirty  bool   // hits were added since the last emission
	status uint8  // statusEmitted, statusQueued
}

// An entry's status bits.
const (
	// statusEmitted: a non-zero count has been published (so zero needs a tombstone).
	statusEmitted uint8 = 1 << iota
	// statusQueued: the counter waits, ranked, in the backlog (backlog.go); scans pass it.
	statusQueued
)

// window returns the counter's window, in milliseconds.
func (e *entry) window() int64 { return e.spec.Window }

// chunkBits sets the entries per chunk (1 << chunkBits): chunks are allocated and freed
// whole, so that entries never move but to fill a removed one's place, and the entries
// held cost at most one chunk more than their own size.
const chunkBits = 9

// addResult says what state.add did with a hit.
type addResult int

const (
	added addResult = iota
	// addedEvicting: added as a new counter, in the place of the least recently hit of a
	// sample (MaxKeys were held).
	addedEvicting
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
	// m indexes the counters (their positions in chunks) by the murmur2 hash of their
	// key, which the ownership check computes for every hit anyway. Indexed by a uint32 it
	// is markedly cheaper per hit than a string-keyed map: no string hash, and no read of
	// the key bytes in the table (index.go).
	m index
	// chunks hold the counters, n of them, at positions 0 to n−1 (at).
	chunks [][]entry
	n      int32
	// candAt is collect's scratch: the candidates' positions.
	candAt map[int32]int32
	// backlog holds the due counters that a round had no room for, ranked (backlog.go).
	backlog backlog
	// evals counts the counters' values computed (sumAt, appendSitesAt), so that a test
	// can hold emission to a few per counter published.
	evals int
	// seen dedupes re-routed hits per slot: origin id → expiry (ms).
	seen     map[int32]map[string]int64
	seenSize int
	// paused slots publish nothing (replaying, or between revocation and re-assignment).
	paused map[int32]bool
	sites  map[string]uint16 // interned site names and their numbers in names (bounded by maxInternedSites)
	names  []string
	// heard holds, per source partition, what it has heard of each site (sites.go). Sites
	// are few: one entry per site per source partition.
	heard map[tp]map[string]*siteSeen
	// instances holds, per site, the producer instances heard from and what each counts
	// its site with, to find two instances of one site that count apart.
	instances map[string]map[string]instanceSeen
	// sampler draws the counters a full table compares for eviction (splitmix64).
	sampler uint64
}

// instanceSeen is one producer instance's latest site heartbeat.
type instanceSeen struct {
	counter string
	at      int64 // ms, the heartbeat's date, at most when it was read
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
		sites:  map[string]uint16{},
		heard:  map[tp]map[string]*siteSeen{},

		instances: map[string]map[string]instanceSeen{},
	}
}

// sawInstance records that instance of site counts with counter, from its heartbeat dated
// ts (ms of the instance's clock), read at now (ms). The instance is live as of its
// heartbeat's date, not of the reading: an old heartbeat read again (a replay by someone
// who can read the topic, or the history read at a start) must not bring an instance that
// stopped back to life and raise a conflict with the instance that replaced it. A date
// ahead of now (a clock ahead, within what site records may be) counts as now.
func (s *state) sawInstance(now, ts int64, site, instance, counter string) {
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
	at := min(now, ts)
	if prev, ok := m[instance]; ok && prev.at > at {
		at = prev.at
	}
	m[instance] = instanceSeen{counter: counter, at: at}
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
	v, _, _ := s.internID(site)
	return v
}

// internID is intern that also returns the name's number in names, and false when it could
// not be interned (maxInternedSites are).
func (s *state) internID(site []byte) (string, uint16, bool) {
	if id, ok := s.sites[string(site)]; ok {
		return s.names[id], id, true
	}
	v := string(site)
	if len(s.sites) >= maxInternedSites {
		return v, 0, false
	}
	id := uint16(len(s.names))
	s.sites[v] = id
	s.names = append(s.names, v)
	return v, id, true
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
	pos := s.lookup(h.hash, h.key, h.window)
	var e *entry
	res := added
	if pos < 0 {
		if int(s.n) >= s.cfg.maxKeys {
			s.remove(s.leastRecentlyHit())
			res = addedEvicting
		}
		pos = s.push(entry{key: string(h.key), spec: s.spec(h.window), slot: slot})
		s.m.insert(h.hash, pos)
		e = s.at(pos)
		if s.compactAdd(e, now, &h) {
			e.dirty = true
			return res
		}
		e.full = new(window.Counter)
	} else if e = s.at(pos); e.full == nil {
		s.materialize(e)
	}
	e.start = now
	if !e.full.AddSite(e.spec, now, h.site, s.intern, h.bucketStart, h.count, h.denied) {
		return outsideRing
	}
	e.dirty = true
	return res
}

// evictSample is how many counters a full table compares to choose the one to evict.
const evictSample = 16

// leastRecentlyHit returns the position of the counter hit least recently (lastHit) of a
// sample of evictSample (of every counter, when there are no more), for a new counter to
// take its place. The least recently hit costs least: its last published count stays in
// the enforcers' snapshots until its window has passed since, which is what its count
// would have done had its key gone quiet; only if its key is hit again within that window
// does the new counter count from zero. Called with at least one counter held.
func (s *state) leastRecentlyHit() int32 {
	best := int32(-1)
	consider := func(pos int32) {
		if best < 0 || s.at(pos).lastHit() < s.at(best).lastHit() {
			best = pos
		}
	}
	if s.n <= evictSample {
		for pos := range s.n {
			consider(pos)
		}
		return best
	}
	for range evictSample {
		s.sampler += 0x9e3779b97f4a7c15
		z := s.sampler
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		consider(int32(z % uint64(s.n)))
	}
	return best
}

// lastHit returns when e was last hit (ms): the bucket start of a compact counter's one
// record, when a full counter's latest record came.
func (e *entry) lastHit() int64 { return e.start }

// at returns the counter at position pos (0 ≤ pos < n).
func (s *state) at(pos int32) *entry {
	return &s.chunks[pos>>chunkBits][pos&(1<<chunkBits-1)]
}

// push adds e at the end and returns its position.
func (s *state) push(e entry) int32 {
	pos := s.n
	if int(pos>>chunkBits) == len(s.chunks) {
		s.chunks = append(s.chunks, make([]entry, 1<<chunkBits))
	}
	s.n++
	*s.at(pos) = e
	return pos
}

// lookup returns the position of the counter of (key, w) whose key hashes to h, or -1.
func (s *state) lookup(h uint32, key []byte, w int64) int32 {
	for i := s.m.first(h); i >= 0; i = s.m.next(i, h) {
		pos := s.m.slots[i].pos
		if e := s.at(pos); e.window() == w && e.key == string(key) {
			return pos
		}
	}
	return -1
}

// get returns the counter of (key, w), or nil.
func (s *state) get(key string, w int64) *entry {
	if pos := s.lookup(topics.Murmur2([]byte(key)), []byte(key), w); pos >= 0 {
		return s.at(pos)
	}
	return nil
}

// size returns the number of counters held.
func (s *state) size() int { return int(s.n) }

// remove forgets the counter at pos. The last counter takes its place (as the last
// element of a list would), so a position held across a remove may name another counter.
func (s *state) remove(pos int32) {
	e := s.at(pos)
	s.m.remove(keyHash(e.key), pos)
	last := s.n - 1
	if last != pos {
		l := s.at(last)
		s.m.repoint(keyHash(l.key), last, pos)
		*e = *l
	}
	*s.at(last) = entry{}
	s.n--
	// Free the chunks beyond the one the entries end in and one spare, so that a count
	// that moves about a chunk's boundary does not allocate a chunk each time it crosses.
	if keep := int(s.n>>chunkBits) + 2; len(s.chunks) > keep {
		clear(s.chunks[keep:])
		s.chunks = s.chunks[:keep]
	}
}

// keyHash is murmur2 of key, the hash the index holds it under.
func keyHash(key string) uint32 {
	return topics.Murmur2(unsafe.Slice(unsafe.StringData(key), len(key)))
}

// dropSlot forgets every counter and dedupe entry of slot.
func (s *state) dropSlot(slot int32) {
	s.backlog.dropSlot(slot)
	for i := s.n - 1; i >= 0; i-- {
		if s.at(i).slot == slot {
			s.remove(i)
		}
	}
	s.seenSize -= len(s.seen[slot])
	delete(s.seen, slot)
}

// markDirty makes every counter of slot due for emission (after its replay).
func (s *state) markDirty(slot int32) {
	for i := range s.n {
		if e := s.at(i); e.slot == slot {
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

// trackCands fills candAt with the positions of cands.
func (s *state) trackCands(cands []candidate) {
	if s.candAt == nil {
		s.candAt = map[int32]int32{}
	}
	clear(s.candAt)
	for j, c := range cands {
		s.candAt[c.pos] = int32(j)
	}
}

// emission is one record to publish: a count, or a tombstone when count is nil.
type emission struct {
	key   string
	slot  int32
	count *topics.Count
}

type candidate struct {
	pos   int32 // the counter's position
	total float64
	zero  bool
	prio  float64
}

// collect returns the emissions due at now (ms), at most budget of them, the biggest
// changes first, and updates the counters' bookkeeping; counters that reached zero are
// forgotten. Counters not chosen stay due, ranked in the backlog (backlog.go), and come
// out in later calls by their change when they were ranked, before counters that became
// due later with smaller changes. cands is scratch space.
//
// Due means: hits were added and the last emission is at least emitInterval old, or the
// counter's decay re-evaluation time has come. A decay re-evaluation that finds the value
// unchanged publishes nothing. Re-evaluation happens every max(bucket width, emit interval).
func (s *state) collect(now int64, budget int, cands []candidate, out []emission) ([]candidate, []emission) {
	cands = cands[:0]
	cuts := s.cutSites(now)
	// tracking: candAt maps the chosen counters' positions to their candidates, kept from
	// the first silent removal on (a removal moves the last counter).
	tracking := false
	for i := s.n - 1; i >= 0; i-- {
		e := s.at(i)
		if s.paused[e.slot] || e.status&statusQueued != 0 {
			continue
		}
		if !(e.dirty && now >= e.lastEmitAt+s.cfg.emitInterval) && now < e.nextEval {
			continue
		}
		at := cuts.at(e.slot)
		if at == nil {
			at = countNow
		}
		total, zero := s.sumAt(e, now, at)
		if zero {
			if e.status&statusEmitted == 0 {
				// Nothing published: forget silently. The last counter, already scanned,
				// takes its place; if it was chosen, its candidate follows it.
				if last := s.n - 1; last != i && len(cands) > 0 {
					if !tracking {
						tracking = true
						s.trackCands(cands)
					}
					if j, ok := s.candAt[last]; ok {
						cands[j].pos = i
						delete(s.candAt, last)
						s.candAt[i] = j
					}
				}
				s.remove(i)
				continue
			}
			cands = append(cands, candidate{pos: i, zero: true, prio: e.lastEmitted + 1})
			if tracking {
				s.candAt[i] = int32(len(cands) - 1)
			}
			continue
		}
		if s.unchanged(e, now, total) {
			continue
		}
		d := total - e.lastEmitted
		if d < 0 {
			d = -d
		}
		cands = append(cands, candidate{pos: i, total: total, prio: d})
		if tracking {
			s.candAt[i] = int32(len(cands) - 1)
		}
	}
	if len(cands) > budget || len(s.backlog) > 0 {
		return cands[:0], s.drainBacklog(now, budget, cands, out, cuts)
	}
	// A tombstone's counter is removed as soon as it is emitted, and the last counter
	// takes its place: candAt finds the candidate that moved, to follow it.
	moves := false
	for k, c := range cands {
		if c.zero && !moves {
			moves = true
			if s.candAt == nil {
				s.candAt = map[int32]int32{}
			}
			clear(s.candAt)
			for j := k + 1; j < len(cands); j++ {
				s.candAt[cands[j].pos] = int32(j)
			}
		}
		e := s.at(c.pos)
		if c.zero {
			out = append(out, emission{key: e.key, slot: e.slot})
			last := s.n - 1
			s.remove(c.pos)
			if j, ok := s.candAt[last]; ok && int(j) > k && last != c.pos {
				cands[j].pos = c.pos
				delete(s.candAt, last)
				s.candAt[c.pos] = j
			}
			continue
		}
		out = append(out, s.publish(e, now, cuts, c.total))
	}
	return cands, out
}

// unchanged reports whether e's count, total at now, is left unpublished, and if so marks
// it so. An unchanged count is not published again, except that a count older than half
// its window is refreshed: readers treat a count whose window has passed since its as-of
// time as gone (that is how a key no instance owns any more expires).
func (s *state) unchanged(e *entry, now int64, total float64) bool {
	if total == e.lastEmitted && e.status&statusEmitted != 0 && now-e.lastEmitAt < e.window()/2 {
		e.dirty = false
		e.nextEval = now + max(e.spec.Width, s.cfg.emitInterval)
		return true
	}
	return false
}

// publish returns e's count at now, whose total is total, and records it as published.
func (s *state) publish(e *entry, now int64, cuts cutTimes, total float64) emission {
	cnt := &topics.Count{Key: e.key, Window: e.window(), AsOf: now, SubBuckets: s.cfg.subBuckets}
	at := cuts.at(e.slot)
	if at == nil {
		at = countNow
	}
	cnt.Sites, cnt.Total = s.appendSitesAt(e, now, at)
	e.dirty = false
	e.status |= statusEmitted
	e.lastEmitted, e.lastEmitAt = total, now
	e.nextEval = now + max(e.spec.Width, s.cfg.emitInterval)
	return emission{key: e.key, slot: e.slot, count: cnt}
}

// drainBacklog ranks cands, the counters found due at now, into the backlog and appends
// to out the emissions of up to budget of the backlog's counters, the largest changes
// first. A counter that comes out is evaluated again at now: it may have reached zero or
// come back to its published count since it was ranked, and is then dealt with as
// collect's scan would have (forgotten, tombstoned, or passed over without using the
// budget); one whose slot is paused leaves the backlog and stays due, to be ranked again
// when the slot resumes.
func (s *state) drainBacklog(now int64, budget int, cands []candidate, out []emission, cuts cutTimes) []emission {
	for _, c := range cands {
		e := s.at(c.pos)
		e.status |= statusQueued
		s.backlog.push(waiting{key: e.key, window: e.window(), hash: keyHash(e.key), slot: e.slot, prio: c.prio})
	}
	for n := 0; n < budget && len(s.backlog) > 0; {
		w := s.backlog.pop()
		pos := s.lookup(w.hash, unsafe.Slice(unsafe.StringData(w.key), len(w.key)), w.window)
		if pos < 0 {
			continue
		}
		e := s.at(pos)
		if e.status&statusQueued == 0 {
			continue // not the counter that was ranked, or already out
		}
		e.status &^= statusQueued
		if s.paused[e.slot] {
			continue
		}
		at := cuts.at(e.slot)
		if at == nil {
			at = countNow
		}
		total, zero := s.sumAt(e, now, at)
		switch {
		case zero && e.status&statusEmitted == 0:
			s.remove(pos)
		case zero:
			out = append(out, emission{key: e.key, slot: e.slot})
			s.remove(pos)
			n++
		case s.unchanged(e, now, total):
		default:
			out = append(out, s.publish(e, now, cuts, total))
			n++
		}
	}
	return out
}
