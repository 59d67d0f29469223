// Package windowref states package window's counting rule by brute force, for tests that
// check the real counters against it.
package windowref

import (
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// Reference is the brute-force statement of the rule: given every hit of one counter (with
// BucketStart in unix ms), it returns the count at instant t over all sites and per site
// (sites with a zero count left out). It ignores the ring's clamping of far-future hits.
func Reference(s window.Spec, hits []topics.Hit, t int64) (total float64, sites map[string]float64) {
	i0, frac := s.Oldest(t)
	type acc struct{ whole, oldest uint64 }
	per := map[string]*acc{}
	var all acc
	for _, h := range hits {
		i := s.Bucket(h.BucketStart)
		if i < i0 {
			continue
		}
		a := per[h.Site]
		if a == nil {
			a = &acc{}
			per[h.Site] = a
		}
		if i == i0 {
			a.oldest += uint64(h.Count)
			all.oldest += uint64(h.Count)
		} else {
			a.whole += uint64(h.Count)
			all.whole += uint64(h.Count)
		}
	}
	sites = map[string]float64{}
	for k, a := range per {
		if a.whole != 0 || a.oldest != 0 {
			sites[k] = float64(a.whole) + float64(a.oldest)*frac
		}
	}
	return float64(all.whole) + float64(all.oldest)*frac, sites
}
