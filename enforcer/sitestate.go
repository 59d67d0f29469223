package enforcer

import (
	"slices"
	"strings"
	"time"
)

// String returns the state's name as streamlimit_enforcer_sites labels it: "fresh", "cut",
// "crashed" or "left".
func (s siteState) String() string {
	switch s {
	case siteCut:
		return "cut"
	case siteCrashed:
		return "crashed"
	case siteLeft:
		return "left"
	}
	return "fresh"
}

// SiteStatus is one site as global decisions take it at an instant (Engine.Sites).
type SiteStatus struct {
	// Site is the site's name.
	Site string
	// State is "fresh", "cut", "crashed" or "left", by the rule docs/sites.md
	// gives under "The four states".
	State string
	// Self reports that the site is the Engine's own, which is always fresh to itself.
	Self bool
	// Heard is the time up to which the site's hits have been counted (for a site that
	// left, the time it left); zero when no aggregator heartbeat lists the site.
	Heard time.Time
	// Silent is how long a cut or crashed site has been silent past its last heartbeat;
	// 0 for the other states.
	Silent time.Duration
	// Peer is the latest time another live site of the same data center (hits topic) was
	// heard from; zero when none. A silent site with a recent Peer crashed; one without
	// is cut off.
	Peer time.Time
}

// Sites returns every site the snapshot's aggregator heartbeats list, and this Engine's
// own, in the state a global decision at now takes each to be in, sorted by name. It reads
// what the decisions read and classifies with the same rule; it allocates its result and
// is meant for diagnostics (the console, tests), not the request path.
func (l *Engine) Sites(now time.Time) []SiteStatus {
	var out []SiteStatus
	ms := now.UnixMilli()
	if sn := l.cfg.Snapshot; sn != nil {
		ts := sn.SiteTimes().Sites()
		out = make([]SiteStatus, 0, len(ts)+1)
		for i := range ts {
			st := &ts[i]
			state, silent := l.share.classify(ms, st)
			if st.Site == l.cfg.Site {
				state, silent = siteFresh, 0 // as sharing.view takes it
			}
			s := SiteStatus{Site: st.Site, State: state.String(), Self: st.Site == l.cfg.Site,
				Silent: time.Duration(silent) * time.Millisecond}
			if st.Heard != 0 {
				s.Heard = time.UnixMilli(st.Heard)
			}
			if st.Peer != 0 {
				s.Peer = time.UnixMilli(st.Peer)
			}
			out = append(out, s)
		}
	}
	cmp := func(s SiteStatus, name string) int { return strings.Compare(s.Site, name) }
	if i, ok := slices.BinarySearchFunc(out, l.cfg.Site, cmp); !ok {
		out = slices.Insert(out, i, SiteStatus{Site: l.cfg.Site, State: siteFresh.String(), Self: true})
	}
	return out
}
