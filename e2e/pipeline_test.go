package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// pipelineSampleEvery is how often samplePipeline reads each enforcer's snapshot: ten times
// a second, well under the pipeline's normal lag, so that a slow spell of a few hundred
// milliseconds is seen.
const pipelineSampleEvery = 100 * time.Millisecond

// pipelineAges records how far behind each in-process enforcer's snapshot was: the oldest
// live site's age (streamlimit_snapshot_site_age_seconds, now minus the time up to which the
// site's hits are counted) sampled every pipelineSampleEvery. The age is the pipeline's lag
// as the deciding enforcer sees it: producer, broker, aggregator and snapshot together. On a
// quiet machine it stays under half a second; when the broker or the aggregator does not get
// the CPU it needs, it grows, the room other sites free reaches each site late, and the heavy
// client's windows drop below the floor that the product keeps with the pipeline on time.
type pipelineAges struct {
	mu      sync.Mutex
	samples []pipelineSample
}

type pipelineSample struct {
	at     time.Duration // on the generator's clock
	node   int
	oldest time.Duration
}

// samplePipeline starts sampling nodes until ctx ends, on the clock that starts at start,
// and returns the record and a function that waits for the sampler to stop.
func samplePipeline(ctx context.Context, start time.Time, nodes []*node) (*pipelineAges, func()) {
	p := &pipelineAges{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for next := time.Now(); sleepUntil(ctx, next); next = next.Add(pipelineSampleEvery) {
			for i, n := range nodes {
				mfs, err := n.reg.Gather()
				if err != nil {
					continue
				}
				s := pipelineSample{at: time.Since(start), node: i}
				for _, mf := range mfs {
					if mf.GetName() != "streamlimit_snapshot_site_age_seconds" {
						continue
					}
					for _, m := range mf.GetMetric() {
						s.oldest = max(s.oldest, time.Duration(m.GetGauge().GetValue()*float64(time.Second)))
					}
				}
				p.mu.Lock()
				p.samples = append(p.samples, s)
				p.mu.Unlock()
			}
		}
	}()
	return p, func() { <-done }
}

// late returns the spans in which some enforcer's snapshot was more than over behind: for
// each such sample, the span from the sample before it to it.
func (p *pipelineAges) late(over time.Duration) []span {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []span
	for _, s := range p.samples {
		if s.oldest > over {
			out = append(out, span{s.at - pipelineSampleEvery, s.at})
		}
	}
	return out
}

// summary describes the ages sampled in [from, to): percentiles over every enforcer's
// samples, and how many were older than over.
func (p *pipelineAges) summary(from, to, over time.Duration) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ages []time.Duration
	var late int
	for _, s := range p.samples {
		if s.at < from || s.at >= to {
			continue
		}
		ages = append(ages, s.oldest)
		if s.oldest > over {
			late++
		}
	}
	if len(ages) == 0 {
		return "no samples"
	}
	slices.Sort(ages)
	at := func(q float64) time.Duration { return ages[min(int(q*float64(len(ages))), len(ages)-1)] }
	return fmt.Sprintf("oldest live site's age p50 %v p90 %v p99 %v max %v; %d of %d samples over %v",
		at(0.5).Round(time.Millisecond), at(0.9).Round(time.Millisecond), at(0.99).Round(time.Millisecond),
		ages[len(ages)-1].Round(time.Millisecond), late, len(ages), over)
}

// pipelineLate is the pipeline lag past which TestMultiDC holds a window to its lower
// floor. The age a snapshot shows has a sawtooth of its own: a site's counts advance with
// its heartbeats, every producer.DefaultSiteHeartbeatInterval (500 ms), and reach the
// enforcers with the aggregator's. On a machine with spare CPU the oldest age stayed under
// 1.10 s (p50 0.77 s, p90 0.97 s over 1 650 samples of TestMultiDC); past 1.2 s the
// pipeline is late.
const pipelineLate = 1200 * time.Millisecond
