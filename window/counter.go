package window

import (
	"math"
	"slices"
	"strings"

	"github.com/streamlimit/streamlimit/topics"
)

// Counter is the state of one (key, window) counter: one ring of buckets and one Decay per
// site, sorted by site. The zero Counter is empty. A Counter is not safe for concurrent use,
// and must always be used with the same Spec.
//
// Its memory follows the buckets its sites have hits in, so that a key hit once costs a
// few dozen bytes where a whole ring would cost 4 bytes × Slots. It is two allocations
// whatever the number of sites: the sites' headers (name, demand, newest bucket: 40 bytes
// each), and their buckets, side by side after one word per site that says how they are
// kept. A site keeps the buckets it has hits in as (bucket, count) pairs, 8 bytes each, in
// ascending order of bucket, with room for up to twice as many as it holds; past
// maxPairs, when a whole ring is no larger, it keeps a ring of Slots counts instead, as
// Ring does, until the Counter is forgotten. Both forms count alike: the same buckets with
// the same counts, added up the same way (TestCounterPairsAndRingsMatchModel,
// TestCounterMatchesReference, TestRingRunningSumMatchesBruteForce).
//
// Its rings keep no running sum (Ring.sum), so its counts add up each site's buckets: the
// sum would cost 8 bytes per (key, site) in the header (a size class more for three sites),
// or a memory access more per hit counted after the buckets.
type Counter struct {
	sites []siteState // sorted by site
	// c is, once a site is known, one word per site (its form: ringWord, or pairWord of
	// the pairs it holds and has room for), then each site's buckets in site order: a ring
	// of Slots counts, or room for that many pairs. Nil while no site is known.
	c []uint32
}

// siteState is one site's part of a Counter, beside its buckets in Counter.c.
type siteState struct {
	site   string
	demand Decay
	head   int64 // the newest bucket held (Ring.head)
}

// ringWord is the form word of a site whose buckets are a ring of Slots counts.
const ringWord = math.MaxUint32

// pairWord is the form word of a site holding n pairs in room for room pairs.
func pairWord(n, room int) uint32 { return uint32(n) | uint32(room)<<16 }

// A pair is two uint32s: the bucket's index modulo 2³² (its index i is head minus
// (uint32(head) − low) modulo 2³², since head − Slots < i ≤ head), then its count.

// maxPairs returns how many pairs a site keeps before a ring of Slots counts is as small
// (and at most what a form word can hold).
func maxPairs(s *Spec) int { return min(max(s.Slots/2, 1), 0x7fff) }

// form returns site k's form: ring, or the pairs it holds and has room for.
func (c *Counter) form(k int) (ring bool, n, room int) {
	w := c.c[k]
	if w == ringWord {
		return true, 0, 0
	}
	return false, int(w & 0xffff), int(w >> 16)
}

// words returns how many uint32s the buckets of a site of form word w take.
func words(s *Spec, w uint32) int {
	if w == ringWord {
		return s.Slots
	}
	return 2 * int(w>>16)
}

// start returns where site k's buckets start in c: after the form words, and the buckets
// of the sites before it.
func (c *Counter) start(s *Spec, k int) int {
	start := len(c.sites)
	for j := range k {
		start += words(s, c.c[j])
	}
	return start
}

// region returns site k's buckets, all of its room.
func (c *Counter) region(s *Spec, k int) []uint32 {
	start := c.start(s, k)
	end := start + words(s, c.c[k])
	return c.c[start:end:end]
}

// pairIndex returns the bucket index of a pair whose index modulo 2³² is low, for a site
// whose newest bucket is head.
func pairIndex(head int64, low uint32) int64 { return head - int64(uint32(head)-low) }

// parts returns site k's whole-bucket sum (buckets after i0) and the count of bucket i0,
// as Ring.parts does for a ring.
func (c *Counter) parts(s *Spec, k int, i0 int64) (whole, oldest uint64) {
	head := c.sites[k].head
	ring, n, _ := c.form(k)
	if ring {
		r := Ring{head: head, c: c.region(s, k), sum: noSum}
		return r.parts(s, i0)
	}
	if n == 0 || head < i0 {
		return 0, 0
	}
	p := c.region(s, k)[:2*n]
	// Pairs ascend by bucket: the newest are last, and the older ones stop at i0.
	for j := len(p) - 2; j >= 0; j -= 2 {
		i := pairIndex(head, p[j])
		switch {
		case i > i0:
			whole += uint64(p[j+1])
			continue
		case i == i0:
			oldest = uint64(p[j+1])
		}
		break
	}
	return whole, oldest
}

// Add counts n hits at site in the bucket holding bucketStart; nowMs is the aggregator's
// clock. See Ring.Add. The hits also add to the site's demand.
func (c *Counter) Add(s *Spec, nowMs int64, site string, bucketStart, n int64) bool {
	return c.AddDenied(s, nowMs, site, bucketStart, n, 0)
}

// AddDenied is Add for n admitted hits and denied refused requests: only n counts toward
// the window, n + denied toward the site's demand. It reports false, counting nothing,
// when n > 0 and the bucket is older than every bucket the ring holds.
func (c *Counter) AddDenied(s *Spec, nowMs int64, site string, bucketStart, n, denied int64) bool {
	i, ok := slices.BinarySearchFunc(c.sites, site, func(e siteState, t string) int { return strings.Compare(e.site, t) })
	if !ok {
		// A new site's first hits are its first pair (addPair), which it gets room for at
		// once rather than in a second allocation; demand alone takes no room.
		room := 0
		if n > 0 {
			room = 1
		}
		c.insert(s, i, site, room)
	}
	return c.add(s, i, nowMs, bucketStart, n, denied)
}

// insert makes room for site at position i, with room for room pairs and none held. Its
// sites' headers are an exactly sized slice; its buckets share c.c (open).
func (c *Counter) insert(s *Spec, i int, site string, room int) {
	n := len(c.sites)
	sites := make([]siteState, n+1)
	copy(sites, c.sites[:i])
	copy(sites[i+1:], c.sites[i:])
	sites[i] = siteState{site: site, head: math.MinInt64 / 2} // older than any bucket
	// The new site's form word goes in at i, its buckets (room for room pairs) where the
	// buckets of the site after it started: one more word along, for the form word.
	start := c.start(s, i) + 1
	c.reserve(1 + 2*room) // one allocation at most for both
	c.open(i, 1)
	c.c[i] = pairWord(0, room)
	c.open(start, 2*room)
	c.sites = sites
}

// resize makes site k's buckets size uint32s (keeping what fits of them) and its form word
// w, moving the buckets of the sites after it (open).
func (c *Counter) resize(s *Spec, k, size int, w uint32) {
	start := c.start(s, k)
	if old := words(s, c.c[k]); size >= old {
		c.open(start+old, size-old)
	} else {
		end := start + old
		c.c = slices.Delete(c.c, start+size, end)
	}
	c.c[k] = w
}

// open inserts n zeroed uint32s into c.c at position at, moving the words after them.
func (c *Counter) open(at, n int) {
	c.reserve(n)
	l := len(c.c)
	c.c = c.c[:l+n]
	copy(c.c[at+n:], c.c[at:l])
	clear(c.c[at : at+n])
}

// reserve makes c.c's capacity hold n more uint32s. A new slice's capacity is its whole
// allocation: the allocator rounds every request up to a size class, so that room costs
// nothing, and lets the next growth or two of a counter's buckets (a site's pairs doubling,
// a new site) happen in place.
func (c *Counter) reserve(n int) {
	if l := len(c.c); l+n > cap(c.c) {
		c.c = append(slices.Grow([]uint32(nil), l+n), c.c...)
	}
}

func (c *Counter) add(s *Spec, k int, nowMs, bucketStart, n, denied int64) bool {
	if n > 0 {
		if ring, _, _ := c.form(k); ring {
			r := Ring{head: c.sites[k].head, c: c.region(s, k), sum: noSum}
			if !r.Add(s, s.Bucket(nowMs), s.Bucket(bucketStart), n) {
				return false
			}
			c.sites[k].head = r.head
		} else if !c.addPair(s, k, s.Bucket(nowMs), s.Bucket(bucketStart), n) {
			return false
		}
	}
	c.sites[k].demand.Add(bucketStart, n+denied, s.tau())
	return true
}

// addPair is Ring.Add (n > 0) for site k while it keeps pairs.
func (c *Counter) addPair(s *Spec, k int, now, idx, n int64) bool {
	if lim := now + s.Ahead; idx > lim {
		idx = lim
	}
	L := int64(s.Slots)
	st := &c.sites[k]
	_, np, room := c.form(k)
	switch {
	case idx > st.head:
		// The buckets at or before idx − L leave the ring: drop their pairs, the oldest.
		p := c.region(s, k)[:2*np]
		gone := 0
		for gone < len(p) && pairIndex(st.head, p[gone]) <= idx-L {
			gone += 2
		}
		if gone > 0 {
			copy(p, p[gone:])
			np -= gone / 2
			c.c[k] = pairWord(np, room)
		}
		st.head = idx
	case idx <= st.head-L:
		return false
	}
	p := c.region(s, k)[:2*np]
	// Find idx's pair, or the place of a new one, from the newest.
	j := len(p)
	for j > 0 && pairIndex(st.head, p[j-2]) > idx {
		j -= 2
	}
	if j > 0 && pairIndex(st.head, p[j-2]) == idx {
		p[j-1] = satAdd32(p[j-1], n)
		return true
	}
	if np == maxPairs(s) {
		c.toRing(s, k)
		r := Ring{head: st.head, c: c.region(s, k), sum: noSum}
		ok := r.Add(s, now, idx, n)
		st.head = r.head
		return ok
	}
	if np == room {
		room = min(max(2*np, 1), maxPairs(s))
		c.resize(s, k, 2*room, pairWord(np, room))
	}
	np++
	c.c[k] = pairWord(np, room)
	p = c.region(s, k)[:2*np]
	copy(p[j+2:], p[j:len(p)-2])
	p[j], p[j+1] = uint32(idx), satAdd32(0, n)
	return true
}

// toRing turns site k's pairs into a ring of Slots counts.
func (c *Counter) toRing(s *Spec, k int) {
	_, np, _ := c.form(k)
	pairs := slices.Clone(c.region(s, k)[:2*np])
	c.resize(s, k, s.Slots, ringWord)
	ring := c.region(s, k)
	clear(ring)
	head, L := c.sites[k].head, int64(s.Slots)
	for j := 0; j < len(pairs); j += 2 {
		ring[mod(pairIndex(head, pairs[j]), L)] = pairs[j+1]
	}
}

// satAdd32 returns c + n (n > 0), saturating at math.MaxUint32 as Ring.Add does.
func satAdd32(c uint32, n int64) uint32 {
	if v := uint64(c) + uint64(n); v > math.MaxUint32 || n > math.MaxUint32 {
		return math.MaxUint32
	}
	return c + uint32(n)
}

// AddSite is AddDenied for a site given as bytes, as decoded from a record: it does not
// allocate unless the site is new to the counter or its buckets need more room, and then
// stores intern(site).
func (c *Counter) AddSite(s *Spec, nowMs int64, site []byte, intern func([]byte) string, bucketStart, n, denied int64) bool {
	for k := range c.sites {
		if c.sites[k].site == string(site) {
			return c.add(s, k, nowMs, bucketStart, n, denied)
		}
	}
	return c.AddDenied(s, nowMs, intern(site), bucketStart, n, denied)
}

// Sites returns the number of sites the counter has seen.
func (c *Counter) Sites() int { return len(c.sites) }

// Total returns the count over all sites at instant t and whether it is zero. Zero means
// no hit lies in the window's oldest bucket or later, so the counter stays zero until it
// gets a new hit.
func (c *Counter) Total(s *Spec, t int64) (float64, bool) {
	i0, frac := s.Oldest(t)
	var whole, oldest uint64
	for k := range c.sites {
		w, o := c.parts(s, k, i0)
		whole += w
		oldest += o
	}
	return combine(whole, oldest, frac), whole == 0 && oldest == 0
}

// AppendSites appends the per-site counts at instant t to dst, sorted by site, leaving out
// sites whose count is zero, and returns dst and the total over all sites (computed from
// the bucket sums, so that it equals Total).
func (c *Counter) AppendSites(dst []topics.SiteCount, s *Spec, t int64) ([]topics.SiteCount, float64) {
	i0, frac := s.Oldest(t)
	var whole, oldest uint64
	for k := range c.sites {
		w, o := c.parts(s, k, i0)
		if w == 0 && o == 0 {
			continue
		}
		whole += w
		oldest += o
		dst = append(dst, topics.SiteCount{Site: c.sites[k].site, Count: combine(w, o, frac), Demand: c.sites[k].demand.At(t, s.tau())})
	}
	return dst, combine(whole, oldest, frac)
}

// AppendSitesAt is AppendSites with each site counted at its own instant: at(site) when it
// reports true and is before t (but never before the end of the site's newest bucket), else
// t. The aggregator counts a site whose hits have stopped
// arriving as of the last time it heard from it, so that its hits do not seem to leave the
// window while its newer ones cannot be seen; its demand is taken at the same instant, so
// that its share of a hot key's room does not fade while it cannot be heard. A site is
// listed when its count is not zero or its demand is at least DemandFloor, so that a site
// whose requests were all denied still shows its demand. It returns dst, the total and whether no site was
// listed (the counter has nothing left to say and can be forgotten).
func (c *Counter) AppendSitesAt(dst []topics.SiteCount, s *Spec, t int64, at func(site string) (int64, bool)) ([]topics.SiteCount, float64, bool) {
	var total float64
	zero := true
	for k := range c.sites {
		v, d, ok := c.siteAt(s, k, t, at)
		if !ok {
			continue
		}
		zero = false
		total += v
		dst = append(dst, topics.SiteCount{Site: c.sites[k].site, Count: v, Demand: d})
	}
	return dst, total, zero
}

// SumAt returns the total and emptiness of AppendSitesAt without building the breakdown.
func (c *Counter) SumAt(s *Spec, t int64, at func(site string) (int64, bool)) (float64, bool) {
	var total float64
	zero := true
	for k := range c.sites {
		v, _, ok := c.siteAt(s, k, t, at)
		if ok {
			zero = false
			total += v
		}
	}
	return total, zero
}

// DemandFloor is the demand below which a site with no hits in the window is left out of a
// counter's breakdown: a hundredth of one request.
const DemandFloor = 0.01

func (c *Counter) siteAt(s *Spec, k int, t int64, at func(site string) (int64, bool)) (count, demand float64, listed bool) {
	sr := &c.sites[k]
	ts := t
	if a, ok := at(sr.site); ok && a < t {
		// Never before the end of its newest bucket: the hits it made after its last
		// heartbeat that did arrive still count.
		ts = min(t, max(a, (sr.head+1)*s.Width-1))
	}
	i0, frac := s.Oldest(ts)
	w, o := c.parts(s, k, i0)
	demand = sr.demand.At(ts, s.tau())
	if w == 0 && o == 0 && demand < DemandFloor {
		return 0, 0, false
	}
	return combine(w, o, frac), demand, true
}
