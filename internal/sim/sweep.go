package sim

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/internal/svgplot"
)

// SweepSetting names the enforcer setting a sweep moves (Sweep).
type SweepSetting string

// The settings a sweep can move.
const (
	// SweepReserveMargin moves enforcer.Tuning.ReserveMargin.
	SweepReserveMargin SweepSetting = "reserve margin"
	// SweepServingSpan moves enforcer.Tuning.ServingSpan.
	SweepServingSpan SweepSetting = "serving span"
)

// set sets s to v in t.
func (s SweepSetting) set(t *enforcer.Tuning, v time.Duration) {
	switch s {
	case SweepServingSpan:
		t.ServingSpan = v
	default:
		t.ReserveMargin = v
	}
}

// def is the enforcer's default of s.
func (s SweepSetting) def() time.Duration {
	if s == SweepServingSpan {
		return enforcer.Defaults().ServingSpan
	}
	return enforcer.Defaults().ReserveMargin
}

// DefaultSweepMargins are the reserve margins a sweep of SweepReserveMargin tries by
// default: none, then up to several pipeline lags (enforcer.Config.ReserveMargin).
func DefaultSweepMargins() []time.Duration {
	return []time.Duration{-1, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
		time.Second, 2 * time.Second, 4 * time.Second}
}

// DefaultSweepSpans are the serving spans a sweep of SweepServingSpan tries by default:
// off (every data center that served a key in the window counts), then from about one
// demand rate span to a few seconds (enforcer.Config.ServingSpan).
func DefaultSweepSpans() []time.Duration {
	return []time.Duration{-1, 300 * time.Millisecond, 600 * time.Millisecond, time.Second,
		2 * time.Second, 4 * time.Second}
}

// The reference points of a sweep (SweepPoint.Ref).
const (
	// RefServed is the enforcers' defaults with ServingSpan off: every data center that
	// served a key in the window taken to receive at least this site's rate of it (in a
	// sweep of the reserve margin only: a sweep of the serving span has it as "off").
	RefServed = "every served data center"
	// RefSplit is a per-site split limiter: each site decides alone on an even fixed
	// share of each limit.
	RefSplit = "per-site split"
)

// SweepPoint is one scenario's figures at one value of the setting swept, or at a
// reference.
type SweepPoint struct {
	Scenario DCScenario
	// Setting is the setting swept and Value its value (negative: none, or off).
	Setting SweepSetting
	Value   time.Duration
	// Ref is "" for a point of the sweep, else the reference it is (RefServed, RefSplit).
	Ref string
	// MaxRatio, Under and Migrating are the run's max/limit and the false 429s (behind
	// the oracle) of clients under their limit and of migrating clients, in percent of
	// theirs (negative when the scenario has none).
	MaxRatio, Under, Migrating float64
}

// Sweep runs every scenario at every value of setting on base and returns the points,
// scenario by scenario in the order given, values in the order given, then the
// references: the frontier of over-admission against false 429s that the setting moves
// along, the rule before ServingSpan (RefServed, in a sweep of the reserve margin) and a
// per-site split limiter (RefSplit).
func Sweep(ctx context.Context, base DCConfig, scenarios []DCScenario, setting SweepSetting, values []time.Duration, parallel int) ([]SweepPoint, error) {
	var out []SweepPoint
	run := func(c DCConfig, v time.Duration, ref string) error {
		rs, err := RunDCScenarios(ctx, c, scenarios, parallel)
		if err != nil {
			return err
		}
		for _, r := range rs {
			out = append(out, SweepPoint{Scenario: r.Config.Scenario, Setting: setting, Value: v, Ref: ref, MaxRatio: r.MaxRatio,
				Under: percentOf(r.UnderFalse, r.UnderRequests), Migrating: percentOf(r.MigratingFalse, r.MigratingRequests)})
		}
		return nil
	}
	for _, v := range values {
		c := base
		setting.set(&c.Tuning, v)
		if err := run(c, v, ""); err != nil {
			return nil, err
		}
	}
	if setting == SweepReserveMargin {
		served := base
		served.Tuning.ServingSpan = -1
		if err := run(served, base.Tuning.ReserveMargin, RefServed); err != nil {
			return nil, err
		}
	}
	split := base
	split.split = true
	if err := run(split, 0, RefSplit); err != nil {
		return nil, err
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

// valueLabel names a point's value as the flag takes it ("none" or "off" for a negative
// one), marking the enforcer's default.
func valueLabel(p SweepPoint) string {
	s := p.Value.String()
	switch {
	case p.Value < 0 && p.Setting == SweepServingSpan:
		s = "off"
	case p.Value < 0:
		s = "none"
	}
	if p.Value == p.Setting.def() {
		s += " (default)"
	}
	return s
}

// WriteSweepTable writes the points as a Markdown table.
func WriteSweepTable(w io.Writer, pts []SweepPoint) error {
	var b strings.Builder
	setting := SweepReserveMargin
	if len(pts) > 0 {
		setting = pts[0].Setting
	}
	fmt.Fprintf(&b, "| scenario | %s | max/limit | false 429s: under limit | migrating |\n|---|---|---|---|---|\n", setting)
	f := func(v float64) string {
		if v < 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f%%", v)
	}
	for _, p := range pts {
		label := valueLabel(p)
		if p.Ref != "" {
			label = "*" + p.Ref + "*"
		}
		fmt.Fprintf(&b, "| %s | %s | %.2f | %s | %s |\n", p.Scenario, label, p.MaxRatio, f(p.Under), f(p.Migrating))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteSweepSVG plots the frontier: for every scenario with clients under their limit, its
// max/limit (x) against their false 429s (y) at each value, joined in the order swept; the
// rule before ServingSpan (RefServed) as a hollow square of the scenario's colour; a
// per-site split limiter (RefSplit) as a cross, at the plot's edge with its figures when
// it is beyond the plot (which is scaled to the other points); and where an exact central
// limiter sits (1.00, 0%).
func WriteSweepSVG(w io.Writer, pts []SweepPoint) error {
	var b strings.Builder
	const width, height, left, right, top, bottom = 960, 560, 80, 700, 80, 480
	ymax := 0.0
	x0, x1 := 0.99, 1.06
	for _, p := range pts {
		if p.Ref != RefSplit {
			ymax = max(ymax, p.Under)
			x0 = min(x0, p.MaxRatio-0.01)
			x1 = max(x1, p.MaxRatio+0.01)
		}
	}
	step := svgplot.NiceStep(max(ymax, 0.1) / 5)
	fr := svgplot.Frame{Left: left, Right: right, Top: top, Bottom: bottom, X0: x0, X1: x1,
		YMax: step * float64(int(max(ymax, 0.1)/step)+1), YStep: step,
		XLabel: func(x float64) string { return fmt.Sprintf("%.2f", x) },
		XTitle: "max/limit (worst client, any sliding window)", YTitle: "false 429s of clients under their limit (%)"}
	tick := 0.01
	if x1-x0 > 0.2 {
		tick = 0.05
	}
	for x := math.Ceil(x0/tick-1e-9) * tick; x <= x1+1e-9; x += tick {
		fr.XTicks = append(fr.XTicks, x)
	}
	setting, flag := SweepReserveMargin, "--sweep-reserve-margin"
	if len(pts) > 0 && pts[0].Setting == SweepServingSpan {
		setting, flag = SweepServingSpan, "--sweep-serving-span"
	}
	sub := "one line per scenario, one point per value; × per-site split"
	if setting == SweepReserveMargin {
		sub += ", □ every served data center"
	}
	title := strings.ToUpper(string(setting[:1])) + string(setting[1:])
	svgplot.Header(&b, width, height, left, title+": over-admission against false 429s", "streamlimit sim dc "+flag+"; "+sub)
	fr.Write(&b)
	colors := []string{"#2e7d32", "#3a7dc9", "#e07b00", "#8e24aa", "#c62828", "#00838f", "#6d4c41", "#555555", "#ad1457", "#1565c0", "#9e9d24", "#283593"}
	var legend []svgplot.LegendItem
	var order []DCScenario
	for _, p := range pts {
		if !slices.Contains(order, p.Scenario) {
			order = append(order, p.Scenario)
		}
	}
	for i, sc := range order {
		var line [][2]float64
		for _, p := range pts {
			if p.Scenario == sc && p.Ref == "" && p.Under >= 0 {
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
		for _, p := range pts {
			if p.Scenario != sc || p.Under < 0 {
				continue
			}
			x, y := fr.X(min(max(p.MaxRatio, fr.X0), fr.X1)), fr.Y(min(p.Under, fr.YMax))
			switch p.Ref {
			case RefServed:
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="8" height="8" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", x-4, y-4, c)
			case RefSplit:
				fmt.Fprintf(&b, `<path d="M%.1f %.1fl8 8m0 -8l-8 8" stroke="%s" stroke-width="2"/>`+"\n", x-4, y-4, c)
				if p.Under > fr.YMax || p.MaxRatio < fr.X0 || p.MaxRatio > fr.X1 {
					// Beyond the plot: at its edge, with its figures.
					fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="11" fill="%s">%s (%.2f, %.1f%%)</text>`+"\n",
						min(x+6, fr.X(fr.X1)-150), y+12+11*float64(i%12), c, svgplot.Esc(string(sc)), p.MaxRatio, p.Under)
				}
			}
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
