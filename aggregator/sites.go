package aggregator

import (
	"maps"

	"github.com/streamlimit/streamlimit/topics"
)

// siteSeen is what one source partition has heard of one site: its site records
// (heartbeats and leaves, topics.Hit.IsSiteRecord), by instance.
type siteSeen struct {
	at       int64            // the latest site record's time, unix ms of the site's clock
	left     bool             // every instance heard from here has left
	leftRead int64            // when it was taken as left, unix ms of this aggregator's clock
	insts    map[string]int64 // instance → its latest record's time; "" for producers that name none
	// gone holds the instances whose leave was taken here, each with the time of its latest
	// heartbeat before the leave. An instance's name is its process's own (it carries random
	// bytes), and its leave is the last record it writes to the partition, so a heartbeat of
	// an instance in gone dated no later than that is a copy of an old record written again
	// (a replay by someone who can read the topic): it would bring a site back that left, as
	// of the leave, to be taken as cut off and keep its counts. A heartbeat dated later is no
	// copy: the instance still speaks, so the leave was not its own (a forgery naming it,
	// possible without site keys to whoever can read the instance names in the topic), and
	// it is undone.
	gone map[string]int64
	// forged is set once a leave taken here was undone (heardFrom): from then on the
	// site's leaves here are reported only after leaveSilence.
	forged bool
}

// instanceLive is how long after its latest heartbeat another instance of a site keeps the
// site live when one instance leaves: a few site heartbeat intervals (500 ms by default).
// An instance silent for longer has most likely stopped without a leave record (a crash),
// and the site is then taken as left when its last speaking instance leaves.
const instanceLive = 3_000 // ms

// leaveSilence is how long after a leave is read its site is still listed live (siteMaps),
// on a source where a leave of the site was undone before (siteSeen.forged), so that a
// heartbeat of the instance, newer than its leave would allow, can undo it (heardFrom): a
// site heartbeat interval (500 ms by default) and a margin for the jitter of its reading.
// Later leaves forged in a live instance's name are thus undone before any enforcer hears
// of them, whatever their date. Only the first is reported, until the instance's next
// heartbeat: holding every leave would make every real leave reach the enforcers 500 ms
// later, which costs the sites that take over its share (docs/hardening.md).
const leaveSilence = 600 // ms

// leaveHoldRounds bounds, in emission intervals, how long a backlog holds back the report
// of a site's leave (siteMaps) beyond leaveHold: 500 ms by default, so that with a
// heartbeat every 500 ms the leave is out within about a second of being read, before the
// enforcers' SiteStaleAfter (1.5 s) after it would take the site for silent.
const leaveHoldRounds = 5

// maxInstancesPerSource bounds the instances kept per site and source; beyond it the one
// heard from longest ago is dropped.
const maxInstancesPerSource = 64

// siteSeenOn returns what src has heard of site, making the entry when create is set and
// the bound on sites allows; nil otherwise.
func (s *state) siteSeenOn(src tp, site string, create bool) *siteSeen {
	m := s.heard[src]
	if m == nil {
		if !create {
			return nil
		}
		m = map[string]*siteSeen{}
		s.heard[tp{topic: s.intern([]byte(src.topic)), part: src.part}] = m
	}
	e := m[site]
	if e == nil && create && len(m) < maxInternedSites {
		e = &siteSeen{at: -1 << 62}
		m[s.intern([]byte(site))] = e
	}
	return e
}

// heardFrom records a site heartbeat of site and instance, stamped ts (ms), on src: the
// site is live there, whatever it said before (a site that restarts under its name joins
// again with its first heartbeat, from a new instance). It reports a replay, and changes
// nothing, when the instance's leave was taken on src and ts is no later than the
// instance's latest heartbeat before it (siteSeen.gone); and undone when the leave was
// taken but ts is later: the leave was not the instance's last record, so not its own, and
// the instance counts again as if it had never been taken.
func (s *state) heardFrom(src tp, site, instance string, ts int64) (replay, undone bool) {
	e := s.siteSeenOn(src, site, true)
	if e == nil {
		return false, false
	}
	if last, ok := e.gone[instance]; ok && instance != "" {
		if ts <= last {
			return true, false
		}
		delete(e.gone, instance)
		undone, e.forged = true, true
	}
	if ts > e.at || e.left {
		e.at, e.left = max(e.at, ts), false
	}
	e.saw(instance, ts)
	return false, undone
}

// leftFrom records a site leave record of site and instance, stamped ts (ms), read at now
// (ms) on src, and reports whether it was taken, and whether it came from a stranger. A
// leave counts only from an instance heard heartbeating under the site on src and not gone
// since: anyone who may write the hits topic may write a leave in any site's name, and one
// from a stranger would take a live site for gone. A leave for a site not heard on src at
// all has nothing to act on and is neither taken nor a stranger's: a producer that stops
// before its heartbeats reached every partition writes such leaves. The site is left there
// once no other instance of it heard from there has spoken within instanceLive before ts.
func (s *state) leftFrom(now int64, src tp, site, instance string, ts int64) (taken, stranger bool) {
	e := s.siteSeenOn(src, site, false)
	if e == nil {
		return false, false
	}
	last, ok := e.insts[instance]
	if !ok {
		return false, true
	}
	// An instance that left counts nothing any more: the site restarted under its name by
	// a new instance is not two instances counting apart.
	delete(s.instances[site], instance)
	delete(e.insts, instance)
	e.leftAt(instance, last)
	for _, t := range e.insts {
		if t >= ts-instanceLive {
			return true, false // another instance still speaks for the site
		}
	}
	e.insts = nil
	if !e.left {
		e.leftRead = now
	}
	e.left, e.at = true, max(e.at, ts)
	return true, false
}

// leftAt records that instance left, its latest heartbeat dated last, dropping the instance
// heard from longest ago among those gone when the bound is reached.
func (e *siteSeen) leftAt(instance string, last int64) {
	if instance == "" {
		return
	}
	if e.gone == nil {
		e.gone = map[string]int64{}
	}
	if _, ok := e.gone[instance]; !ok && len(e.gone) >= maxInstancesPerSource {
		dropOldest(e.gone)
	}
	e.gone[instance] = last
}

// saw records instance's record at ts, dropping the instance heard from longest ago when
// the bound is reached.
func (e *siteSeen) saw(instance string, ts int64) {
	if e.insts == nil {
		e.insts = map[string]int64{}
	}
	if prev, ok := e.insts[instance]; ok {
		e.insts[instance] = max(prev, ts)
		return
	}
	if len(e.insts) >= maxInstancesPerSource {
		dropOldest(e.insts)
	}
	e.insts[instance] = ts
}

// dropOldest deletes the instance of m with the earliest time.
func dropOldest(m map[string]int64) {
	oldest, at := "", int64(0)
	for k, t := range m {
		if oldest == "" || t < at {
			oldest, at = k, t
		}
	}
	delete(m, oldest)
}

// siteMaps returns copies of what src has heard as of now: the live sites with the time
// of their latest heartbeat, and the sites that left with the time they left (nil maps
// when empty). Sites not heard from for longer than siteForget are forgotten.
//
// A site that left is listed live, as of its leave, until its last counts are out: an
// enforcer that learns of the leave gives the site's share to the others at once, so a
// count still missing the site's last hits would let them admit those hits again. Every
// counter its hits made due has been due since one emission interval after the leave was
// read (collect's rule), and the round that writes a heartbeat collects first; so the leave
// could be listed from then on, unless counters wait in the backlog, which could be any of
// them. Where a leave of the site was forged before, it waits leaveSilence anyway, for a
// heartbeat of its instance that would undo it. A backlog that outlasts leaveHoldRounds
// intervals more is an overload (the metrics show it), and the leave is listed then
// anyway: held longer, the site would be taken as silent, and keep its share for as long
// as that lasts.
func (s *state) siteMaps(src tp, now int64) (heard, left map[string]int64) {
	m := s.heard[src]
	for site, e := range m {
		switch {
		case e.at+s.cfg.siteForget < now:
			delete(m, site)
		case e.left && now >= e.leftRead+e.leaveHold(s.cfg.emitInterval) &&
			(len(s.backlog) == 0 || now >= e.leftRead+e.leaveHold(0)+leaveHoldRounds*s.cfg.emitInterval):
			if left == nil {
				left = make(map[string]int64, 1)
			}
			left[site] = e.at
		default:
			if heard == nil {
				heard = make(map[string]int64, len(m))
			}
			heard[site] = e.at
		}
	}
	return heard, left
}

// leaveHold returns how long after it is read a leave of the site is listed at the
// earliest: least, or leaveSilence where a leave was forged before.
func (e *siteSeen) leaveHold(least int64) int64 {
	if e.forged {
		return max(least, leaveSilence)
	}
	return least
}

// sourcesOf returns the sources of partition part that have heard any site, in no order,
// for the heartbeats of a Memory (which has no partitions of its own to list).
func (s *state) sourcesOf(part int32) []tp {
	var out []tp
	for src := range maps.Keys(s.heard) {
		if src.part == part {
			out = append(out, src)
		}
	}
	return out
}

// cutTimes holds, per slot, the sites cut off from here with the time each was last heard
// from (cutSites); nil when there are none.
type cutTimes map[int32]func(site string) (int64, bool)

// at returns how to time slot's sites for counting (window.Counter.AppendSitesAt), or nil
// when every site of the slot is counted now.
func (c cutTimes) at(slot int32) func(site string) (int64, bool) { return c[slot] }

// cutSites finds, at now, the sites cut off from this aggregator: silent for longer than
// topics.SiteSilentAfter on a source whose other live sites are all silent too (their data
// center's link is cut, or the data center is down). Such a site may still be admitting
// what it was given, and its hits in the window cannot be seen leaving it: it is counted
// as of its last heartbeat, count and demand, so that neither fades while it cannot be
// heard. A silent site whose source still carries other sites' heartbeats has stopped on
// its own (a crash) and is counted now, its hits leaving their windows.
func (s *state) cutSites(now int64) cutTimes {
	limit := now - topics.SiteSilentAfter.Milliseconds()
	var out cutTimes
	for src, m := range s.heard {
		live := false
		for _, e := range m {
			if !e.left && e.at >= limit {
				live = true
				break
			}
		}
		if live {
			continue
		}
		var times map[string]int64
		for site, e := range m {
			if !e.left && e.at+s.cfg.siteForget >= now {
				if times == nil {
					times = map[string]int64{}
				}
				times[site] = e.at
			}
		}
		if times == nil {
			continue
		}
		if out == nil {
			out = cutTimes{}
		}
		prev := out[src.part]
		out[src.part] = func(site string) (int64, bool) {
			if t, ok := times[site]; ok {
				return t, true
			}
			if prev != nil {
				return prev(site)
			}
			return 0, false
		}
	}
	return out
}
