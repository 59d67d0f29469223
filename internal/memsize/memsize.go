// Package memsize estimates what the Go allocator takes for an allocation, for the
// structures that bound the bytes they keep alive (the enforcer's counters, key cache and
// snapshot) by an estimate per entry rather than by measuring the heap, and splits a
// process's memory target between them (Split).
package memsize

// Alloc is what an allocation of n bytes takes: the allocator's small size classes step
// by 16 bytes up to 256 (8 for the smallest), more coarsely beyond, by up to an eighth.
func Alloc(n int64) int64 {
	switch {
	case n <= 0:
		return 0
	case n <= 8:
		return 8
	case n <= 256:
		return (n + 15) &^ 15
	}
	return n + n/8
}

// Budget is how many bytes each of an enforcer's per-key structures may keep alive,
// by the estimate each makes of its own entries. Zero leaves a structure bounded in keys
// only.
type Budget struct {
	// KeyCache is enforcer.Config.KeyCacheBytes: the interned keys and what global decisions
	// cache per key.
	KeyCache int64
	// Local is algo.Options.MaxBytes: the local-scope counters (and the site-scope ones
	// decided in process).
	Local int64
	// Counter is sitecount.LocalOptions.MaxBytes: this site's exact count of each global key
	// (in process, or the fallback of a Redis-backed site).
	Counter int64
	// Snapshot is snapshot.Config.MaxBytes: the counts topic's view.
	Snapshot int64
}

// Split divides a process's memory target of total bytes between the per-key
// structures. They get half of it: the other half is the garbage collector's room, since
// Go's collector lets the heap grow to twice its live part before it collects (GOGC 100,
// or a soft memory limit of total, which the streamlimit command sets). Of their half, the
// site counter gets one half (its entry, a ring of sub-window buckets and their spans, is
// the largest: about 740 bytes per key), the snapshot one quarter (about 270 bytes per key
// with two sites), the local counters and the key cache one eighth each (about 260 and
// 100–330 bytes per key; an evicted key costs the key cache only a new lookup). A flood of
// new keys, half of them global, then fills the structures in roughly even proportions.
func Split(total int64) Budget {
	if total <= 0 {
		return Budget{}
	}
	half := total / 2
	return Budget{KeyCache: half / 8, Local: half / 8, Counter: half / 2, Snapshot: half / 4}
}

// RLQSPart is the part of a process's memory target of total bytes that an enforcer
// serving Envoy's Rate Limit Quota Service gives its streams and buckets
// (rlqs.Options.MaxBytes): an eighth of the half that structures keep alive. The
// enforcer takes it, doubled for the garbage collector's room, out of total before it
// Splits the rest, so that everything it keeps alive stays within half of total.
func RLQSPart(total int64) int64 {
	if total <= 0 {
		return 0
	}
	return total / 2 / 8
}
