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
const maxSites = 32

// servedSpan is how long after the latest count that lists a site (snapshot.SiteTime.Served)
// the site still counts among those a global limit is split over, when this site has
// served too (sharing.idle). A heartbeat proves only that someone writes the hits topic
// in a site's name: a name that never served anything in the span is given no share of
// anything, so heartbeats of made-up sites cost nothing. Two sites that serve traffic
// both count, so a key new at both at once is still split between them. Long: what it
// costs is a real site idle that long, which is given nothing of a key new to it until
// its first hits are counted (docs/sites.md, "How a site is known").
const servedSpan = snapshot.ServedSpan

// siteState is what a global decision takes a site to be doing.
type siteState uint8

const (
	// siteFresh: heard from within SiteStaleAfter (or never announced by heartbeats at
	// all, as a producer that sends none): it shares the room by demand.
	siteFresh siteState = iota
	// siteCut: silent, and so is every other site heard on its sources — its data center
	// is cut off from here, or down. It may be admitting what it was given before the
	// silence, so it is reserved its share of each key it served, for as long as it stays
	// silent, and a default share of keys new since.
	siteCut
	// siteCrashed: silent while other sites of its sources still speak — it stopped on its
	// own, most likely without the chance to leave. It is reserved its share of the keys it
	// served for a while (Config.CrashHold, fading), and nothing of keys it never saw.
	siteCrashed
	// siteLeft: stopped cleanly (a leave record on every partition). It admits nothing
	// more: its hits still in the window count, and nothing is reserved beyond them.
	siteLeft
)

// siteView is one site as a global decision sees it.
type siteView struct {
	site   string
	count  float64 // its count in the snapshot
	demand float64 // its demand in the snapshot
	state  siteState
	silent int64   // for a silent site, ms since it was last heard from
	hold   float64 // what it may hold: its count, or more for a silent site
	cap    float64 // the cap the decision gives it
	f      float64 // its share of the room (0 unless fresh)
	topic  string  // the hits topic it is heard on ("" when no heartbeat lists it)
	group  uint8   // its data center's number: sites of one topic share one (view)
	// unseen is set on this site when the snapshot's heartbeats list it as not fresh (left,
	// or silent): it has just started again under its name (or its heartbeats do not get
	// through), and the other sites, which read the same heartbeats, do not count it yet
	// (sharing.allot). Also when no count has shown it serving within servedSpan while
	// another fresh site of its data center has settled serving (sharing.settled): that
	// one does not count it yet (idle).
	unseen bool
	// idle is set on another site, fresh or cut, that no count has shown serving within
	// servedSpan (and this key's breakdown does not list), while this site has served: it
	// may be a name no site serves. It is given no share, as a site that left: it holds
	// its count (nothing, unless it served this key).
	idle bool
}

// spends reports whether a site may start spending a key it has no count of: a fresh site,
// or one cut off from here, that is not idle.
func (v *siteView) spends() bool { return (v.state == siteFresh || v.state == siteCut) && !v.idle }

// shares reports whether a site shares the room: fresh and not idle.
func (v *siteView) shares() bool { return v.state == siteFresh && !v.idle }

// allotment is what a global decision gives this site of a key, before the corrections made
// on every decision with this site's own count (Engine.finalCap). It is cached per key
// (capCache): kept small.
type allotment struct {
	// base is the cap by the shares, which add up to the room.
	base float64
	// top is this site's hold plus the whole room left by all holds: the most the room
	// ahead may give (when ahead: the room is positive).
	top float64
	// dcTop is this site's hold plus its data center's share of the room: the most the
	// room ahead gives a Reporter's quota (Engine.finalCap).
	dcTop float64
	// rate is the demand rate for the key of the other fresh sites of this site's data
	// center (requests per ms).
	rate float64
	// remote is the demand rate for the key of the fresh sites of the other data centers
	// (requests per ms).
	remote float64
	// peerShares is the part of the room the shares give the other fresh sites of this
	// site's data center: the most the room ahead keeps back for them, as top − dcTop is
	// for the other data centers.
	peerShares float64
	// others is the part of the room given to the sites of other data centers, which see
	// this site a replication late.
	others float64
	// serving is how many of the fresh sites of other data centers are taken to be
	// serving the key now (sharing.serving): each that counts a request of the key in the
	// window weighs up to 1, by its recent rate against this site's.
	serving float32
	// peers is the number of the other fresh sites of this site's data center (at most
	// 255).
	peers uint8
	// reserved reports that the caps keep room for a silent site; ahead that there is
	// room to spend ahead; heavy that the key is in demand beyond its limit (its demand
	// rate over its limit's above heavyLoad).
	reserved, ahead, heavy bool
}

// sharing is the global-share policy: how much of a global limit this site may hold, given
// the snapshot's view of every site. It is the whole of what makes a global limit global;
// see docs/decisions.md ("Global limits") for the rule and why.
type sharing struct {
	site         string
	minShare     float64
	defaultShare float64       // 0: 1 / the number of sites that may spend
	siteStale    time.Duration // Config.SiteStaleAfter
	crashHold    time.Duration // Config.CrashHold
	damping      float64       // Config.ShareDamping
	prior        float64       // Config.DemandPrior
	servingSpan  int64         // Config.ServingSpan, ms (0: off)
}

// classify returns the state of the site st at now (unix ms) and, when silent, how long it
// has been.
func (g *sharing) classify(now int64, st *snapshot.SiteTime) (siteState, int64) {
	limit := now - g.siteStale.Milliseconds()
	switch {
	case st.Left:
		return siteLeft, 0
	case st.Heard >= limit || st.Site == g.site:
		return siteFresh, 0
	case st.Peer >= limit:
		return siteCrashed, now - st.Heard
	}
	return siteCut, now - st.Heard
}

// served reports whether a count has shown st's site serving within servedSpan of now (unix
// ms).
func (g *sharing) served(now int64, st *snapshot.SiteTime) bool {
	return servedAt(now, st.Served)
}

// servedAt reports whether a count as of at (unix ms; 0: none) shows serving at now.
func servedAt(now, at int64) bool { return at > 0 && at >= now-servedSpan.Milliseconds() }

// selfServed reports whether a count has shown this site serving within servedSpan of now
// (unix ms), as the other sites, reading the same counts, see it, and since SiteStaleAfter
// at least. Until then it counts every live site in its splits, as they all may count it
// (sharing.view). The wait is for the sites that started serving when this one did: the
// counts show each a pipeline lag after its first hits, the lags differ by as much, and a
// site shown serving a moment before another would otherwise take the other as idle and
// spend its share of a key they both just started. SiteStaleAfter is the lag past which a
// site is taken for silent.
func (g *sharing) selfServed(now int64, st *snapshot.SiteTimes) bool {
	self, ok := st.Get(g.site)
	return ok && g.settled(now, &self)
}

// settled reports whether st's site is shown serving at now (unix ms), and has been for
// SiteStaleAfter: it takes the sites not shown serving as idle (selfServed).
func (g *sharing) settled(now int64, st *snapshot.SiteTime) bool {
	return g.served(now, st) && now-st.ServedSince >= g.siteStale.Milliseconds()
}

// unseen reports whether st, this site's own site time, is one the other sites take for
// not fresh at now (unix ms): it left, or has not been heard from within SiteStaleAfter.
// This site is always fresh to itself; the others, reading the same heartbeats, are not
// yet counting it.
func (g *sharing) unseen(now int64, st *snapshot.SiteTime) bool {
	return st.Left || st.Heard < now-g.siteStale.Milliseconds()
}

// capFor returns the most this site's own count of a global counter may reach (request
// included) under allowance, from the snapshot entry e (known: the snapshot has one) and the
// per-site freshness st, at now; newKey says that this site saw no count for the key within
// the last NewKeyHold. frozen is the key's per-site breakdown from before any site went
// silent, seen at frozenAt (unix ms; nil when unknown), by which silent sites are reserved
// their shares; it is used for a site only if seen within a window of its silence. The
// allotment also tells whether the cap reserves room for a silent site, and what
// Engine.finalCap needs: the room, the demands, the key's load.
func (g *sharing) capFor(now time.Time, key string, allowance float64, e *snapshot.Entry, known, newKey bool, st *snapshot.SiteTimes, frozen []topics.SiteCount, frozenAt int64, past *pastDemand) allotment {
	var reserved bool
	var buf [maxSites]siteView
	sites := g.view(buf[:0], now, e, known, st)
	def := g.defaultShare
	if def <= 0 {
		n := 0
		for i := range sites {
			if sites[i].spends() {
				n++
			}
		}
		def = 1 / float64(max(n, 1))
	}
	if !known {
		// A key the fresh snapshot does not show is new, or was idle for a whole window.
		// Every site that may spend sees it so until its first hits come back through the
		// pipeline, and would each admit the whole limit: spend only this site's default
		// share until then, rounded together with the other sites' (the salt is the
		// second). A site cut off from here may be doing the same on its side.
		var before float64
		u := unitHash(key, now.Unix())
		for i := range sites {
			if !sites[i].spends() {
				continue
			}
			reserved = reserved || sites[i].state == siteCut
			c := allowance * def
			if sites[i].site == g.site {
				c = math.Floor(before+c+u) - math.Floor(before+u)
				return allotment{base: c, top: c, reserved: reserved}
			}
			before += c
		}
	}
	if newKey {
		// The key has only just shown in the snapshot: the sites may still hold the default
		// shares they were allowed while it was unknown, which its first counts do not show
		// yet.
		for i := range sites {
			if sites[i].spends() {
				sites[i].count = max(sites[i].count, allowance*def)
			}
		}
	}
	// Each site holds its count; a silent site may be admitting while its hits cannot reach
	// us, so it is assumed to hold at least its share of the key as it was before the
	// silence (frozen; else as the snapshot shows it now), of the whole limit.
	ms := now.UnixMilli()
	for i := range sites {
		s := &sites[i]
		s.hold = s.count
		fz := frozen
		if fz != nil && ms-s.silent-frozenAt > e.Window.Milliseconds() {
			fz = nil // seen too long before the silence to describe the window it left
		}
		var r float64
		switch s.state {
		case siteCut:
			r = shareOf(s.site, fz, e)
		case siteCrashed:
			if fade := 1 - float64(s.silent-g.siteStale.Milliseconds())/float64(max(g.crashHold.Milliseconds(), 1)); fade > 0 {
				r = shareOf(s.site, fz, e) * fade
			}
		}
		if r > 0 && allowance*r > s.hold {
			s.hold, reserved = allowance*r, true
		}
	}
	var demand float64
	for i := range sites {
		if sites[i].shares() {
			demand += sites[i].demand
		}
	}
	var heavy bool
	if w := e.Window.Milliseconds(); allowance > 0 && w > 0 {
		heavy = demand/demandTau/(allowance/float64(w)) > heavyLoad
	}
	ref, dt := past.at(e.AsOf)
	long, ldt := past.atLong(e.AsOf)
	a := g.allot(sites, allowance, unitHash(key, e.AsOf), heavy, ref, dt, long, ldt)
	a.heavy, a.reserved = heavy, reserved
	return a
}

// shareOf returns site's share of a key: its part of the count in the breakdown frozen
// before the silence, else in e's; by demand when the breakdown counts nothing. 0 when
// the site has none.
func shareOf(site string, frozen []topics.SiteCount, e *snapshot.Entry) float64 {
	sc := frozen
	if sc == nil {
		sc = e.Sites
	}
	var mine, total, dMine, dTotal float64
	for i := range sc {
		total += sc[i].Count
		dTotal += sc[i].Demand
		if sc[i].Site == site {
			mine, dMine = sc[i].Count, sc[i].Demand
		}
	}
	switch {
	case total > 0:
		return mine / total
	case dTotal > 0:
		return dMine / dTotal
	}
	return 0
}

// allot sets every site's cap from its hold: the fresh sites share the room left by all
// holds (allowance − Σ hold, negative when the holds exceed the limit, and then every fresh
// site gives back its share of the excess). The room is shared among data centers (the
// fresh sites of one hits topic; a site no heartbeat lists is one of its own) by demand —
// requests, admitted or denied, weighted by recency, so that a client's room goes where the
// client is now; without demand (counts of an older aggregator, or a key idle for long) by
// count; without either, evenly — and each data center's share evenly among its fresh
// sites. Sharing by data center keeps the prior, minShare and damping per data center, not
// per process: a data center of many processes would otherwise get as many minimum shares
// and fragments of the prior, and each process's share of a quiet key would follow the
// chance of which process its last few requests reached. Every fresh data center gets at
// least minShare, so that one the snapshot does not show yet — where the client has just
// arrived — is not shut out for the pipeline's lag. The cap of a site that is not fresh is
// its hold; so is this site's, for a key in demand beyond its limit (heavy), while the
// other fresh sites of its data center do not count it yet (siteView.unseen).
//
// The caps are rounded to whole requests together, by systematic sampling with the offset
// u, which every site draws alike from the key and the count's as-of time: site s gets
// floor(C_s + c_s + u) − floor(C_s + u), where C_s sums the caps of the fresh sites before
// it in name order. Each cap is rounded up with probability equal to its fraction (the room
// is spent in expectation), and the rounded caps add up to the rounded sum: rounding never
// admits more than the limit, as independent rounding of N caps could by up to N−1.
func (g *sharing) allot(sites []siteView, allowance, u float64, heavy bool, past []topics.SiteCount, dt float64, long []topics.SiteCount, ldt float64) (a allotment) {
	room := allowance
	// The fresh sites' data centers: demand, count and fresh sites of each.
	var gd, gc [maxSites]float64
	var gn [maxSites]int
	var wsum, csum float64
	me, _ := siteIndex(sites, g.site)
	// This site waits, for a key in demand beyond its limit (heavy), while the other fresh
	// sites of its data center do not count it (unseen: it has just started again under
	// its name): they share the data center's share of the room among themselves, and it
	// would spend its part on top of theirs. Until its heartbeats reach them it is given
	// what they take it to hold, its count. A key under its limit is not held back: its
	// demand within one lag is what the room ahead already risks.
	waits := false
	if heavy && sites[me].unseen {
		for i := range sites {
			if i != me && sites[i].shares() && sites[i].group == sites[me].group {
				waits = true
				break
			}
		}
	}
	fresh := func(i int) bool { return sites[i].shares() && !(waits && i == me) }
	groups := 0
	for i := range sites {
		s := &sites[i]
		room -= s.hold
		if fresh(i) {
			k := s.group
			if gn[k] == 0 {
				groups++
			}
			gd[k] += s.demand
			gc[k] += s.count
			gn[k]++
			wsum += s.demand
			csum += s.count
		}
	}
	kappa := g.prior * allowance
	weight := func(k uint8) float64 {
		switch {
		case wsum > 0:
			return (gd[k] + kappa/float64(groups)) / (wsum + kappa)
		case csum > 0:
			return gc[k] / csum
		}
		return 1 / float64(groups)
	}
	var norm float64
	for k := range gn {
		if gn[k] > 0 {
			norm += max(weight(uint8(k)), g.minShare)
		}
	}
	share := func(k uint8) float64 {
		f := max(weight(k), g.minShare) / norm
		if room > 0 {
			f /= 1 + g.damping*(1-f)
		}
		return f
	}
	a.ahead = room > 0
	a.others = max(1-share(sites[me].group), 0)
	mine := recentRate(g.site, sites[me].demand, long, ldt)
	var before float64
	for i := range sites {
		s := &sites[i]
		if !fresh(i) {
			s.cap = s.hold
			if i == me {
				a.base, a.top, a.dcTop = s.hold, s.hold, s.hold
			}
			continue
		}
		// The sites of one data center split its share evenly: behind one load balancer
		// they see a client's requests alike, and their demands differ mostly by chance.
		f := share(s.group) / float64(gn[s.group])
		s.f = f
		c := s.hold + f*room
		s.cap = math.Floor(before+c+u) - math.Floor(before+u)
		if i == me {
			// The room ahead (Engine.finalCap): the whole room, less what the other fresh
			// sites may spend before this site's hits reach them, at most their shares.
			a.base, a.top, a.dcTop = s.cap, s.hold+max(room, 0), s.hold+share(s.group)*room
			a.peers = uint8(min(gn[s.group]-1, 255))
			a.peerShares = f * float64(gn[s.group]-1) * room
		} else if room > 0 {
			if r := recentRate(s.site, s.demand, past, dt); s.group != sites[me].group {
				a.remote += r
				if s.count >= 1 {
					a.serving += float32(g.serving(recentRate(s.site, s.demand, long, ldt), mine, long != nil))
				}
			} else {
				a.rate += r
			}
		}
		before += c
	}
	return a
}

// view lists the sites a decision considers, sorted by name: those of the entry's
// breakdown, those the site times list (alive, silent but not forgotten, or left), and this
// site, which is always fresh to itself.
func (g *sharing) view(dst []siteView, now time.Time, e *snapshot.Entry, known bool, st *snapshot.SiteTimes) []siteView {
	var es []topics.SiteCount
	if known {
		es = e.Sites
	}
	ts := st.Sites()
	ms := now.UnixMilli()
	// Sites that have not served are idle to a site that has; a site that has not served
	// either (it has just started, or been idle as long) counts them all, as they may all
	// count it.
	selfServed := g.selfServed(ms, st)
	for i, j := 0, 0; i < len(es) || j < len(ts); {
		switch {
		case j >= len(ts) || (i < len(es) && es[i].Site < ts[j].Site):
			dst = append(dst, siteView{site: es[i].Site, count: es[i].Count, demand: es[i].Demand})
			i++
		case i >= len(es) || ts[j].Site < es[i].Site:
			v := siteView{site: ts[j].Site, topic: ts[j].Topic}
			v.state, v.silent = g.classify(ms, &ts[j])
			v.idle = g.idle(ms, &ts[j], selfServed)
			dst = append(dst, v)
			j++
		default:
			v := siteView{site: es[i].Site, count: es[i].Count, demand: es[i].Demand, topic: ts[j].Topic}
			v.state, v.silent = g.classify(ms, &ts[j])
			dst = append(dst, v)
			i++
			j++
		}
	}
	if k, ok := siteIndex(dst, g.site); ok {
		dst[k].state, dst[k].silent, dst[k].idle = siteFresh, 0, false
		if self, ok := st.Get(g.site); ok && dst[k].topic != "" {
			dst[k].unseen = g.unseen(ms, &self) || (!g.served(ms, &self) && g.servedPeer(ms, ts, dst[k].topic))
		}
	} else {
		dst = slices.Insert(dst, k, siteView{site: g.site})
	}
	// Data centers (allot): the sites of one topic share a number, in order of their first
	// site; past maxSites−1 numbers, the rest share the last.
	groups := uint8(0)
	for i := range dst {
		dst[i].group = groups
		if dst[i].topic != "" {
			for j := range i {
				if dst[j].topic == dst[i].topic {
					dst[i].group = dst[j].group
					break
				}
			}
		}
		if dst[i].group == groups && groups < maxSites-1 {
			groups++
		}
	}
	return dst
}

// servedPeer reports whether a site of topic other than this one, fresh at now (unix ms),
// has settled serving: it takes this site, until a count shows it serving, as idle.
func (g *sharing) servedPeer(now int64, ts []snapshot.SiteTime, topic string) bool {
	for i := range ts {
		if ts[i].Site != g.site && ts[i].Topic == topic && g.settled(now, &ts[i]) {
			if state, _ := g.classify(now, &ts[i]); state == siteFresh {
				return true
			}
		}
	}
	return false
}

// idle reports whether s, a site other than this one, is one a decision at now (unix ms)
// gives no share to (siteView.idle) when this key's breakdown does not list it:
// selfServed is g.selfServed. A site of a data center none of whose sites has served is
// not idle: heartbeats cannot make up a data center (its hits topic is the deployment's),
// and one that has not served yet (all its clients elsewhere) keeps its share, the
// margin the others had before it served.
func (g *sharing) idle(now int64, s *snapshot.SiteTime, selfServed bool) bool {
	return selfServed && s.Site != g.site && !g.served(now, s) && (s.Topic == "" || servedAt(now, s.TopicServed))
}

// othersHeard returns the oldest time up to which a fresh remote site — one of another data
// center: not heard on this site's hits topic — has been heard from: the other data
// centers' counts in the snapshot are complete up to then. It reports false when no remote
// site is heard from. The sites of this data center are not waited for: their hits reach
// this site's aggregator as soon as this site's do.
func (g *sharing) othersHeard(now time.Time, st *snapshot.SiteTimes) (int64, bool) {
	ms := now.UnixMilli()
	limit := ms - g.siteStale.Milliseconds()
	t0, ok := int64(0), false
	mine, _ := st.Get(g.site)
	selfServed := g.selfServed(ms, st)
	for _, s := range st.Sites() {
		if s.Site == g.site || s.Left || s.Heard < limit || (mine.Topic != "" && s.Topic == mine.Topic) || g.idle(ms, &s, selfServed) {
			continue
		}
		if !ok || s.Heard < t0 {
			t0, ok = s.Heard, true
		}
	}
	return t0, ok
}

// stateSig returns the states of st's sites at now, two bits per site (Sites()[i] at bits
// 2i), for the cap cache, and whether no site is silent in a way that reserves room (cut,
// or crashed within CrashHold). cacheable is false when the cap may change without the
// signature changing: too many sites for the bits, a crashed site whose reservation is
// fading, or a site shown serving that has not settled (sharing.settled).
func (g *sharing) stateSig(now time.Time, st *snapshot.SiteTimes) (sig uint64, allFresh, cacheable bool) {
	sites := st.Sites()
	ms := now.UnixMilli()
	allFresh, cacheable = true, len(sites) <= 32
	selfServed := g.selfServed(ms, st)
	for i := range sites {
		state, silent := g.classify(ms, &sites[i])
		sigState := state
		switch {
		case sites[i].Site == g.site && (g.unseen(ms, &sites[i]) || !selfServed):
			sigState = siteCrashed // not counted by the others yet (sharing.allot)
		case (state == siteFresh || state == siteCut) && g.idle(ms, &sites[i], selfServed):
			sigState = siteLeft // given no share (siteView.idle)
		}
		if g.served(ms, &sites[i]) && !g.settled(ms, &sites[i]) {
			cacheable = false // it settles with time alone (sharing.servedPeer)
		}
		switch state {
		case siteCut:
			allFresh = false
		case siteCrashed:
			if silent < g.siteStale.Milliseconds()+g.crashHold.Milliseconds() {
				allFresh, cacheable = false, false
			}
		}
		if i < 32 {
			sig |= uint64(sigState) << (2 * uint(i))
		}
	}
	return sig, allFresh, cacheable
}

// staleShare is this site's share of a global limit when the snapshot cannot be trusted
// at all (no aggregator heartbeat for MaxStaleness): its last known fraction of the key's
// count (at least MinShare), or DefaultShare (by default 1/the number of sites that may
// spend, as of the last heartbeats) for a key never seen.
func (g *sharing) staleShare(e *snapshot.Entry, known bool, st *snapshot.SiteTimes) float64 {
	if known && e.Total > 0 {
		return max(e.Share(), g.minShare)
	}
	if g.defaultShare > 0 {
		return g.defaultShare
	}
	// The sites' states as of the latest time anything was heard: the snapshot's clock
	// has stopped with the heartbeats.
	var latest int64
	for _, s := range st.Sites() {
		latest = max(latest, s.Heard)
	}
	n := 1 // this site
	selfServed := g.selfServed(latest, st)
	for _, s := range st.Sites() {
		if s.Site == g.site || g.idle(latest, &s, selfServed) {
			continue
		}
		if state, _ := g.classify(latest, &s); state == siteFresh || state == siteCut {
			n++
		}
	}
	return 1 / float64(n)
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

// pastDemand keeps a key's per-site breakdowns from a little while ago, by which the
// other sites' recent request rates are told from their demands (recentRate): one at
// least rateSpan old, and one at least Config.ServingSpan old (sharing.serving). The
// breakdowns are the snapshot's immutable slices, shared, not copies.
type pastDemand struct {
	short, long pastBreakdown
}

// pastBreakdown keeps one breakdown at least a span older than the latest it was shown.
type pastBreakdown struct {
	ref, next     []topics.SiteCount
	refAt, nextAt int64 // their as-of times (unix ms)
}

// rateSpan is the least span (ms) over which a site's recent request rate is measured: long
// enough for a few requests of a client near its limit, short against the demand's time
// constant, so that a site a client has left stops being kept room within a fraction of a
// second.
const rateSpan = 300

// see takes a breakdown seen as of asOf (unix ms), for the reference rateSpan old and the
// one span (ms; 0: none) old.
func (p *pastDemand) see(sites []topics.SiteCount, asOf, span int64) {
	p.short.see(sites, asOf, rateSpan)
	if span > 0 {
		p.long.see(sites, asOf, span)
	}
}

// see takes a breakdown seen as of asOf (unix ms): the latest becomes the reference once
// it is span older than the one after it.
func (b *pastBreakdown) see(sites []topics.SiteCount, asOf, span int64) {
	switch {
	case b.next == nil || asOf < b.nextAt:
		b.ref, b.refAt, b.next, b.nextAt = nil, 0, sites, asOf
	case asOf-b.nextAt >= span:
		b.ref, b.refAt, b.next, b.nextAt = b.next, b.nextAt, sites, asOf
	}
}

// at returns the reference breakdown and its age at asOf (ms); nil when there is none.
func (b *pastBreakdown) at(asOf int64) ([]topics.SiteCount, float64) {
	if b.ref == nil || asOf <= b.refAt {
		return nil, 0
	}
	return b.ref, float64(asOf - b.refAt)
}

// at returns the breakdown at least rateSpan old and its age at asOf (ms); nil when there
// is none.
func (p *pastDemand) at(asOf int64) ([]topics.SiteCount, float64) {
	if p == nil {
		return nil, 0
	}
	return p.short.at(asOf)
}

// atLong is at over the longer span (Config.ServingSpan).
func (p *pastDemand) atLong(asOf int64) ([]topics.SiteCount, float64) {
	if p == nil {
		return nil, 0
	}
	return p.long.at(asOf)
}

// recentRate returns site's request rate (per ms) over the last dt ms from its demand now
// and in past (as of dt ms ago): what arrived since, at a constant rate r, adds
// r·τ·(1 − e^(−dt/τ)) to the demand decayed since. Without a past breakdown it is the
// demand's own rate, demand / τ, which follows a change over about τ.
func recentRate(site string, demand float64, past []topics.SiteCount, dt float64) float64 {
	if past == nil || dt <= 0 {
		return demand / demandTau
	}
	var before float64
	if k, ok := slices.BinarySearchFunc(past, site, func(c topics.SiteCount, s string) int { return strings.Compare(c.Site, s) }); ok {
		before = past[k].Demand
	}
	decay := math.Exp(-dt / demandTau)
	return max(demand-before*decay, 0) / (demandTau * (1 - decay))
}

// servingShare is the share of this site's recent rate of a key at which a data center
// that has served it in the window counts whole among those serving it (sharing.serving);
// anywhere from a tenth to twice this site's rate served the simulation alike (a data
// center a client has left shows next to nothing).
const servingShare = 0.5

// serving returns how much a site of another data center that has served a key in the
// window counts, in [0, 1], among those taken to receive at least this site's own rate
// (Engine.cachedCap): by its recent rate r against this site's, mine (both per ms, from
// the snapshot over Config.ServingSpan, when there is a breakdown that old). A site at
// servingShare × this site's rate or more counts whole; below, in proportion. With
// ServingSpan off, or no breakdown old enough yet, every site that served the key counts
// whole.
func (g *sharing) serving(r, mine float64, known bool) float64 {
	t := servingShare * mine
	if !known || g.servingSpan <= 0 || r >= t {
		return 1
	}
	return r / t
}
