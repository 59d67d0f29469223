package aggregator

// Clock offsets between sites and the aggregator.
//
// Records are dated by the clock of the site that wrote them, and the aggregator lines the
// data centers' counts up by those dates: a site whose clock is behind looks that much
// staler, one ahead that much fresher, which is lag nobody accounts for. So the aggregator
// estimates every site's clock against its own and re-dates the site's records into its
// own clock (docs/aggregator.md, "Clock offsets").
//
// It measures, for every site, the lowest lag (arrival by this clock minus the date) of the
// site's site records over the last 10–20 s: m(S) = d(S) + this clock − S's clock, where
// d(S), the least delay, is the local hop for a site of this data center, and the local hop
// plus the link for a site of another. A local site is re-dated by m(S): its offset, and
// the local hop (a few milliseconds, the same for every site, and never an earlier date than
// its clock's). A remote site needs the link's delay apart from the offset, which one
// direction cannot tell; every aggregator publishes its minima (topics.LagReport) to its
// own hits topic, which replication carries to the others. Here (data center B), with A's
// latest report, over the sites measured on both sides (means; a, b the aggregators'
// clocks, A, B the sites'):
//
//	m_B(A's) − m_A(A's) = link + b − a   (A's sites' clocks cancel)
//	m_A(B's) − m_B(B's) = link + a − b   (B's sites' clocks cancel)
//
// so half their sum is the link's delay, assuming the least delay is the same both ways and
// the local hop the same in both data centers, and a remote site T is re-dated by
// m_B(T) − link, like a local one. Each shift is bounded to ±clock.MaxAhead, so that a
// wild estimate (or a forged report: the reports are not signed) can do no more harm than
// clocks within their bound. This data center's site records keep their dates (counting.go).

import (
	"log/slog"
	"time"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/topics"
)

const (
	// lagSpan is how long each lowest lag spans: the minimum of the current and the
	// previous span, so that it covers between one and two spans of site records (two a
	// second per partition from our producer).
	lagSpan = 10_000 // ms
	// lagReportEvery is how often an aggregator writes its lag report to each partition it
	// owns of its local hits topic.
	lagReportEvery = 2_000 // ms
	// lagReportSoon is how often it writes one while it has no estimate of some remote
	// data center's sites: every emission round of our defaults.
	lagReportSoon = 100 // ms
	// lagReportStale is how long a remote data center's lag report is used after it came.
	lagReportStale = 30_000 // ms
	// skewWarnAbove is the estimated offset past which the aggregator warns: five times the
	// NTP accuracy docs/operations.md asks of every host (20 ms), well above what the
	// estimate's own error is (a few milliseconds of jitter in the least delay).
	skewWarnAbove = 100 // ms
	// minShift is the least estimate that records are re-dated by: the estimate's own error
	// is of that order (the local hop taken for offset, the link's jitter in its least
	// delay), and with clocks within the NTP accuracy docs/operations.md asks for (20 ms),
	// re-dating by less only moves records about (with right clocks in the simulator it
	// cost 0.01–0.02 of the limit in some scenarios).
	minShift = 10 // ms
	// maxPark is the longest a record waits for its site's first estimate: a lag
	// report's round trip between data centers a few hundred milliseconds apart, and a
	// site heartbeat interval of our producer (500 ms) with room to spare.
	maxPark = 1_000 // ms
	// maxParked bounds the records waiting for an estimate; past it, records are counted
	// at once.
	maxParked = 1 << 16
	// lagForget is how long a site not heard from is remembered: long past any cut that
	// the counts of its sites are kept through (their windows), short enough that sites that
	// come and go under new names (processes) do not fill MaxLagReportSites.
	lagForget = 30 * 60_000 // ms
	// skewWarnEvery is the least time between two warnings.
	skewWarnEvery = 60_000 // ms
)

// lowLag is the lowest lag of one site's records seen from one topic over the current and
// the previous span.
type lowLag struct {
	cur, prev int64
	start     int64 // the current span's start, ms of this clock
	last      int64 // the latest sample's time, ms of this clock
	has       bool  // cur holds a sample
	hadPrev   bool  // prev holds a sample
}

func (l *lowLag) add(now, lag int64) {
	l.roll(now)
	l.last = now
	if !l.has || lag < l.cur {
		l.cur, l.has = lag, true
	}
}

// roll starts a new span when the current one is over. A span without samples keeps the
// previous one's lowest lag: a site not heard from (its link cut) keeps its estimate until
// it is heard again.
func (l *lowLag) roll(now int64) {
	for now-l.start >= lagSpan {
		if l.has {
			l.prev, l.hadPrev = l.cur, true
		}
		l.has = false
		if now-l.start >= 2*lagSpan {
			l.start = now
			return
		}
		l.start += lagSpan
	}
}

// value returns the lowest lag of the two spans, if any was seen.
func (l *lowLag) value(now int64) (int64, bool) {
	l.roll(now)
	switch {
	case l.has && l.hadPrev:
		return min(l.cur, l.prev), true
	case l.has:
		return l.cur, true
	case l.hadPrev:
		return l.prev, true
	}
	return 0, false
}

// skews estimates the clock offsets of the sites. It is not safe for concurrent use:
// the Aggregator guards it with its mutex.
type skews struct {
	local string                        // the local hits topic
	lows  map[string]map[string]*lowLag // topic → site → its lowest lag
	reps  map[string]receivedReport     // topic → the latest report read from it
	shift map[string]map[string]int64   // topic → site → its re-dating, ms (set by update)
	links map[string]int64              // remote topic → its link's least delay, ms
	sent  int64                         // when the last lag report was sent, ms
	warn  int64                         // when it last warned
	// first holds when each site's first record came here (topic → site → ms).
	first map[string]map[string]int64
	// parked holds the records waiting for their site's first estimate (park), unparked
	// unpark's result.
	parked, unparked []parkedRecord
}

type receivedReport struct {
	at  int64 // ms of this clock
	rep topics.LagReport
}

func newSkews(local string) skews {
	return skews{local: local, lows: map[string]map[string]*lowLag{}, reps: map[string]receivedReport{}, first: map[string]map[string]int64{},
		shift: map[string]map[string]int64{}, links: map[string]int64{}}
}

// sample takes a site record of site, dated ts, read from topic at now (ms).
func (s *skews) sample(now int64, topic, site string, ts int64) {
	m := s.lows[topic]
	if m == nil {
		m = map[string]*lowLag{}
		s.lows[topic] = m
	}
	l := m[site]
	if l == nil {
		if len(m) >= topics.MaxLagReportSites {
			return
		}
		l = &lowLag{start: now}
		m[site] = l
	}
	lag := now - ts
	if lag > maxLagSample || lag < -maxLagSample {
		return // a backlog (after a cut), or a date no clock within bounds makes
	}
	l.add(now, lag)
	// A site's first estimate is made at once, not at the next update: a record counted
	// before it keeps its site's date until it leaves the window.
	shifts := s.shift[topic]
	if _, ok := shifts[site]; ok {
		return
	}
	limit := clock.MaxAhead.Milliseconds()
	if topic == s.local {
		if shifts == nil {
			shifts = map[string]int64{}
			s.shift[topic] = shifts
		}
		shifts[site] = min(max(l.cur, -limit), limit)
	} else if link, ok := s.links[topic]; ok && shifts != nil {
		shifts[site] = min(max(l.cur-link, -limit), limit)
	}
}

// report takes a lag report read from topic at now.
func (s *skews) report(now int64, topic string, rep topics.LagReport) {
	if topic == s.local {
		return // this data center's own: it measures nothing this one does not
	}
	s.reps[topic] = receivedReport{at: now, rep: rep}
	if s.shift[topic] == nil {
		s.redate(now, topic) // the first estimate of the topic's sites, at once
	}
}

// of returns the re-dating of site's records read from topic, ms, and whether there is
// an estimate. An estimate within minShift of 0 re-dates nothing.
func (s *skews) of(topic string, site []byte) (int64, bool) {
	m := s.shift[topic]
	if m == nil {
		return 0, false
	}
	d, ok := m[string(site)]
	if d < minShift && d > -minShift {
		d = 0
	}
	return d, ok
}

// parkedRecord is a record waiting for its site's first estimate.
type parkedRecord struct {
	at     int64 // when it arrived, ms
	topic  string
	remote bool
	it     held
}

// park keeps hit record it, of topic, arrived at now, whose site has no estimate yet (the
// caller has looked: skews.of), back and reports whether it did: for up to maxPark, and maxParked records at most. Counted at
// once, its site's date would stay on it until it left the window, while the estimate is
// at most a lag report's round trip away (an estimate of a site of this data center, its
// first site record).
func (s *skews) park(now int64, topic string, remote bool, it held) bool {
	if it.site {
		return false // said now what it says of its site's presence, as dated
	}
	if len(s.parked) >= maxParked {
		return false
	}
	// Only where site records are in use (a producer of another language may send none:
	// its sites have no estimate ever, and their records are counted as dated), and only in
	// the site's first second here.
	if len(s.lows[topic]) == 0 {
		return false
	}
	m := s.first[topic]
	if m == nil {
		m = map[string]int64{}
		s.first[topic] = m
	}
	first, ok := m[string(it.h.site)]
	if !ok {
		if len(m) >= topics.MaxLagReportSites {
			return false
		}
		first = now
		m[string(it.h.site)] = now
	}
	if now-first >= maxPark {
		return false
	}
	s.parked = append(s.parked, parkedRecord{at: now, topic: topic, remote: remote, it: it})
	return true
}

// unpark removes and returns, in the order they came, the parked records whose site has an
// estimate at now or that have waited maxPark. The result is valid until the next call.
func (s *skews) unpark(now int64) []parkedRecord {
	s.unparked = s.unparked[:0]
	keep := s.parked[:0]
	for _, p := range s.parked {
		if _, ok := s.of(p.topic, p.it.h.site); ok || now-p.at >= maxPark {
			s.unparked = append(s.unparked, p)
		} else {
			keep = append(keep, p)
		}
	}
	clear(s.parked[len(keep):])
	s.parked = keep
	return s.unparked
}

// lagReport returns what this aggregator measured, as of now, to publish as instance.
func (s *skews) lagReport(now int64, instance string) topics.LagReport {
	rep := topics.LagReport{Instance: instance, AsOf: now}
	for topic, m := range s.lows {
		for site, l := range m {
			v, ok := l.value(now)
			if !ok {
				continue
			}
			if topic == s.local {
				if rep.Local == nil {
					rep.Local = map[string]int64{}
				}
				rep.Local[site] = v
				continue
			}
			if rep.Remote == nil {
				rep.Remote = map[string]int64{}
			}
			if len(rep.Remote) < topics.MaxLagReportSites {
				if old, ok := rep.Remote[site]; !ok || v < old {
					rep.Remote[site] = v
				}
			}
		}
	}
	return rep
}

// reportDue reports whether a lag report is due at now, and if so takes it as sent: every
// lagReportEvery, and every lagReportSoon while a remote hits topic whose sites were
// heard has no estimate yet, so that a starting aggregator, and the aggregators of a data
// center that joins, re-date within a second or two (records counted before the estimate
// keep their sites' dates until they leave the window).
func (s *skews) reportDue(now int64) bool {
	every := int64(lagReportEvery)
	for topic := range s.lows {
		if topic != s.local && s.shift[topic] == nil {
			every = lagReportSoon
			break
		}
	}
	if s.sent != 0 && now-s.sent < every {
		return false
	}
	s.sent = now
	return true
}

// update recomputes every site's re-dating at now, sets the metrics and warns (at most
// once every skewWarnEvery) of an offset larger than skewWarnAbove.
func (s *skews) update(now int64, m *metrics, log *slog.Logger) {
	limit := clock.MaxAhead.Milliseconds()
	worst, worstTopic, worstSite := int64(0), "", ""
	// This data center's sites: their least lag is their offset plus the local hop, all
	// taken for their offset, so that a site is never re-dated earlier than its offset.
	local := s.shift[s.local]
	if local == nil {
		local = map[string]int64{}
		s.shift[s.local] = local
	}
	clear(local)
	for site, l := range s.lows[s.local] {
		if v, ok := l.value(now); ok {
			local[site] = min(max(v, -limit), limit)
		}
	}
	for topic, lows := range s.lows {
		for site, l := range lows {
			if now-l.last > lagForget {
				delete(lows, site)
				delete(s.shift[topic], site)
			}
		}
		for site := range s.first[topic] {
			if _, ok := s.shift[topic][site]; ok {
				delete(s.first[topic], site) // estimated: never parked again
			}
		}
		if topic != s.local && !s.redate(now, topic) {
			m.clockOffset.WithLabelValues(topic).Set(0)
			continue
		}
		shifts := s.shift[topic]
		sum := 0.0
		for site, d := range shifts {
			sum += float64(d)
			if abs(d) > abs(worst) {
				worst, worstTopic, worstSite = d, topic, site
			}
		}
		if len(shifts) > 0 {
			m.clockOffset.WithLabelValues(topic).Set(sum / float64(len(shifts)) / 1000)
		}
	}
	m.clockOffsetMax.Set(float64(abs(worst)) / 1000)
	if abs(worst) > skewWarnAbove && now-s.warn >= skewWarnEvery {
		s.warn = now
		log.Warn("a site's clock is off this aggregator's: its records are re-dated by the estimated offset; keep every host's clock by NTP (docs/operations.md, \"Clocks\")",
			"topic", worstTopic, "site", worstSite, "offset", time.Duration(worst)*time.Millisecond)
	}
}

// redate recomputes the re-dating of remote topic's sites at now, and reports whether
// there is one: none without a link delay (link).
func (s *skews) redate(now int64, topic string) bool {
	link, ok := s.link(now, topic)
	if !ok {
		return false
	}
	s.links[topic] = link
	shifts := s.shift[topic]
	if shifts == nil {
		shifts = map[string]int64{}
		s.shift[topic] = shifts
	}
	clear(shifts)
	limit := clock.MaxAhead.Milliseconds()
	for site, l := range s.lows[topic] {
		if v, ok := l.value(now); ok {
			shifts[site] = min(max(v-link, -limit), limit)
		}
	}
	return true
}

// link returns the least delay of the link from topic's data center to this one, from its
// latest lag report and what this aggregator measured (the comment at the top); the last
// estimate without a recent report or sites measured both ways, false without one.
func (s *skews) link(now int64, topic string) (int64, bool) {
	r, ok := s.reps[topic]
	if !ok {
		return 0, false
	}
	if now-r.at > lagReportStale {
		// No report for a while (a cut link): the last estimate stands.
		link, ok := s.links[topic]
		return link, ok
	}
	lows := s.lows[topic]
	// Their sites as measured here and there.
	var here, there float64
	n := 0
	for site, theirs := range r.rep.Local {
		if l := lows[site]; l != nil {
			if v, ok := l.value(now); ok {
				here += float64(v)
				there += float64(theirs)
				n++
			}
		}
	}
	// Ours as measured there and here.
	var ourThere, ourHere float64
	k := 0
	local := s.lows[s.local]
	for site, theirs := range r.rep.Remote {
		if l := local[site]; l == nil {
			continue
		} else if v, ok := l.value(now); ok {
			ourThere += float64(theirs)
			ourHere += float64(v)
			k++
		}
	}
	if n == 0 || k == 0 {
		link, ok := s.links[topic]
		return link, ok
	}
	return int64(((here-there)/float64(n) + (ourThere-ourHere)/float64(k)) / 2), true
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// dropSlot forgets the parked records of slot (its partitions went to another instance,
// which replays them).
func (s *skews) dropSlot(slot int32) {
	keep := s.parked[:0]
	for _, p := range s.parked {
		if p.it.slot != slot {
			keep = append(keep, p)
		}
	}
	clear(s.parked[len(keep):])
	s.parked = keep
}
