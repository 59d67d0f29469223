package sim

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/streamlimit/streamlimit/enforcer"
)

// WANConfig is the simulation of the multi-cluster end-to-end test's clients and timeline
// (docs/multidc.md), so that the two can be read side by side: two data centers, a global
// limit of 100 per 5 s per client; a steady client at 3× its limit alternating between the
// data centers, a migrating one at 1.5× and a lighter one at 0.8× switching every 8 s, four
// clients at 0.6× that all fail over from the first data center to the second at 20 s;
// both links cut from 35 s to 60 s; the load ends at 80 s.
type WANConfig struct {
	// Links are the data centers' links (WAN, Jitter, Local, Tuning and SubBuckets are
	// used; DCs is 2). Default WAN 40ms ± 10ms, the test's proxy; MirrorMaker's own
	// delivery time comes on top in the real test (WAN 300ms approximates it).
	Links DCConfig
}

// WANRow is one client's figures in one phase.
type WANRow struct {
	Client, Phase                      string
	Requests, Admitted, OracleAdmitted int64
	// Over is the most admitted in any window ending in the phase ÷ the limit.
	Over float64
	// False429 counts requests denied that the oracle admitted.
	False429 int64
}

// Under returns Admitted ÷ OracleAdmitted.
func (r WANRow) Under() float64 {
	if r.OracleAdmitted == 0 {
		return 0
	}
	return float64(r.Admitted) / float64(r.OracleAdmitted)
}

// The multi-cluster test's timeline, ms from the start of the load.
const (
	wanLimit      = 100
	wanWindowMs   = 5_000
	wanFailoverAt = 20_000
	wanCutAt      = 35_000
	wanHealAt     = 60_000
	wanEnd        = 80_000
	wanMigrate    = 8_000
)

// wanPhases are the test's phases: [from, to) in ms.
var wanPhases = []phase{{"wan", 7_000, 35_000}, {"cut", 30_000, 65_000}, {"healed", 62_000, 80_000}}

// RunWAN simulates c and returns the rows in client, then phase order. It is
// deterministic.
func RunWAN(ctx context.Context, c WANConfig) ([]WANRow, error) {
	links := c.Links
	links.DCs, links.Scenario, links.Window, links.Limit = 2, DCMix, wanWindowMs*time.Millisecond, wanLimit
	if links.WAN == 0 {
		links.WAN = 40 * time.Millisecond
	}
	if links.Jitter == 0 {
		links.Jitter = 10 * time.Millisecond
	}
	links, err := links.normalize()
	if err != nil {
		return nil, err
	}
	rc, err := LoadRules(wanLimit, links.Window)
	if err != nil {
		return nil, err
	}
	type client struct {
		name string
		rate float64 // per second
		dc   func(t int64, i int) int
	}
	migrate := func(t int64, _ int) int { return int(t/wanMigrate) % 2 }
	perSec := float64(wanLimit) / (wanWindowMs / 1000)
	clients := []client{
		{"steady", 3 * perSec, func(_ int64, i int) int { return i % 2 }},
		{"migrating", 1.5 * perSec, migrate},
		{"mig-light", 0.8 * perSec, migrate},
	}
	for i := range 4 {
		clients = append(clients, client{fmt.Sprintf("failover-%d", i), 0.6 * perSec, func(t int64, _ int) int {
			if t < wanFailoverAt {
				return 0
			}
			return 1
		}})
	}
	var arrivals []dcArrival
	reqs := make([]enforcer.Request, len(clients))
	for k, cl := range clients {
		reqs[k] = request(cl.name)
		interval := 1000 / cl.rate
		for i := 0; ; i++ {
			t := int64(float64(k) + float64(i)*interval)
			if t >= wanEnd {
				break
			}
			arrivals = append(arrivals, dcArrival{t: t, client: k, site: cl.dc(t, i)})
		}
	}
	slices.SortStableFunc(arrivals, func(a, b dcArrival) int { return int(a.t - b.t) })
	cuts := []cut{{a: 0, b: 1, from: wanCutAt, to: wanHealAt}}

	rows := make([]WANRow, len(clients)*len(wanPhases))
	for k, cl := range clients {
		for p, ph := range wanPhases {
			rows[k*len(wanPhases)+p] = WANRow{Client: cl.name, Phase: ph.name}
		}
	}
	ours := make([]slidingLog, len(clients))
	oracle := make([]slidingLog, len(clients))
	decided := func(a dcArrival, ok bool) {
		o := &oracle[a.client]
		oracleOK := o.count(a.t, wanWindowMs) < wanLimit
		if oracleOK {
			o.t = append(o.t, a.t)
		}
		var n int64
		if ok {
			ours[a.client].t = append(ours[a.client].t, a.t)
			n = ours[a.client].count(a.t, wanWindowMs)
		}
		for p, ph := range wanPhases {
			if a.t < ph.from || a.t >= ph.to {
				continue
			}
			r := &rows[a.client*len(wanPhases)+p]
			r.Requests++
			if ok {
				r.Admitted++
				r.Over = max(r.Over, float64(n)/wanLimit)
			}
			if oracleOK {
				r.OracleAdmitted++
				if !ok {
					r.False429++
				}
			}
		}
	}
	seed := links.Seed*0x9e3779b97f4a7c15 + 0x3a9
	if _, _, _, err := simulateDCs(ctx, links, rc, seed, wanEnd, arrivals, cuts, nil, reqs, len(clients), decided); err != nil {
		return nil, err
	}
	return rows, nil
}

// WriteWANTable writes rows in the layout of docs/multidc.md's figures.
func WriteWANTable(w io.Writer, rows []WANRow) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%-11s %-6s %8s %8s %8s %9s %9s %9s\n", "client", "phase", "requests", "admitted", "oracle", "over", "under", "false 429")
	for _, r := range rows {
		fmt.Fprintf(&b, "%-11s %-6s %8d %8d %8d %9.3f %9.3f %5d %4.1f%%\n", r.Client, r.Phase, r.Requests, r.Admitted, r.OracleAdmitted,
			r.Over, r.Under(), r.False429, 100*float64(r.False429)/float64(max(r.Requests, 1)))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
