package sim

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/internal/svgplot"
)

// DefaultSweepMargins are the reserve margins SweepReserveMargin tries by default: none,
// then up to several pipeline lags (enforcer.Config.ReserveMargin).
func DefaultSweepMargins() []time.Duration {
	return []time.Duration{-1, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
		time.Second, 2 * time.Second, 4 * time.Second}
}

// SweepPoint is one scenario's figures at one reserve margin.
type SweepPoint struct {
	Scenario DCScenario
	// Margin is the enforcers' ReserveMargin (negative: none).
	Margin time.Duration
	// MaxRatio, Under and Migrating are the run's max/limit and the false 429s (behind
	// the oracle) of clients under their limit and of migrating clients, in percent of
	// theirs (negative when the scenario has none).
	MaxRatio, Under, Migrating float64
}

// SweepReserveMargin runs every scenario at every margin on base and returns the points,
// scenario by scenario in the order given, margins in the order given: the frontier of
// over-admission against false 429s that the reserve margin moves along.
func SweepReserveMargin(ctx context.Context, base DCConfig, scenarios []DCScenario, margins []time.Duration, parallel int) ([]SweepPoint, error) {
	var out []SweepPoint
	for _, m := range margins {
		c := base
		c.Tuning.ReserveMargin = m
		rs, err := RunDCScenarios(ctx, c, scenarios, parallel)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			out = append(out, SweepPoint{Scenario: r.Config.Scenario, Margin: m, MaxRatio: r.MaxRatio,
				Under: percentOf(r.UnderFalse, r.UnderRequests), Migrating: percentOf(r.MigratingFalse, r.MigratingRequests)})
		}
	}
	// Scenario by scenario.
	sorted := make([]SweepPoint, 0, len(out))
	for _, sc := range scenarios {
		for _, p := range out {
			if p.Scenario == sc {
				sorted = append(sorted, p)
			}
		}
	}
	return sorted, nil
}

// percentOf is n over of in percent, or −1 when of is 0.
func percentOf(n, of int64) float64 {
	if of == 0 {
		return -1
	}
	return 100 * float64(n) / float64(of)
}

// marginLabel names a margin as the flag takes it ("none" for a negative one), marking the
// enforcer's default.
func marginLabel(m time.Duration) string {
	s := m.String()
	if m < 0 {
		s = "none"
	}
	if m == enforcer.Defaults().ReserveMargin {
		s += " (default)"
	}
	return s
}

// WriteSweepTable writes the points as a Markdown table.
func WriteSweepTable(w io.Writer, pts []SweepPoint) error {
	var b strings.Builder
	b.WriteString("| scenario | reserve margin | max/limit | false 429s: under limit | migrating |\n|---|---|---|---|---|\n")
	f := func(v float64) string {
		if v < 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f%%", v)
	}
	for _, p := range pts {
		fmt.Fprintf(&b, "| %s | %s | %.2f | %s | %s |\n", p.Scenario, marginLabel(p.Margin), p.MaxRatio, f(p.Under), f(p.Migrating))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteSweepSVG plots the frontier: for every scenario with clients under their limit, its
// max/limit (x) against their false 429s (y) at each margin, joined in margin order, with
// where an exact central limiter sits (1.00, 0%).
func WriteSweepSVG(w io.Writer, pts []SweepPoint) error {
	var b strings.Builder
	const width, height, left, right, top, bottom = 960, 560, 80, 700, 80, 480
	ymax := 0.0
	x1 := 1.06
	for _, p := range pts {
		ymax = max(ymax, p.Under)
		x1 = max(x1, p.MaxRatio+0.01)
	}
	step := svgplot.NiceStep(max(ymax, 0.1) / 5)
	fr := svgplot.Frame{Left: left, Right: right, Top: top, Bottom: bottom, X0: 0.99, X1: x1,
		YMax: step * float64(int(max(ymax, 0.1)/step)+1), YStep: step,
		XLabel: func(x float64) string { return fmt.Sprintf("%.2f", x) },
		XTitle: "max/limit (worst client, any sliding window)", YTitle: "false 429s of clients under their limit (%)"}
	for x := 1.00; x <= x1+1e-9; x += 0.01 {
		fr.XTicks = append(fr.XTicks, x)
	}
	svgplot.Header(&b, width, height, left, "Reserve margin: over-admission against false 429s",
		"streamlimit sim dc --sweep-reserve-margin; one line per scenario, one point per margin")
	fr.Write(&b)
	colors := []string{"#2e7d32", "#3a7dc9", "#e07b00", "#8e24aa", "#c62828", "#00838f", "#6d4c41", "#555555", "#ad1457", "#1565c0", "#9e9d24", "#283593"}
	var legend []svgplot.LegendItem
	var order []DCScenario
	for _, p := range pts {
		if len(order) == 0 || order[len(order)-1] != p.Scenario {
			order = append(order, p.Scenario)
		}
	}
	for i, sc := range order {
		var line [][2]float64
		for _, p := range pts {
			if p.Scenario == sc && p.Under >= 0 {
				line = append(line, [2]float64{p.MaxRatio, p.Under})
			}
		}
		if len(line) == 0 {
			continue
		}
		c := colors[i%len(colors)]
		fr.Polyline(&b, "sweep-"+string(sc), c, 2, "", line)
		for _, q := range line {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", fr.X(q[0]), fr.Y(q[1]), c)
		}
		legend = append(legend, svgplot.LegendItem{Label: string(sc), Color: c})
	}
	fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="6" fill="none" stroke="black" stroke-width="2"/>`+"\n", fr.X(1), fr.Y(0))
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">exact central limiter (1.00, 0%%)</text>`+"\n", fr.X(1)+10, fr.Y(0)-10)
	svgplot.Legend(&b, right+20, top, width-right-40, legend)
	svgplot.Footer(&b)
	_, err := io.WriteString(w, b.String())
	return err
}
