package demo

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// HoldTolerance is how far above the limit the abusive client's busiest window may be for
// the limit to count as held: 5%, since remote sites' hits are seen late by the pipeline
// lag and the sub-window buckets interpolate.
const HoldTolerance = 0.05

// Summary is the outcome of a demo run.
type Summary struct {
	// Elapsed is how long the traffic ran.
	Elapsed time.Duration
	// Interrupted reports that the run was cut short by its context.
	Interrupted bool
	// Seed is Options.Seed.
	Seed uint64
	// Limit and Window are the global limit every client is under.
	Limit  int64
	Window time.Duration
	// Sites has the decisions per site, in site order.
	Sites []SiteStats
	// Clients has the decisions per client, light clients first.
	Clients []ClientStats
	// Abusive names the abusive client; AbusiveWindows is its admissions per sliding
	// window, measured from one window after the start of traffic to its end.
	Abusive        string
	AbusiveWindows WindowStats
	// LightRequests and LightDenied count the light clients' requests and denials.
	LightRequests, LightDenied int64
	// Lag is the pipeline lag measured by probes: the time from a hit published at one
	// site until every site's snapshot counted it.
	Lag LagStats
	// Held reports that AbusiveWindows.Max ≤ Limit × (1 + HoldTolerance). False when no
	// window was measured.
	Held bool
	// Verdict is the one-line conclusion, as printed.
	Verdict string
}

// SiteStats counts one site's decisions.
type SiteStats struct {
	Site             string
	Admitted, Denied int64
}

// ClientStats counts one client's decisions.
type ClientStats struct {
	Client string
	Kind   Kind
	// Home is the client's site, or "all" for a client spread over every site.
	Home             string
	Admitted, Denied int64
}

// MaxPercent returns the abusive client's busiest window as a percentage of the limit.
func (s Summary) MaxPercent() float64 {
	return 100 * float64(s.AbusiveWindows.Max) / float64(s.Limit)
}

// MeanPercent returns the abusive client's mean window as a percentage of the limit.
func (s Summary) MeanPercent() float64 { return 100 * s.AbusiveWindows.Mean / float64(s.Limit) }

func summarize(p *plan, rec *recorder, elapsed time.Duration, opts Options, lag LagStats) Summary {
	bySite, byClient := rec.totals()
	s := Summary{Elapsed: elapsed, Seed: opts.Seed, Limit: p.limit, Window: p.window,
		Abusive: p.clients[p.abusive].name, Lag: lag}
	for i, v := range bySite {
		s.Sites = append(s.Sites, SiteStats{Site: siteName(i), Admitted: v[0], Denied: v[1]})
	}
	for i, c := range p.clients {
		v := byClient[i]
		s.Clients = append(s.Clients, ClientStats{Client: c.name, Kind: c.kind, Home: p.siteName(c.home), Admitted: v[0], Denied: v[1]})
		if c.kind == Light {
			s.LightRequests += v[0] + v[1]
			s.LightDenied += v[1]
		}
	}
	s.AbusiveWindows = windowStats(rec.admissions(p.abusive), p.window, p.window, elapsed)
	local := int64(p.sites) * p.limit
	switch ws := s.AbusiveWindows; {
	case !ws.Measured():
		s.Verdict = fmt.Sprintf("NOT MEASURED: the run stopped before one full %v window had passed.", p.window)
	case float64(ws.Max) <= float64(p.limit)*(1+HoldTolerance):
		s.Held = true
		s.Verdict = fmt.Sprintf("the global limit HELD: %s got at most %d per %v against a limit of %d (%.0f%%, tolerance %.0f%%), not the %d that %d independent per-site limiters would allow.",
			s.Abusive, ws.Max, p.window, p.limit, s.MaxPercent(), 100*HoldTolerance, local, p.sites)
	default:
		s.Verdict = fmt.Sprintf("the global limit did NOT hold: %s got up to %d per %v against a limit of %d (%.0f%%, over the %.0f%% tolerance); %d independent per-site limiters would allow %d.",
			s.Abusive, ws.Max, p.window, p.limit, s.MaxPercent(), 100*(1+HoldTolerance), p.sites, local)
	}
	return s
}

// Write writes the summary as text.
func (s Summary) Write(w io.Writer) error {
	var b strings.Builder
	how := "after"
	if s.Interrupted {
		how = "interrupted after"
	}
	fmt.Fprintf(&b, "\nSummary %s %.1fs (seed %d, %d sites, rule: client %d per %v, global)\n\n",
		how, s.Elapsed.Seconds(), s.Seed, len(s.Sites), s.Limit, s.Window)

	fmt.Fprintf(&b, "  %-10s %9s %8s\n", "site", "admitted", "denied")
	for _, st := range s.Sites {
		fmt.Fprintf(&b, "  %-10s %9d %8d\n", st.Site, st.Admitted, st.Denied)
	}
	fmt.Fprintf(&b, "\n  %-10s %-8s %-5s %9s %8s\n", "client", "kind", "home", "admitted", "denied")
	for _, c := range s.Clients {
		fmt.Fprintf(&b, "  %-10s %-8s %-5s %9d %8d\n", c.Client, c.Kind, c.Home, c.Admitted, c.Denied)
	}

	ws := s.AbusiveWindows
	fmt.Fprintf(&b, "\n%s sent %d× its limit, spread evenly over all %d sites.\n", s.Abusive, abusiveLoad, len(s.Sites))
	if ws.Measured() {
		fmt.Fprintf(&b, "Its admissions per sliding %v window, exact, over every window ending between %.1fs and %.1fs:\n",
			ws.Window, ws.From.Seconds(), ws.To.Seconds())
		fmt.Fprintf(&b, "  max   %4d    = %5.1f%% of the limit %d (window ending at %.2fs)\n", ws.Max, s.MaxPercent(), s.Limit, ws.MaxAt.Seconds())
		fmt.Fprintf(&b, "  mean  %6.1f  = %5.1f%% of the limit\n", ws.Mean, s.MeanPercent())
		fmt.Fprintf(&b, "  %d independent per-site limiters would have admitted up to %d (%d%%).\n",
			len(s.Sites), int64(len(s.Sites))*s.Limit, 100*len(s.Sites))
	}
	if s.Lag.Probes > 0 {
		fmt.Fprintf(&b, "Pipeline lag, from a hit at one site until every site counted it: mean %dms, max %dms (%d probes",
			s.Lag.Mean.Milliseconds(), s.Lag.Max.Milliseconds(), s.Lag.Probes)
		if s.Lag.Lost > 0 {
			fmt.Fprintf(&b, ", %d not seen within %v", s.Lag.Lost, probeTimeout)
		}
		b.WriteString(").\n")
	}
	if s.LightDenied == 0 {
		fmt.Fprintf(&b, "Light clients were never denied (%d requests).\n", s.LightRequests)
	} else {
		fmt.Fprintf(&b, "Light clients were denied %d of %d requests.\n", s.LightDenied, s.LightRequests)
	}
	fmt.Fprintf(&b, "\nVERDICT: %s\n", s.Verdict)
	_, err := io.WriteString(w, b.String())
	return err
}
