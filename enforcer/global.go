package enforcer

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/topics"
)

// maxSites is how many sites a global decision considers without allocating.
const maxSites = 16

// siteView is one site as a global decision sees it.
type siteView struct {
	site   string
	count  float64 // its count in the snapshot
	demand float64 // its demand in the snapshot
	stale  bool    // not heard from within SiteStaleAfter
	hold   float64 // what it may hold: its count, or more for a silent site
	cap    float64 // the cap the decision gives it
	f      float64 // its share of the room (0 for a stale site)
}

// sharing is the global-share policy: how much of a global limit this site may hold, given
// the snapshot's view of every site. It is the whole of what makes a global limit global;
// see the package documentation ("Global limits") for the rule and why.
type sharing struct {
	site         string
	minShare     float64
	defaultShare float64       // 0: 1 / the number of sites known
	siteStale    time.Duration // Config.SiteStaleAfter
	damping      float64       // Config.ShareDamping
	prior        float64       // Config.DemandPrior
}

// capFor returns the most this site's own count of a global counter may reach (request
// included) under allowance, from the snapshot entry e (known: the snapshot has one) and the
// per-site freshness st, at now; newKey says that this site saw no count for the key within
// the last NewKeyHold. It also reports whether a site the entry or st lists was taken as
// stale.
func (g *sharing) capFor(now time.Time, key string, allowance float64, e *snapshot.Entry, known, newKey bool, st *snapshot.SiteTimes) (capLocal float64, anyStale bool, f float64) {
	var buf [maxSites]siteView
	sites := g.view(buf[:0], now, e, known, st)
	def := g.defaultShare
	if def <= 0 {
		def = 1 / float64(max(len(sites), 1))
	}
	for i := range sites {
		anyStale = anyStale || sites[i].stale
	}
	if !known {
		// A key the fresh snapshot does not show is new, or was idle for a whole window.
		// Every site sees it so until its first hits come back through the pipeline, and
		// would each admit the whole limit: spend only this site's default share until then,
		// rounded together with the other sites' (the salt is the second).
		var before float64
		u := unitHash(key, now.Unix())
		for i := range sites {
			c := allowance * def
			if sites[i].site == g.site {
				return math.Floor(before+c+u) - math.Floor(before+u), anyStale, 0
			}
			before += c
		}
	}
	if newKey {
		// The key has only just shown in the snapshot: the sites may still hold the default
		// shares they were allowed while it was unknown, which its first counts do not show
		// yet.
		for i := range sites {
			sites[i].count = max(sites[i].count, allowance*def)
		}
	}
	// Each site holds its count; a site not heard from within SiteStaleAfter may be
	// spending while its hits cannot reach us (a cut link), so it is assumed to hold at
	// least its default share of the limit, never less than its count in the snapshot.
	for i := range sites {
		s := &sites[i]
		s.hold = s.count
		if s.stale {
			s.hold = max(s.hold, allowance*def)
		}
	}
	g.allot(sites, allowance, unitHash(key, e.AsOf))
	i, _ := siteIndex(sites, g.site)
	return sites[i].cap, anyStale, sites[i].f
}

// allot sets every site's cap from its hold: the fresh sites share the room left by all
// holds (allowance − Σ hold, negative when the holds exceed the limit, and then every fresh
// site gives back its share of the excess) by demand — requests, admitted or denied,
// weighted by recency, so that a client's room goes where the client is now; without
// demand (counts of an older aggregator, or a key idle for long) by count; without either,
// evenly. Every fresh site gets at least minShare, so that one the snapshot does not show
// yet — where the client has just arrived — is not shut out for the pipeline's lag. A stale
// site's cap is its hold.
//
// The caps are rounded to whole requests together, by systematic sampling with the offset
// u, which every site draws alike from the key and the count's as-of time: site s gets
// floor(C_s + c_s + u) − floor(C_s + u), where C_s sums the caps of the fresh sites before
// it in name order. Each cap is rounded up with probability equal to its fraction (the room
// is spent in expectation), and the rounded caps add up to the rounded sum: rounding never
// admits more than the limit, as independent rounding of N caps could by up to N−1.
func (g *sharing) allot(sites []siteView, allowance, u float64) {
	room := allowance
	var wsum, csum float64
	n := 0
	for i := range sites {
		s := &sites[i]
		room -= s.hold
		if !s.stale {
			wsum += s.demand
			csum += s.count
			n++
		}
	}
	kappa := g.prior * allowance
	weight := func(s *siteView) float64 {
		switch {
		case wsum > 0:
			return (s.demand + kappa/float64(n)) / (wsum + kappa)
		case csum > 0:
			return s.count / csum
		}
		return 1 / float64(n)
	}
	var norm float64
	for i := range sites {
		if s := &sites[i]; !s.stale {
			norm += max(weight(s), g.minShare)
		}
	}
	var before float64
	for i := range sites {
		s := &sites[i]
		if s.stale {
			s.cap = s.hold
			continue
		}
		f := max(weight(s), g.minShare) / norm
		if room > 0 {
			f /= 1 + g.damping*(1-f)
		}
		s.f = f
		c := s.hold + f*room
		s.cap = math.Floor(before+c+u) - math.Floor(before+u)
		before += c
	}
}

// view lists the sites a decision considers, sorted by name: those of the entry's
// breakdown, those the site times list (alive, or silent but not forgotten), and this site,
// which is never stale to itself.
func (g *sharing) view(dst []siteView, now time.Time, e *snapshot.Entry, known bool, st *snapshot.SiteTimes) []siteView {
	var es []topics.SiteCount
	if known {
		es = e.Sites
	}
	ts := st.Sites()
	limit := now.UnixMilli() - g.siteStale.Milliseconds()
	for i, j := 0, 0; i < len(es) || j < len(ts); {
		switch {
		case j >= len(ts) || (i < len(es) && es[i].Site < ts[j].Site):
			dst = append(dst, siteView{site: es[i].Site, count: es[i].Count, demand: es[i].Demand})
			i++
		case i >= len(es) || ts[j].Site < es[i].Site:
			dst = append(dst, siteView{site: ts[j].Site, stale: ts[j].Heard < limit})
			j++
		default:
			dst = append(dst, siteView{site: es[i].Site, count: es[i].Count, demand: es[i].Demand, stale: ts[j].Heard < limit})
			i++
			j++
		}
	}
	if k, ok := siteIndex(dst, g.site); ok {
		dst[k].stale = false
	} else {
		dst = slices.Insert(dst, k, siteView{site: g.site})
	}
	return dst
}

// othersHeard returns the oldest time up to which a fresh remote site has been heard from:
// the other sites' counts in the snapshot are complete up to then. It reports false when
// no remote site is heard from.
func (g *sharing) othersHeard(now time.Time, st *snapshot.SiteTimes) (int64, bool) {
	limit := now.UnixMilli() - g.siteStale.Milliseconds()
	t0, ok := int64(0), false
	for _, s := range st.Sites() {
		if s.Site == g.site || s.Heard < limit {
			continue
		}
		if !ok || s.Heard < t0 {
			t0, ok = s.Heard, true
		}
	}
	return t0, ok
}

// staleBits returns which sites of st are stale at now (bit i for st.Sites()[i]), and
// false when there are too many sites for the bits.
func (g *sharing) staleBits(now time.Time, st *snapshot.SiteTimes) (uint64, bool) {
	sites := st.Sites()
	if len(sites) > 64 {
		return 0, false
	}
	limit := now.UnixMilli() - g.siteStale.Milliseconds()
	var bits uint64
	for i := range sites {
		if sites[i].Heard < limit && sites[i].Site != g.site {
			bits |= 1 << uint(i)
		}
	}
	return bits, true
}

// staleShare is this site's share of a global limit when the snapshot cannot be trusted
// at all (no aggregator heartbeat for MaxStaleness): its last known fraction of the key's
// count (at least MinShare), or DefaultShare (by default 1/number of sites) for a key never
// seen.
func (g *sharing) staleShare(e *snapshot.Entry, known bool, st *snapshot.SiteTimes) float64 {
	if known && e.Total > 0 {
		return max(e.Share(), g.minShare)
	}
	if g.defaultShare > 0 {
		return g.defaultShare
	}
	n := len(st.Sites())
	if _, ok := st.Heard(g.site); !ok {
		n++
	}
	return 1 / float64(max(n, 1))
}

// dither rounds a fractional cap up or down at random, up with probability equal to its
// fraction. Counts are whole, so a cap of 33.4 would otherwise admit 33. The randomness is
// a hash of the key and salt, so that simulations with a virtual clock stay reproducible
// and no shared random source is touched.
func dither(c float64, key string, salt int64) float64 {
	whole := math.Floor(c)
	frac := c - whole
	if frac == 0 {
		return c
	}
	if unitHash(key, salt) < frac {
		return whole + 1
	}
	return whole
}

// unitHash maps (key, salt) to [0, 1), the same on every site.
func unitHash(key string, salt int64) float64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * 1099511628211
	}
	h ^= uint64(salt)
	// splitmix64 finaliser
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return float64(h>>11) / (1 << 53)
}

// siteIndex returns the position of site in sites (sorted by name) and whether it is there.
func siteIndex(sites []siteView, site string) (int, bool) {
	return slices.BinarySearchFunc(sites, site, func(v siteView, s string) int { return strings.Compare(v.site, s) })
}
