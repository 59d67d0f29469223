package snapshot

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamlimit/streamlimit/topics"
)

// ErrClockSkew is CheckClock's error: this process's clock is off the aggregators' by more
// than Config.MaxCountAhead.
var ErrClockSkew = errors.New("clock off the aggregators'")

// skewLogEvery is the least time between two log lines about a skewed clock.
const skewLogEvery = 10 * time.Second

// skewSpan is how far back ClockSkew looks: long enough to hold many heartbeats of every
// source (each writes one at least once a second), short enough that a clock put right is
// seen as right within it.
const skewSpan = 30 * time.Second

// skewMeter keeps, per second of this process's clock, the largest evidence of clock skew
// between this process and the aggregators that the heartbeats of that second gave:
//
//   - behind: a heartbeat's AsOf (the aggregator's clock when it wrote it) minus the time
//     it was applied here. Delivery takes time, so a positive value means this clock is
//     behind the aggregator's by at least that much;
//   - ahead: the time up to which the heartbeat says this site's hits were counted (this
//     site's clock, from its own records) minus its AsOf. Those records took time to reach
//     the aggregator, so a positive value means this site's clock is ahead of the
//     aggregator's by at least that much.
//
// Both are lower bounds: a delay can hide skew, never make it up. So the meter never
// reports skew that is not there, and a clock off by more than the pipeline's lag shows.
type skewMeter struct {
	mu      sync.Mutex
	buckets [int(skewSpan / time.Second)]skewBucket
}

type skewBucket struct {
	sec           int64 // unix second of this process's clock; 0: empty
	ahead, behind int64 // ms, ≥ 0
}

// observe records one heartbeat's evidence, applied at nowMs (unix ms of this clock).
func (m *skewMeter) observe(nowMs, aheadMs, behindMs int64) {
	if aheadMs <= 0 && behindMs <= 0 {
		return
	}
	sec := nowMs / 1000
	m.mu.Lock()
	b := &m.buckets[sec%int64(len(m.buckets))]
	if b.sec != sec {
		*b = skewBucket{sec: sec}
	}
	b.ahead, b.behind = max(b.ahead, aheadMs), max(b.behind, behindMs)
	m.mu.Unlock()
}

// skew returns the largest evidence of the last skewSpan before now.
func (m *skewMeter) skew(now time.Time) (ahead, behind time.Duration) {
	sec := now.Unix()
	m.mu.Lock()
	defer m.mu.Unlock()
	var a, b int64
	for _, bk := range m.buckets {
		if bk.sec > sec-int64(len(m.buckets)) && bk.sec <= sec {
			a, b = max(a, bk.ahead), max(b, bk.behind)
		}
	}
	return time.Duration(a) * time.Millisecond, time.Duration(b) * time.Millisecond
}

// ClockSkew reports how far this process's clock is, at least, ahead of the aggregators'
// (ahead) or behind it (behind), from the heartbeats of the last 30 s (see skewMeter: a
// delivery delay can only hide skew). A clock behind by more than Config.MaxCountAhead
// has every count refused as from the future; one ahead by more than the pipeline's lag
// takes fresh counts for old ones. Both are zero while the clocks agree within the
// pipeline's lag.
func (s *Snapshot) ClockSkew() (ahead, behind time.Duration) {
	return s.skew.skew(s.cfg.Clock.Now())
}

// CheckClock returns an error wrapping ErrClockSkew when ClockSkew shows this process's
// clock more than Config.MaxCountAhead ahead of the aggregators' or behind them: behind,
// every count is refused as from the future and global limits are decided on local
// shares alone; ahead, fresh counts look old. Clocks kept by NTP agree within
// milliseconds.
//
// A clock ahead by more than topics.MaxSiteRecordAhead (the same 1 s) leaves no
// heartbeat evidence: the aggregators refuse this site's heartbeats as dated ahead, so no
// heartbeat lists the site. CheckClock also fails, then, when this site's hits have been
// counted (counts show it) for unlistedAfter while no heartbeat listed it: its site
// records are refused or never sent, and the other sites take it for silent.
func (s *Snapshot) CheckClock() error {
	ahead, behind := s.ClockSkew()
	switch bound := s.cfg.MaxCountAhead; {
	case behind > bound:
		return fmt.Errorf("%w: at least %v behind them (bound %v): is this host's clock kept by NTP?", ErrClockSkew, behind, bound)
	case ahead > bound:
		return fmt.Errorf("%w: at least %v ahead of them (bound %v): is this host's clock kept by NTP?", ErrClockSkew, ahead, bound)
	}
	if s.cfg.Site != "" && s.listing.unlisted(s.cfg.Clock.Now().UnixMilli()) {
		return fmt.Errorf("%w: this site's hits are counted but no aggregator heartbeat has listed it for %v: its site heartbeats are refused, most likely as dated ahead (is this host's clock more than %v ahead of the aggregators'? the aggregators count them in bad_records_total{reason=\"too_far_future\"}), or not sent",
			ErrClockSkew, unlistedAfter, topics.MaxSiteRecordAhead)
	}
	return nil
}

// unlistedAfter is how long this site's hits must have been counted with no heartbeat
// listing the site before CheckClock takes it for refused: several site heartbeat
// intervals (500 ms) and pipeline lags, so that a process that has just started, whose
// first heartbeats are on their way while counts of its predecessor's hits show the site,
// is not taken for one.
const unlistedAfter = 10 * time.Second

// siteListing tells whether this site is counted but never listed: the times (unix ms of
// this clock; 0: never) of the latest heartbeat that listed this site, of the first count
// that showed its hits since then, and of the latest such count.
type siteListing struct {
	listedAt, countedFrom, countedAt atomic.Int64
}

// listed records a heartbeat listing this site (heard or left) at now.
func (l *siteListing) listed(now int64) {
	l.listedAt.Store(now)
	l.countedFrom.Store(0)
}

// counted records a count showing this site's hits, applied at now. The latest time is
// stored at most once a second: every count of a key this site serves goes through here.
func (l *siteListing) counted(now int64) {
	if now-l.countedAt.Load() >= 1000 {
		l.countedAt.Store(now)
	}
	l.countedFrom.CompareAndSwap(0, now)
}

// unlisted reports whether, at now, this site's hits have been counted for unlistedAfter,
// recently, with no heartbeat listing the site meanwhile.
func (l *siteListing) unlisted(now int64) bool {
	from := l.countedFrom.Load()
	return from != 0 && now-from >= unlistedAfter.Milliseconds() &&
		now-l.countedAt.Load() < skewSpan.Milliseconds() && now-l.listedAt.Load() >= unlistedAfter.Milliseconds()
}

// logSkew logs, at most every skewLogEvery, that this clock is off past the bound.
func (s *Snapshot) logSkew(now time.Time) {
	last := s.lastSkewLog.Load()
	if now.UnixNano()-last < int64(skewLogEvery) || !s.lastSkewLog.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	if err := s.CheckClock(); err != nil {
		s.cfg.Logger.Warn("this process's clock is off the aggregators': counts may be refused or taken as old", "err", err)
	}
}
