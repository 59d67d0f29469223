package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// A prober measures the pipeline lag end to end: every probeEvery one site's producer
// publishes a hit of a fresh probe key, and the prober polls every site's snapshot until
// the key's count is visible everywhere. That is the time a remote site's admissions take
// to count in the other sites' decisions: producer bucket and flush, Kafka, aggregator
// emission, Kafka again, snapshot follower.
const (
	probeEvery   = time.Second
	probePoll    = 2 * time.Millisecond
	probeTimeout = 5 * time.Second
	probeWindow  = time.Second
)

// LagStats summarises the probes.
type LagStats struct {
	// Probes is the number of probes that reached every site; Lost those that did not
	// within 5 s.
	Probes, Lost int
	// Mean, Max and Last are the time from publishing a probe hit until every site's
	// snapshot showed it.
	Mean, Max, Last time.Duration
}

type prober struct {
	sites []*site
	mu    sync.Mutex
	st    LagStats
	sum   time.Duration
}

func (p *prober) stats() LagStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.st
	if st.Probes > 0 {
		st.Mean = p.sum / time.Duration(st.Probes)
	}
	return st
}

// run probes until ctx is done. The probes are spaced by probeEvery ± 25% at random
// (seeded), so that they sample every phase of the producer's buckets.
func (p *prober) run(ctx context.Context, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 1<<32))
	t := time.NewTimer(probeEvery)
	defer t.Stop()
	for n := 0; ; n++ {
		t.Reset(time.Duration((0.75 + r.Float64()/2) * float64(probeEvery)))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		key := fmt.Sprintf("demo-probe|n=%d#1s", n)
		start := time.Now()
		p.sites[n%len(p.sites)].prod.Hit(key, probeWindow, 1)
		seen := make([]bool, len(p.sites))
		left := len(p.sites)
		poll := time.NewTicker(probePoll)
		for left > 0 && time.Since(start) < probeTimeout {
			select {
			case <-ctx.Done():
				poll.Stop()
				return
			case <-poll.C:
			}
			for i, s := range p.sites {
				if _, ok := s.snap.Get(key); ok && !seen[i] {
					seen[i] = true
					left--
				}
			}
		}
		poll.Stop()
		lag := time.Since(start)
		p.mu.Lock()
		if left > 0 {
			p.st.Lost++
		} else {
			p.st.Probes++
			p.sum += lag
			p.st.Max = max(p.st.Max, lag)
			p.st.Last = lag
		}
		p.mu.Unlock()
	}
}
