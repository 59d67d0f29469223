package sim

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Matrix is a set of runs: every combination of its lists, on top of Base.
type Matrix struct {
	Scenarios []Scenario
	Sites     []int
	Lags      []time.Duration
	Loads     []float64
	// Base holds the other settings of every run.
	Base Config
}

// DefaultMatrix is the full matrix of docs/accuracy.md: four scenarios, 1, 3 and 5 sites, lags 0, 50 ms,
// 200 ms and 1 s, and 2× and 10× load.
func DefaultMatrix() Matrix {
	return Matrix{
		Scenarios: Scenarios(),
		Sites:     []int{1, 3, 5},
		Lags:      []time.Duration{0, 50 * time.Millisecond, 200 * time.Millisecond, time.Second},
		Loads:     []float64{2, 10},
	}
}

// Configs returns the runs of m in table order (scenario, sites, lag, load).
func (m Matrix) Configs() []Config {
	var out []Config
	for _, sc := range m.Scenarios {
		for _, n := range m.Sites {
			for _, lag := range m.Lags {
				for _, load := range m.Loads {
					c := m.Base
					c.Scenario, c.Sites, c.Lag, c.Load = sc, n, lag, load
					out = append(out, c)
				}
			}
		}
	}
	return out
}

// RunMatrix runs every configuration of m on up to parallel goroutines (at least 1) and
// returns the results in m.Configs order. Runs are independent and deterministic, so the
// results do not depend on parallel.
func RunMatrix(ctx context.Context, m Matrix, parallel int) ([]Result, error) {
	cfgs := m.Configs()
	for i := range cfgs {
		c, err := cfgs[i].normalize()
		if err != nil {
			return nil, err
		}
		cfgs[i] = c
	}
	if len(cfgs) == 0 {
		return nil, nil
	}
	rc, err := LoadRules(cfgs[0].Limit, cfgs[0].Window)
	if err != nil {
		return nil, err
	}
	out := make([]Result, len(cfgs))
	errs := make([]error, len(cfgs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(parallel, 1) {
		wg.Go(func() {
			for i := range next {
				out[i], errs[i] = run(ctx, cfgs[i], rc)
			}
		})
	}
	for i := range cfgs {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Targets are the project's accuracy goals for one client, checked on the rows with 3 sites and
// 200 ms lag.
const (
	TargetMaxRatio     = 1.02
	TargetWrongPercent = 0.01
)

func lagString(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	if d%time.Second == 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return fmt.Sprintf("%dms", d.Milliseconds())
}

func pct(v float64) string {
	if v == 0 {
		return "0"
	}
	return fmt.Sprintf("%.2f%%", v)
}

// WriteTable writes results as a Markdown table, one row per run, and after it a line
// per target saying whether the target rows meet it.
func WriteTable(w io.Writer, results []Result) error {
	light := false
	for _, r := range results {
		light = light || r.Config.Light > 0
	}
	var b strings.Builder
	b.WriteString("| scenario | sites | lag | load | max/limit | mean/limit | cold start max | admitted/ideal | wrongly allowed | wrongly denied |")
	if light {
		b.WriteString(" light denied |")
	}
	b.WriteString("\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	if light {
		b.WriteString("--:|")
	}
	b.WriteString("\n")
	var (
		targetRows, maxOK, wrongOK int
		worstMax, worstWrong       float64
	)
	for _, r := range results {
		a, d, both := r.WrongPercent()
		c := r.Config
		fmt.Fprintf(&b, "| %s | %d | %s | %g× | %.3f | %.3f | %.3f | %.3f | %s | %s |", c.Scenario, c.Sites, lagString(c.Lag), c.Load,
			r.MaxRatio, r.MeanRatio, r.ColdMaxRatio, r.AdmittedVsIdeal(), pct(a), pct(d))
		if light {
			fmt.Fprintf(&b, " %d/%d |", r.LightDenied, r.LightRequests)
		}
		b.WriteString("\n")
		if c.Sites == 3 && c.Lag == 200*time.Millisecond {
			targetRows++
			worstMax, worstWrong = max(worstMax, r.MaxRatio), max(worstWrong, both)
			if r.MaxRatio <= TargetMaxRatio {
				maxOK++
			}
			if both <= TargetWrongPercent {
				wrongOK++
			}
		}
	}
	if targetRows > 0 {
		fmt.Fprintf(&b, "\nTargets on the %d rows with 3 sites and 200ms lag: max/limit ≤ %.2f met by %d (worst %.3f); wrongly allowed+denied ≤ %.2f%% met by %d (worst %.2f%%).\n",
			targetRows, TargetMaxRatio, maxOK, worstMax, TargetWrongPercent, wrongOK, worstWrong)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteCompareTable writes a comparison as a Markdown table.
func WriteCompareTable(w io.Writer, results []CompareResult) error {
	var b strings.Builder
	b.WriteString("| counter | max/limit | mean/limit | admitted/ideal | wrongly allowed | wrongly denied |\n|---|--:|--:|--:|--:|--:|\n")
	for _, r := range results {
		a, d, _ := r.WrongPercent()
		fmt.Fprintf(&b, "| %s | %.3f | %.3f | %.3f | %s | %s |\n", r.Counter, r.MaxRatio, r.MeanRatio, r.AdmittedVsIdeal(), pct(a), pct(d))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
