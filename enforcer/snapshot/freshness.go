package snapshot

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/streamlimit/streamlimit/topics"
)

// noHeartbeat is oldestMs before any heartbeat has been seen.
const noHeartbeat = math.MinInt64

// Source is the freshness of one source partition of a hits topic, from the aggregator's
// latest heartbeat for it.
type Source struct {
	// Heartbeat is the latest heartbeat applied for the source.
	topics.Heartbeat
	// Age is now − Heartbeat.AsOf, as of the call that returned the Source.
	Age time.Duration
	// Lag is Heartbeat.HighWatermark − Heartbeat.Offset, the aggregator's consume lag in
	// records (0 when negative).
	Lag int64
	// Stale reports whether Age exceeds Config.MaxStaleness or the source is Replaying.
	Stale bool
}

func (s *Snapshot) applyHeartbeat(key, value []byte) error {
	if len(value) == 0 {
		// A tombstone retires a source (e.g. a hits topic that was removed), which would
		// otherwise keep the snapshot stale forever.
		s.met.tombstones.Inc()
		s.srcMu.Lock()
		delete(s.sources, string(key))
		s.recomputeLocked()
		s.srcMu.Unlock()
		return nil
	}
	h, err := topics.DecodeHeartbeat(value)
	if err != nil {
		s.met.bad(topics.Reason(err))
		return fmt.Errorf("snapshot: heartbeat %q: %w", truncate(key), err)
	}
	if topics.HeartbeatKey(h.Topic, h.Partition) != string(key) {
		s.met.bad(ReasonKeyMismatch)
		return fmt.Errorf("snapshot: %w: heartbeat key %q names topic %q partition %d", ErrKeyMismatch, truncate(key), h.Topic, h.Partition)
	}
	// Before anything is refused: a clock off by seconds shows first as heartbeats from
	// the future.
	nowMs := s.cfg.Clock.Now().UnixMilli()
	var aheadMs int64
	if mine, ok := h.Sites[s.cfg.Site]; ok && s.cfg.Site != "" {
		aheadMs = mine - h.AsOf
		s.listing.listed(nowMs)
	} else if _, ok := h.Left[s.cfg.Site]; ok && s.cfg.Site != "" {
		s.listing.listed(nowMs)
	} else if s.cfg.Site != "" && s.listing.unlisted(nowMs) {
		s.logSkew(time.UnixMilli(nowMs)) // refused as dated ahead, most likely (CheckClock)
	}
	s.skew.observe(nowMs, aheadMs, h.AsOf-nowMs)
	if bound := s.cfg.MaxCountAhead.Milliseconds(); aheadMs > bound || h.AsOf-nowMs > bound {
		s.logSkew(time.UnixMilli(nowMs))
	}
	// A heartbeat from the future would keep the snapshot fresh until that time: refuse
	// it. A site's time from the future would make a silent site look heard from until
	// then; the site's own clock may run ahead of ours by up to the skew the aggregator
	// allows, so the time is held to the bound (and counted) rather than the heartbeat lost.
	if err := s.checkTime(h.AsOf, "heartbeat as-of"); err != nil {
		return fmt.Errorf("snapshot: heartbeat %q: %w", truncate(key), err)
	}
	var clamped error
	for site, ms := range h.Sites {
		if err := s.checkTime(ms, "heartbeat time of site "+site); err != nil {
			h.Sites[site] = s.cfg.Clock.Now().Add(s.cfg.MaxClockSkew).UnixMilli()
			clamped = err
		}
	}
	s.srcMu.Lock()
	s.sources[string(key)] = h
	s.recomputeLocked()
	s.srcMu.Unlock()
	s.met.heartbeats.Inc()
	if clamped != nil {
		return fmt.Errorf("snapshot: heartbeat %q applied with its site time held to the bound: %w", truncate(key), clamped)
	}
	return nil
}

// SiteTimes is what the snapshot knows of each site, from the aggregators' heartbeats: for
// every site some source lists, the earliest of the times up to which the sources say they
// have counted its hits (topics.Heartbeat.Sites; each source's view taken as of the newest
// heartbeat, see recomputeLocked), in unix milliseconds of the site's clock, or, once every
// source lists it as left (topics.Heartbeat.Left), that it left. A site whose time falls
// behind is one whose hits have stopped arriving here — a cut link, a stopped replicator, a
// data center down, or the site itself crashed — and it is no longer known to be idle; Peer
// tells the last case from the others. A SiteTimes is immutable.
type SiteTimes struct {
	sites []SiteTime // sorted by Site
}

// SiteTime is one site's entry in SiteTimes.
type SiteTime struct {
	Site string
	// Heard is the time up to which this site's hits have been counted, unix ms; for a site
	// that left, the time it left.
	Heard int64
	// Left reports that the site stopped cleanly (every source lists it as left): it admits
	// nothing more, and only its hits still in their windows count for it.
	Left bool
	// Peer is the latest time any other live site was heard from on the sources that list
	// this one (unix ms; 0 when none): the sites of one source are one data center's, so a
	// site silent while Peer is recent has stopped on its own rather than been cut off.
	Peer int64
	// Topic is the hits topic the site's records arrive on here (the least, should several
	// list it): the sites of one topic are one data center's, fed to every enforcer through
	// the same pipeline.
	Topic string
	// Served is the latest as-of time (unix ms) of a count applied here that lists the
	// site — a count of any key with hits or refused requests of the site in its window —
	// or 0 when none has. A heartbeat proves that someone writes the hits topic in the
	// site's name; Served, that the site has served: global decisions split shares only
	// among sites that served recently (docs/sites.md, "How a site is known").
	Served int64
	// ServedSince is the as-of time (unix ms) of the first count of the site's latest run
	// of counts, each within ServedSpan of the one before: when it started serving, as
	// far as this snapshot knows (0 when Served is).
	ServedSince int64
	// TopicServed is the latest Served of the sites of the site's Topic, itself included:
	// when its data center last served. A data center none of whose sites has served is
	// a whole one heartbeats cannot make up (the hits topics are the deployment's), and
	// keeps its share.
	TopicServed int64
}

// ServedSpan is how long a count that lists a site shows it serving (SiteTime.Served):
// global decisions split shares among the sites shown serving within it. Long: a site
// idle that long is taken for one that never served.
const ServedSpan = 15 * time.Minute

// servedTime is one site's entry in the snapshot's served table: the latest as-of time of
// a count listing it, the first of its run (SiteTime.ServedSince), and the latest
// SiteTimes shows.
type servedTime struct{ latest, since, shown int64 }

// servedRefresh is how far (ms) a site's served time may run ahead of the one SiteTimes
// shows before a count rebuilds SiteTimes at once, without waiting for the next heartbeat
// (every source's at least once a second): a site that comes back after a long idle is
// shown serving at its first count, and a replay of the counts topic rebuilds SiteTimes
// at most once a minute of as-of times per site.
const servedRefresh = 60_000

// serve records that a count as of asOf (unix ms) lists sites, and reports whether
// SiteTimes should be rebuilt now: a site the heartbeats list has served for the first
// time, or servedRefresh after the time SiteTimes shows.
func (s *Snapshot) serve(sites []topics.SiteCount, asOf int64) bool {
	if len(sites) == 0 {
		return false
	}
	st := s.sites.Load()
	rebuild := false
	s.servedMu.Lock()
	for i := range sites {
		site := sites[i].Site
		v, ok := s.served[site]
		if !ok && len(s.served) >= maxServedSites {
			continue
		}
		if asOf <= v.latest {
			continue
		}
		if asOf-v.latest > ServedSpan.Milliseconds() {
			v.since = asOf
		}
		v.latest = asOf
		s.served[site] = v
		if v.shown == 0 || asOf-v.shown > servedRefresh {
			if _, listed := st.Get(site); listed {
				rebuild = true
			}
		}
	}
	s.servedMu.Unlock()
	return rebuild
}

// Sites returns every site with a time, sorted by name. Read only.
func (t *SiteTimes) Sites() []SiteTime {
	if t == nil {
		return nil
	}
	return t.sites
}

// Heard returns the time up to which site's hits have been counted (for a site that left,
// the time it left), and whether any source lists the site.
func (t *SiteTimes) Heard(site string) (int64, bool) {
	e, ok := t.Get(site)
	return e.Heard, ok
}

// Get returns site's entry and whether any source lists the site.
func (t *SiteTimes) Get(site string) (SiteTime, bool) {
	if t == nil {
		return SiteTime{}, false
	}
	i, ok := slices.BinarySearchFunc(t.sites, site, func(e SiteTime, s string) int { return strings.Compare(e.Site, s) })
	if !ok {
		return SiteTime{}, false
	}
	return t.sites[i], true
}

// SiteTimes returns the current per-site freshness (nil before any heartbeat that lists a
// site). It does not allocate and takes no lock.
func (s *Snapshot) SiteTimes() *SiteTimes { return s.sites.Load() }

// Sources whose aggregator stopped writing. When a source partition passes from one
// aggregator to another (a rebalance, an aggregator restarted or stopped), or its
// aggregator died and the group waits for its session to time out, its heartbeats stop
// while the others' go on, and its last view of the sites freezes: taken as it is, it would
// make every site it lists look silent to every enforcer within about a second, and
// crashed, since the other sources still hear their peers (their reservations would fade
// while they go on admitting). Such a source says nothing new about the sites, which the
// sources still written tell; how old its counts get is what Age and MaxStaleness judge. So
// each source is taken with its own view of the sites — how long each had gone unheard on
// that partition when its aggregator last wrote (AsOf − the site's time) — as of the newest
// heartbeat of any source. A site cut off stays unheard in the sources that are written
// (one of them is the newest), and is taken as silent as before; when every source stops
// (Kafka down), none is behind the newest, and nothing changes.

// recomputeLocked refreshes the summary that StaleAt reads, and the site times (see
// "Sources whose aggregator stopped writing" above). Sources are few (one per hits
// partition per data center), so a full pass per heartbeat is cheap.
func (s *Snapshot) recomputeLocked() {
	oldest, newest, replaying := int64(noHeartbeat), int64(noHeartbeat), false
	for _, h := range s.sources {
		newest = max(newest, h.AsOf)
	}
	heard, left, peer := map[string]int64{}, map[string]int64{}, map[string]int64{}
	topic := map[string]string{}
	for _, h := range s.sources {
		if oldest == noHeartbeat || h.AsOf < oldest {
			oldest = h.AsOf
		}
		replaying = replaying || h.Replaying
		paused := newest - h.AsOf // its aggregator's pause, not the sites' (see above)
		// The two latest sites of the source, so that each site's peer time is the latest
		// of the others'.
		var top1, top2 int64
		top1Site := ""
		for site, ms := range h.Sites {
			ms += paused
			if prev, ok := heard[site]; !ok || ms < prev {
				heard[site] = ms
			}
			switch {
			case ms > top1:
				top2, top1, top1Site = top1, ms, site
			case ms > top2:
				top2 = ms
			}
		}
		for site := range h.Sites {
			if t, ok := topic[site]; !ok || h.Topic < t {
				topic[site] = h.Topic
			}
			p := top1
			if site == top1Site {
				p = top2
			}
			peer[site] = max(peer[site], p)
		}
		for site, ms := range h.Left {
			if t, ok := topic[site]; !ok || h.Topic < t {
				topic[site] = h.Topic
			}
			left[site] = max(left[site], ms)
			peer[site] = max(peer[site], top1)
		}
	}
	s.oldestMs.Store(oldest)
	s.replaying.Store(replaying)
	conflicts := map[string]bool{}
	for _, h := range s.sources {
		for _, site := range h.Conflicts {
			conflicts[site] = true
		}
	}
	s.met.siteConflicts.Set(float64(len(conflicts)))
	if conflicts[s.cfg.Site] && s.cfg.Site != "" {
		s.logConflict()
	}
	var st *SiteTimes
	if len(heard)+len(left) > 0 {
		st = &SiteTimes{sites: make([]SiteTime, 0, len(heard)+len(left))}
		s.servedMu.Lock()
		served := func(site string) (int64, int64) {
			v, ok := s.served[site]
			if !ok {
				return 0, 0
			}
			v.shown = v.latest
			s.served[site] = v
			return v.latest, v.since
		}
		for site, ms := range heard {
			e := SiteTime{Site: s.internSite(site), Heard: ms, Peer: peer[site], Topic: s.internSite(topic[site])}
			e.Served, e.ServedSince = served(site)
			st.sites = append(st.sites, e)
		}
		for site, ms := range left {
			// A site some source still hears from is live there: its leave has not reached
			// every partition yet, or it restarted.
			if _, live := heard[site]; !live {
				e := SiteTime{Site: s.internSite(site), Heard: ms, Left: true, Peer: peer[site], Topic: s.internSite(topic[site])}
				e.Served, e.ServedSince = served(site)
				st.sites = append(st.sites, e)
			}
		}
		s.servedMu.Unlock()
		topicServed := map[string]int64{}
		for _, e := range st.sites {
			topicServed[e.Topic] = max(topicServed[e.Topic], e.Served)
		}
		for i := range st.sites {
			st.sites[i].TopicServed = topicServed[st.sites[i].Topic]
		}
		slices.SortFunc(st.sites, func(a, b SiteTime) int { return strings.Compare(a.Site, b.Site) })
	}
	s.sites.Store(st)
}

// AgeAt returns how old the snapshot's counts may be at now: now minus the oldest of the
// sources' latest heartbeat times, since a key's count is only as fresh as the heartbeat of
// the partition it is counted from. Before any heartbeat has been applied it is the time
// since the Snapshot was created. When Kafka is unreachable no heartbeat arrives, so the age
// grows while the last counts keep being served.
func (s *Snapshot) AgeAt(now time.Time) time.Duration {
	oldest := s.oldestMs.Load()
	if oldest == noHeartbeat {
		return now.Sub(s.start)
	}
	return time.Duration(now.UnixMilli()-oldest) * time.Millisecond
}

// Age returns AgeAt(Config.Clock.Now()).
func (s *Snapshot) Age() time.Duration { return s.AgeAt(s.cfg.Clock.Now()) }

// StaleAt reports whether the counts cannot be trusted at now: AgeAt(now) exceeds
// Config.MaxStaleness, or some source's latest heartbeat says the aggregator is replaying
// it (its keys' counts are then incomplete). The enforcer then falls back to local shares
// of its global limits. StaleAt does not allocate and takes no lock.
func (s *Snapshot) StaleAt(now time.Time) bool {
	return s.replaying.Load() || s.AgeAt(now) > s.cfg.MaxStaleness
}

// Stale returns StaleAt(Config.Clock.Now()).
func (s *Snapshot) Stale() bool { return s.StaleAt(s.cfg.Clock.Now()) }

// Sources returns the freshness of every source partition seen, sorted by topic and
// partition, as of now (for /readyz and diagnostics).
func (s *Snapshot) Sources(now time.Time) []Source {
	s.srcMu.Lock()
	out := make([]Source, 0, len(s.sources))
	for _, h := range s.sources {
		age := time.Duration(now.UnixMilli()-h.AsOf) * time.Millisecond
		out = append(out, Source{
			Heartbeat: h,
			Age:       age,
			Lag:       max(h.HighWatermark-h.Offset, 0),
			Stale:     h.Replaying || age > s.cfg.MaxStaleness,
		})
	}
	s.srcMu.Unlock()
	slices.SortFunc(out, func(a, b Source) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	return out
}

// logConflict logs, at most once a minute, that this enforcer's own site is announced by
// instances that count it apart.
func (s *Snapshot) logConflict() {
	now := time.Now().UnixNano()
	if last := s.lastConflictLog.Load(); now-last < int64(time.Minute) || !s.lastConflictLog.CompareAndSwap(last, now) {
		return
	}
	s.cfg.Logger.Error("another instance announces this site but counts it apart: each admits the site's whole share of every global limit; give each instance its own --site, or share the site's Redis",
		"site", s.cfg.Site)
}
