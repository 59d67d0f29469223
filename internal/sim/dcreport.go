package sim

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// DCTargets are the figures a data-center run is held to (see WriteDCTable).
type DCTargets struct {
	// MaxRatio bounds one client's admitted requests in any window ÷ its limit, outside a
	// cut.
	MaxRatio float64
	// CutRatio bounds it during a cut between data centers.
	CutRatio float64
	// MinAdmitted is the least admitted ÷ what the oracle admitted of the same requests.
	MinAdmitted float64
	// MixFalse bounds the false 429s (denied, admitted by the oracle) as a fraction of all
	// requests of the realistic mix; MigratingFalse those of the migrating clients as a
	// fraction of their requests.
	MixFalse, MigratingFalse float64
}

// DefaultDCTargets are the targets the project sets itself for three data centers and
// about 200 ms of lag.
func DefaultDCTargets() DCTargets {
	return DCTargets{MaxRatio: 1.02, CutRatio: 1.05, MinAdmitted: 0.98, MixFalse: 0.001, MigratingFalse: 0.01}
}

// RunDCScenarios runs base once per scenario, on up to parallel goroutines, and returns the
// results in the scenarios' order. Runs are deterministic, so the results do not depend on
// parallel.
func RunDCScenarios(ctx context.Context, base DCConfig, scenarios []DCScenario, parallel int) ([]DCResult, error) {
	out := make([]DCResult, len(scenarios))
	errs := make([]error, len(scenarios))
	sem := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	for i, sc := range scenarios {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			c := base
			c.Scenario = sc
			out[i], errs[i] = RunDC(ctx, c)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// WriteDCTable writes the results as a Markdown table, then each target met or missed.
//
// Columns: max/limit is the most of one client's requests admitted in any sliding window,
// across all data centers, over its limit (the worst client; > 1.02 counts the clients
// above 1.02); admitted/oracle compares the admitted total with an exact global sliding
// log's on the same requests; false 429s are requests denied that the oracle admitted, as
// a percentage of all requests — "all" counts every one, "behind" only those at which the
// client had been admitted fewer requests in the window than the oracle had admitted it
// (it was held below an exact limiter, rather than admitted at slightly different
// instants); "under limit" is the behind-false 429s of clients whose load is below their
// limit, over their requests; "migrating" of the clients that move data center, over
// theirs; "move" is the median and 99th percentile time from a migrating client's first
// request at its new data center (admitted by the oracle) to its first admission there.
func WriteDCTable(w io.Writer, rs []DCResult, t DCTargets) error {
	var b strings.Builder
	b.WriteString("| scenario | clients | requests | max/limit | > 1.02 | admitted/oracle | false 429s: all | behind | under limit | migrating | move p50 / p99 | phases (max/limit) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	pct := func(n, d int64) string {
		if d == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f%%", 100*float64(n)/float64(d))
	}
	for _, r := range rs {
		move := "–"
		if n := len(r.MoveDelays); n > 0 {
			move = fmt.Sprintf("%d / %d ms", r.MoveDelays[n/2], r.MoveDelays[min(n-1, n*99/100)])
		}
		var ph []string
		for _, p := range r.Phases {
			ph = append(ph, fmt.Sprintf("%s %.2f", p.Name, p.MaxRatio))
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %.2f | %d | %.3f | %s | %s | %s | %s | %s | %s |\n",
			r.Config.label(), r.Clients, r.Requests, r.MaxRatio, r.ClientsOver, r.Ratio(),
			pct(r.FalseLiteral, r.Requests), pct(r.FalseBehind, r.Requests), pct(r.UnderFalse, r.UnderRequests),
			pct(r.MigratingFalse, r.MigratingRequests), move, strings.Join(ph, ", "))
	}
	b.WriteString("\n")
	for _, r := range rs {
		if line := r.clockLine(); line != "" {
			fmt.Fprintf(&b, "- clocks, %s: %s\n", r.Config.label(), line)
		}
	}
	for _, c := range dcChecks(rs, t) {
		verdict := "met"
		if !c.ok {
			verdict = "MISSED"
		}
		fmt.Fprintf(&b, "- %s: %s (%s)\n", c.name, verdict, c.got)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

type dcCheck struct {
	name, got string
	ok        bool
}

// dcChecks holds each result to the targets that apply to its scenario.
func dcChecks(rs []DCResult, t DCTargets) []dcCheck {
	var out []dcCheck
	for _, r := range rs {
		sc := r.Config.Scenario
		name := r.Config.label()
		if sc == DCPartition {
			for _, p := range r.Phases {
				bound := t.MaxRatio
				if p.Name == "during the cut" {
					bound = t.CutRatio
				}
				out = append(out, dcCheck{fmt.Sprintf("%s, %s: max/limit ≤ %.2f", sc, p.Name, bound), fmt.Sprintf("%.2f", p.MaxRatio), p.MaxRatio <= bound})
			}
		} else {
			out = append(out, dcCheck{fmt.Sprintf("%s: max/limit ≤ %.2f", name, t.MaxRatio), fmt.Sprintf("%.2f", r.MaxRatio), r.MaxRatio <= t.MaxRatio})
		}
		out = append(out, dcCheck{fmt.Sprintf("%s: admitted/oracle ≥ %.2f", name, t.MinAdmitted), fmt.Sprintf("%.3f", r.Ratio()), r.Ratio() >= t.MinAdmitted})
		if sc == DCMix {
			f := float64(r.FalseLiteral) / float64(max(r.Requests, 1))
			out = append(out, dcCheck{fmt.Sprintf("%s: false 429s ≤ %.1f%% of all requests", sc, 100*t.MixFalse), fmt.Sprintf("%.2f%%; behind the oracle %.2f%%; clients under their limit %.2f%%", 100*f,
				100*float64(r.FalseBehind)/float64(max(r.Requests, 1)), 100*float64(r.UnderFalse)/float64(max(r.UnderRequests, 1))), f <= t.MixFalse})
		}
		if r.MigratingRequests > 0 && (sc == DCMix || sc == DCMigrating) {
			f := float64(r.MigratingFalse) / float64(r.MigratingRequests)
			out = append(out, dcCheck{fmt.Sprintf("%s: migrating clients' false 429s ≤ %.0f%%", sc, 100*t.MigratingFalse), fmt.Sprintf("%.2f%%", 100*f), f <= t.MigratingFalse})
		}
	}
	return out
}

// label names c's scenario in reports: a churn scenario run without its churn says so.
func (c DCConfig) label() string {
	if c.NoChurn && c.Scenario.churns() {
		return string(c.Scenario) + " without churn"
	}
	return string(c.Scenario)
}

// clockLine summarizes the processes' clocks of a run with clock offsets
// (DCConfig.ClockSkew, ClockOffsets) and what their snapshots' skew meters showed; "" when
// every clock was right.
func (r *DCResult) clockLine() string {
	if r.Config.ClockSkew == 0 && len(r.Config.ClockOffsets) == 0 {
		return ""
	}
	var lo, hi, ahead, behind, estErr time.Duration
	estimated := 0
	var unready []string
	for i, c := range r.Clocks {
		if i == 0 || c.Offset < lo {
			lo = c.Offset
		}
		if i == 0 || c.Offset > hi {
			hi = c.Offset
		}
		ahead, behind = max(ahead, c.Ahead), max(behind, c.Behind)
		estErr, estimated = max(estErr, c.EstimateErr), estimated+c.Estimated
		if c.Unready > 0 {
			unready = append(unready, fmt.Sprintf("%s %+v (%d of %d samples)", c.Site, c.Offset, c.Unready, c.Checks))
		}
	}
	line := fmt.Sprintf("processes %v to %v off true time; skew meters showed at most %v ahead, %v behind; the aggregators' estimates of the processes' clocks were within %v (%d samples)",
		lo, hi, ahead, behind, estErr, estimated)
	if len(unready) == 0 {
		return line + "; none unready"
	}
	return line + "; unready (CheckClock): " + strings.Join(unready, ", ")
}
