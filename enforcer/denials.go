package enforcer

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// recentDenialKeys is how many recently denied counter keys an Engine remembers
// (RecentDenials): a key denied again takes its own entry's place, a new key the oldest's.
const recentDenialKeys = 64

// denialSampleGap is the least time between two denied decisions that RecentDenials
// records. The others cost the request path one atomic load: a flood of denials neither
// takes a lock nor moves a written cache line between cores. Under a flood the record is
// therefore a sample, which still shows every key denied often.
const denialSampleGap = 50 * time.Microsecond

// Denial is a counter key denied recently (Engine.RecentDenials).
type Denial struct {
	// Time is when the key was last recorded denied.
	Time time.Time
	// Site is the Engine's site, where the request was denied.
	Site string
	// Domain is the request's domain.
	Domain string
	// Rule is the ID of the rule that matched the descriptor (rules.Rule.ID); "" for a
	// descriptor limited by its own override.
	Rule string
	// Key is the counter key of the limit that denied.
	Key string
	// Scope is that limit's scope.
	Scope rules.Scope
	// Requests and Window are that limit's allowance, soft raise included, and window.
	Requests int64
	Window   time.Duration
}

// cacheLine keeps denialLog.last on a line of its own: it is read by every denied
// decision and written by those recorded, and must not make the Engine's other fields'
// line move with it.
const cacheLine = 64

// denialLog is the Engine's record of recently denied keys: a fixed table, so that its
// memory is bounded and recording allocates nothing. The zero value is ready.
type denialLog struct {
	_    [cacheLine]byte
	last atomic.Int64 // unix ns of the latest recorded denial
	_    [cacheLine - 8]byte
	mu   sync.Mutex // guards ring; the request path only ever tries it
	ring [recentDenialKeys]denialEntry
}

type denialEntry struct {
	at       int64 // unix ns; 0: empty
	domain   string
	rule     string
	key      string
	scope    rules.Scope
	requests int64
	window   time.Duration
}

// record notes the denying statuses of res, decided at now, unless another denial was
// recorded within denialSampleGap or the table is being read. The strings kept are the
// request's domain and the interned key and rule ID, so nothing is copied.
func (d *denialLog) record(now time.Time, domain string, res *Result) {
	t := now.UnixNano()
	last := d.last.Load()
	if gap := t - last; gap >= 0 && gap < int64(denialSampleGap) {
		return
	}
	if !d.last.CompareAndSwap(last, t) || !d.mu.TryLock() {
		return
	}
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.Code != CodeOverLimit || st.Key == "" {
			continue
		}
		e := denialEntry{at: t, domain: domain, key: st.Key, requests: st.Requests, window: st.Window}
		if st.Rule != nil {
			e.rule = st.Rule.ID
		}
		if st.Limit != nil {
			e.scope = st.Limit.Scope
		}
		d.put(e)
	}
	d.mu.Unlock()
}

// put stores e in the entry of its key, else in the empty or oldest one. Under mu.
func (d *denialLog) put(e denialEntry) {
	slot := 0
	for i := range d.ring {
		c := &d.ring[i]
		if c.at != 0 && c.key == e.key && c.domain == e.domain {
			slot = i
			break
		}
		if c.at < d.ring[slot].at {
			slot = i
		}
	}
	d.ring[slot] = e
}

// RecentDenials returns the counter keys denied recently at this Engine, at most
// recentDenialKeys, each with its latest recorded denial, newest first. Denied decisions
// are sampled (denialSampleGap); exact counts are in streamlimit_enforcer_decisions_total.
// It allocates its result and is meant for diagnostics, not the request path.
func (l *Engine) RecentDenials() []Denial {
	d := &l.denials
	d.mu.Lock()
	out := make([]Denial, 0, len(d.ring))
	for _, e := range d.ring {
		if e.at != 0 {
			out = append(out, Denial{Time: time.Unix(0, e.at), Site: l.cfg.Site, Domain: e.domain, Rule: e.rule,
				Key: e.key, Scope: e.scope, Requests: e.requests, Window: e.window})
		}
	}
	d.mu.Unlock()
	slices.SortFunc(out, func(a, b Denial) int { return b.Time.Compare(a.Time) })
	return out
}
