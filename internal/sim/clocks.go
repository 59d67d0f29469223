package sim

import (
	"math/rand/v2"
	"time"

	"github.com/streamlimit/streamlimit/clock"
)

// offsetClock is a host's clock: true time (the simulation's) plus the host's offset.
type offsetClock struct {
	base *clock.Fake
	off  time.Duration
}

func (c offsetClock) Now() time.Time { return c.base.Now().Add(c.off) }

// hostClocks gives every host of a run its clock offset (DCConfig.ClockSkew and
// ClockOffsets): each data center's aggregator, and each of its enforcer processes. A
// process started later (churn) under a new name runs on a host of its data center, the
// next in turn, and takes that host's offset; a restart under a known name keeps its own.
type hostClocks struct {
	agg   []time.Duration   // per data center
	hosts [][]time.Duration // per data center, its process hosts
	named map[string]time.Duration
	next  []int // per data center, the next host a new name runs on
}

// newHostClocks spreads cfg.ClockSkew evenly over the hosts, from −ClockSkew to
// +ClockSkew, in an order drawn from seed (so that both extremes are always some host's,
// and which ones differs by seed), then adds each data center's ClockOffsets to its
// processes.
func newHostClocks(cfg DCConfig, seed uint64) *hostClocks {
	n := cfg.DCs * (1 + cfg.Procs)
	offs := make([]time.Duration, n)
	if cfg.ClockSkew != 0 && n > 1 {
		for k := range offs {
			offs[k] = -cfg.ClockSkew + time.Duration(int64(2*cfg.ClockSkew)*int64(k)/int64(n-1))
		}
		r := rand.New(rand.NewPCG(seed^0x9e3779b9, 7))
		r.Shuffle(n, func(i, j int) { offs[i], offs[j] = offs[j], offs[i] })
	}
	h := &hostClocks{agg: make([]time.Duration, cfg.DCs), hosts: make([][]time.Duration, cfg.DCs),
		named: map[string]time.Duration{}, next: make([]int, cfg.DCs)}
	for d := range cfg.DCs {
		base := d * (1 + cfg.Procs)
		h.agg[d] = offs[base]
		h.hosts[d] = offs[base+1 : base+1+cfg.Procs]
		if d < len(cfg.ClockOffsets) {
			for k := range h.hosts[d] {
				h.hosts[d][k] += cfg.ClockOffsets[d]
			}
		}
	}
	return h
}

// proc returns the offset of process name of data center dc.
func (h *hostClocks) proc(dc int, name string) time.Duration {
	if off, ok := h.named[name]; ok {
		return off
	}
	if len(h.hosts[dc]) == 0 {
		return 0
	}
	off := h.hosts[dc][h.next[dc]%len(h.hosts[dc])]
	h.next[dc]++
	h.named[name] = off
	return off
}
