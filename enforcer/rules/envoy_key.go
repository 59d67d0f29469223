package rules

import (
	"strconv"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// envoyUnitSeconds are the lengths of envoyproxy/ratelimit's units, as its cache keys
// divide time: second, minute, hour, day, week, its 30-day month and its 365-day year.
var envoyUnitSeconds = [...]int64{1, 60, 3600, 86400, 7 * 86400, 30 * 86400, 365 * 86400}

// envoyWindow reports whether l is a fixed window aligned on the epoch whose window is one
// of envoyproxy/ratelimit's units, and its length in seconds.
func (l *Limit) envoyWindow() (int64, bool) {
	if l.Algorithm != algo.FixedWindow || l.Window%time.Second != 0 {
		return 0, false
	}
	div := int64(l.Window / time.Second)
	for _, u := range envoyUnitSeconds {
		if u == div {
			return div, true
		}
	}
	return 0, false
}

// EnvoyShared reports whether l, when it is the one limit in force of its descriptor in a
// domain in CompatEnvoy, is counted at its key in envoyproxy/ratelimit's own Redis layout
// (AppendEnvoyKey), shared with that server: a fixed window of one of its units
// (second to its 365-day year), in site scope, outside any pool. Every way to ask about
// such a limit counts it there, so that it is counted in one place.
func (l *Limit) EnvoyShared() bool {
	_, ok := l.envoyWindow()
	return ok && l.Scope == Site && l.Pool == nil && l.Elastic == nil
}

// AppendEnvoyKey appends to dst the Redis key under which envoyproxy/ratelimit counts
// limit l for a descriptor with entries at now, and reports whether l has one: a fixed
// window aligned on the epoch whose window is one of its units. The key is the prefix, the
// domain, each entry's key and value (a share_threshold level's pattern instead of the
// value, when r is given), each followed by '_', and the window's start in Unix seconds:
//
//	prefix + "api_user_42_1767225600"
func AppendEnvoyKey(dst []byte, prefix, domain string, entries []Entry, r *Rule, l *Limit, now time.Time) ([]byte, bool) {
	div, ok := l.envoyWindow()
	if !ok {
		return dst, false
	}
	dst = append(dst, prefix...)
	dst = append(dst, domain...)
	dst = append(dst, '_')
	for j, e := range entries {
		v := e.Value
		if r != nil && j < len(r.Levels) && r.Levels[j].ShareThreshold {
			v = r.Levels[j].Value
		}
		dst = append(dst, e.Key...)
		dst = append(dst, '_')
		dst = append(dst, v...)
		dst = append(dst, '_')
	}
	return strconv.AppendInt(dst, now.Unix()/div*div, 10), true
}
