package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/sitecount"
)

// sampleEvery is how often the monitor samples the pipeline's freshness.
const sampleEvery = 250 * time.Millisecond

// monitor samples the enforcers and writes the status output: a table redrawn in place
// (Options.Live) or a plain line every Options.Every.
type monitor struct {
	p     *plan
	rec   *recorder
	sites []*site
	opts  Options
	w     io.Writer
	probe *prober
	lines int // lines of the last live table, to move the cursor back over
}

func newMonitor(p *plan, rec *recorder, sites []*site, probe *prober, opts Options, w io.Writer) *monitor {
	return &monitor{p: p, rec: rec, sites: sites, probe: probe, opts: opts, w: w}
}

// siteStatus is one site's line of the status.
type siteStatus struct {
	name             string
	admitted, denied int64
	seen             float64 // the abusive client's use as this site estimates it
	stale            bool
	lag              int64 // aggregator consume lag in records, from the heartbeats
}

type status struct {
	at          time.Duration
	sites       []siteStatus
	inWindow    int // abusive client's admissions in the last window
	byClient    [][2]int64
	heartbeatMs int64 // oldest heartbeat age over all sites
	lag         LagStats
}

func (m *monitor) sample() status {
	now := time.Now()
	st := status{at: now.Sub(m.rec.start), lag: m.probe.stats()}
	bySite, byClient := m.rec.totals()
	st.byClient = byClient
	abusive := m.p.clients[m.p.abusive]
	ops := []sitecount.Op{{Key: abusive.key, Window: m.p.window}}
	local := []float64{0}
	for i, s := range m.sites {
		ss := siteStatus{name: s.name, admitted: bySite[i][0], denied: bySite[i][1], stale: s.snap.StaleAt(now)}
		if err := s.counter.Counts(context.Background(), now, ops, local); err == nil {
			ss.seen = local[0]
		}
		if e, ok := s.snap.Get(abusive.key); ok && !e.Expired(now) {
			ss.seen += e.Remote()
		}
		for _, src := range s.snap.Sources(now) {
			ss.lag += src.Lag
			st.heartbeatMs = max(st.heartbeatMs, src.Age.Milliseconds())
		}
		st.sites = append(st.sites, ss)
	}
	st.inWindow = m.rec.admittedIn(m.p.abusive, st.at-m.p.window, st.at)
	return st
}

// run samples every sampleEvery and writes the status every Options.Every until ctx is
// done.
func (m *monitor) run(ctx context.Context) {
	t := time.NewTicker(min(sampleEvery, m.opts.Every))
	defer t.Stop()
	var last time.Time // a live table appears at once, plain lines after Every
	if !m.opts.Live {
		last = time.Now()
	}
	for {
		select {
		case <-ctx.Done():
			if m.opts.Live {
				m.write(m.sample()) // the final state stays on screen
			}
			return
		case now := <-t.C:
			st := m.sample()
			if now.Sub(last) >= m.opts.Every-sampleEvery/2 {
				last = now
				m.write(st)
			}
		}
	}
}

// finish ends the status output before the summary.
func (m *monitor) finish() {
	if m.opts.Live {
		fmt.Fprintln(m.w)
	}
}

func (m *monitor) write(st status) {
	if !m.opts.Live {
		m.writePlain(st)
		return
	}
	var b bytes.Buffer
	lines := m.table(st)
	if m.lines > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", m.lines) // back to the top of the previous table
	}
	for _, l := range lines {
		b.WriteString("\r\x1b[2K")
		b.WriteString(l)
		b.WriteByte('\n')
	}
	m.lines = len(lines)
	_, _ = m.w.Write(b.Bytes())
}

func (m *monitor) writePlain(st status) {
	p := m.p
	var b bytes.Buffer
	fmt.Fprintf(&b, "%6.1fs  %s: %d admitted in the last %v (limit %d)  admitted/denied:",
		st.at.Seconds(), p.clients[p.abusive].name, st.inWindow, p.window, p.limit)
	for _, s := range st.sites {
		fmt.Fprintf(&b, " %s %d/%d", s.name, s.admitted, s.denied)
	}
	fmt.Fprintf(&b, "  pipeline lag %s\n", fmtLag(st.lag))
	_, _ = m.w.Write(b.Bytes())
}

func (m *monitor) table(st status) []string {
	p := m.p
	ab := p.clients[p.abusive]
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	add("streamlimit demo  %5.1fs / %v   rule: client %d per %v, global over %d sites",
		st.at.Seconds(), m.opts.Duration, p.limit, p.window, p.sites)
	add("")
	add("  site   admitted   denied   %s as seen here   snapshot", ab.name)
	for _, s := range st.sites {
		state := "fresh"
		if s.stale {
			state = "STALE (local share)"
		}
		add("  %-4s %10d %8d   %9.1f / %-5d      %s", s.name, s.admitted, s.denied, s.seen, p.limit, state)
	}
	add("")
	pct := 100 * float64(st.inWindow) / float64(p.limit)
	add("  %s sends %d× the limit spread over all sites: %d admitted in the last %v = %.0f%% of %d",
		ab.name, abusiveLoad, st.inWindow, p.window, pct, p.limit)
	add("  %d independent per-site limiters would let up to %d through", p.sites, int64(p.sites)*p.limit)
	var lightDen, lightAll int64
	for i, c := range p.clients {
		switch c.kind {
		case Light:
			lightDen += st.byClient[i][1]
			lightAll += st.byClient[i][0] + st.byClient[i][1]
		case Burst:
			if st.at < c.start {
				add("  %s will burst %d requests at %s at %v", c.name, c.count, p.siteName(c.home), c.start)
			} else {
				add("  %s burst at %s: %d admitted, %d denied", c.name, p.siteName(c.home), st.byClient[i][0], st.byClient[i][1])
			}
		}
	}
	add("  light clients: %d requests, %d denied", lightAll, lightDen)
	var lag int64
	for _, s := range st.sites {
		lag = max(lag, s.lag)
	}
	add("  pipeline lag (a hit at one site until every site counts it): %s", fmtLag(st.lag))
	add("  aggregator: consume lag %d records, latest heartbeat %dms old", lag, st.heartbeatMs)
	return out
}

func (p *plan) siteName(i int) string {
	if i < 0 {
		return "all"
	}
	return siteName(i)
}

func fmtLag(l LagStats) string {
	if l.Probes == 0 {
		return "not measured yet"
	}
	return fmt.Sprintf("last %dms, mean %dms, max %dms", l.Last.Milliseconds(), l.Mean.Milliseconds(), l.Max.Milliseconds())
}
