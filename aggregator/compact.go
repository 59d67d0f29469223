package aggregator

import (
	"math"

	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// A counter is compact while all it has counted is one record: most keys of a large key
// space are hit once or twice in a window, and a window.Counter (its header, a site's
// header, the site's buckets: three allocations, about 110 bytes) would cost more than the
// entry that holds it. A compact counter keeps the record in its entry (start, hits,
// demand, site) and counts it exactly as a window.Counter holding that one record would:
// sumAt and appendSitesAt follow window.Counter's SumAt and AppendSitesAt for one site
// with one bucket, and materialize gives the counter its window.Counter by adding the same
// record to an empty one, before the second record is added to it. TestCompactCountsLikeCounter
// compares the two on random records, times and cut sites.

// compactAdd keeps h as e's one record, reporting false when it cannot be kept so (hits or
// demand beyond 32 bits, a bucket past the ring's furthest, which the ring would move, or
// a site that cannot be interned); e is then counted by a window.Counter.
func (s *state) compactAdd(e *entry, now int64, h *hitRef) bool {
	if h.count < 0 || h.denied < 0 || h.count > math.MaxUint32 || h.denied > math.MaxUint32-h.count {
		return false
	}
	if sp := e.spec; h.count > 0 && sp.Bucket(h.bucketStart) > sp.Bucket(now)+sp.Ahead {
		return false
	}
	_, id, ok := s.internID(h.site)
	if !ok {
		return false
	}
	e.start, e.hits, e.demand, e.site = h.bucketStart, uint32(h.count), uint32(h.count+h.denied), id
	return true
}

// materialize gives the compact counter e its window.Counter, holding its one record: the
// record added at its own bucket start, where the ring keeps its bucket as it did when the
// record came (compactAdd kept only records whose bucket the ring did not move).
func (s *state) materialize(e *entry) {
	c := new(window.Counter)
	c.AddDenied(e.spec, e.start, s.names[e.site], e.start, int64(e.hits), int64(e.demand-e.hits))
	e.full = c
}

// compactSiteAt is window.Counter's count of its one site at t, for the compact counter e:
// its count, its demand and whether it is listed.
func (s *state) compactSiteAt(e *entry, t int64, at func(site string) (int64, bool)) (count, demand float64, listed bool) {
	sp := e.spec
	// The site's newest bucket: the record's, or, without hits, older than any bucket.
	head := int64(math.MinInt64 / 2)
	if e.hits > 0 {
		head = sp.Bucket(e.start)
	}
	ts := t
	if a, ok := at(s.names[e.site]); ok && a < t {
		ts = min(t, max(a, (head+1)*sp.Width-1))
	}
	i0, frac := sp.Oldest(ts)
	var whole, oldest uint64
	switch {
	case e.hits == 0 || head < i0:
	case head > i0:
		whole = uint64(e.hits)
	default:
		oldest = uint64(e.hits)
	}
	tau := sp.Tau
	if tau <= 0 {
		tau = sp.Width
	}
	var d window.Decay
	d.Add(e.start, int64(e.demand), tau)
	demand = d.At(ts, tau)
	if whole == 0 && oldest == 0 && demand < window.DemandFloor {
		return 0, 0, false
	}
	return float64(whole) + float64(oldest)*frac, demand, true
}

// sumAt is window.Counter.SumAt for e, compact or not.
func (s *state) sumAt(e *entry, t int64, at func(site string) (int64, bool)) (float64, bool) {
	s.evals++
	if e.full != nil {
		return e.full.SumAt(e.spec, t, at)
	}
	var total float64
	v, _, ok := s.compactSiteAt(e, t, at)
	if ok {
		total += v
	}
	return total, !ok
}

// appendSitesAt returns window.Counter.AppendSitesAt's sites and total for e, compact or
// not, in a new slice.
func (s *state) appendSitesAt(e *entry, t int64, at func(site string) (int64, bool)) ([]topics.SiteCount, float64) {
	s.evals++
	if e.full != nil {
		sites, total, _ := e.full.AppendSitesAt(make([]topics.SiteCount, 0, e.full.Sites()), e.spec, t, at)
		return sites, total
	}
	sites := make([]topics.SiteCount, 0, 1)
	var total float64
	if v, d, ok := s.compactSiteAt(e, t, at); ok {
		total += v
		sites = append(sites, topics.SiteCount{Site: s.names[e.site], Count: v, Demand: d})
	}
	return sites, total
}
