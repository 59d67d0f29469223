package sim

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/streamlimit/streamlimit/internal/svgplot"
)

// PlotOptions selects what WriteSVG draws.
type PlotOptions struct {
	// FromMs and SpanMs select the time range, in ms since the start. Default: from the
	// end of the warm-up, three windows.
	FromMs, SpanMs int64
	// Title is drawn above the plot. Default: the run's configuration.
	Title string
}

// svg geometry, in px.
const (
	svgW, svgH   = 960, 555
	plotL, plotR = 70, 930
	plotT, plotB = 70, 400
	tickA, tickD = 462, 494 // rows of the admitted and denied ticks
	tickH        = 22
	colExact     = "#555555"
	colEstimate  = "#e07b00"
	colLocal     = "#3a7dc9"
	colLimit     = "#c62828"
	colAdmitted  = "#2e7d32"
	colDenied    = "#c62828"
)

// WriteSVG plots a traced run in the style of the classic rate-limiter comparisons: over time, the exact
// number of requests admitted in the sliding window (all sites), site dc1's estimate of it
// (remote part from its snapshot plus its exact local count), dc1's local part, and the
// limit; below, a tick per decision of the heavy client at every site, admitted and
// denied. The SVG is self-contained (no scripts, no external references).
func WriteSVG(w io.Writer, r Result, opts PlotOptions) error {
	tr := r.Trace
	if len(tr.Points) == 0 {
		return errors.New("sim: plot: the run was not traced")
	}
	from, span := opts.FromMs, opts.SpanMs
	if span <= 0 {
		from, span = tr.WarmupMs, 3*tr.WindowMs
	}
	to := from + span
	c := r.Config
	title := opts.Title
	if title == "" {
		title = fmt.Sprintf("%s traffic, %d sites, %s pipeline lag, %g× load — limit %d per %s sliding window",
			c.Scenario, c.Sites, lagString(c.Lag), c.Load, c.Limit, lagString(c.Window))
	}
	var pts []TracePoint
	yMax := float64(tr.Limit) * 1.25
	for _, p := range tr.Points {
		if p.T >= from && p.T <= to {
			pts = append(pts, p)
			yMax = max(yMax, float64(p.Exact)*1.05, (p.Remote+p.Local)*1.05)
		}
	}
	step := svgplot.NiceStep(yMax / 6)
	yMax = math.Ceil(yMax/step) * step

	fr := svgplot.Frame{Left: plotL, Right: plotR, Top: plotT, Bottom: plotB, X0: float64(from), X1: float64(to), YMax: yMax, YStep: step,
		XLabel: func(ms float64) string { return fmt.Sprintf("%g", ms/1000) },
		XTitle: fmt.Sprintf("time (s since start; warm-up ends at %gs)", float64(tr.WarmupMs)/1000),
		YTitle: "requests in the sliding window"}
	tStep := svgplot.NiceStep(float64(span) / 1000 / 10)
	for s := math.Ceil(float64(from)/1000/tStep) * tStep; s*1000 <= float64(to); s += tStep {
		fr.XTicks = append(fr.XTicks, s*1000)
	}
	x := func(t int64) float64 { return fr.X(float64(t)) }
	y := fr.Y

	var b strings.Builder
	svgplot.Header(&b, svgW, svgH, plotL, title, "streamlimit sim — exact sliding-window count of admitted requests vs the estimate site dc1 decides on")
	fr.Write(&b)

	// Series.
	fmt.Fprintf(&b, `<line id="limit" x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-width="1.5" stroke-dasharray="8 5"/>`+"\n",
		plotL, y(float64(tr.Limit)), plotR, y(float64(tr.Limit)), colLimit)
	poly := func(id, col string, width float64, dash string, v func(TracePoint) float64) {
		xy := make([][2]float64, len(pts))
		for i, p := range pts {
			xy[i] = [2]float64{float64(p.T), v(p)}
		}
		fr.Polyline(&b, id, col, width, dash, xy)
	}
	poly("local", colLocal, 1.2, "", func(p TracePoint) float64 { return p.Local })
	poly("exact", colExact, 2.5, "", func(p TracePoint) float64 { return float64(p.Exact) })
	poly("estimate", colEstimate, 1.8, "6 3", func(p TracePoint) float64 { return p.Remote + p.Local })

	// Decision ticks.
	fmt.Fprintf(&b, `<g fill="#333"><text x="%d" y="%d" text-anchor="end">admitted</text><text x="%d" y="%d" text-anchor="end">denied</text></g>`+"\n",
		plotL-8, tickA+tickH/2+4, plotL-8, tickD+tickH/2+4)
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#444">each tick is one request of the heavy client (all sites)</text>`+"\n", plotL, tickD+tickH+22)
	var adm, den strings.Builder
	for _, d := range tr.Decisions {
		if d.T < from || d.T > to {
			continue
		}
		row, sb := tickD, &den
		if d.Allowed {
			row, sb = tickA, &adm
		}
		fmt.Fprintf(sb, "M%.1f %dv%d", x(d.T), row, tickH)
	}
	fmt.Fprintf(&b, `<path id="admitted" stroke="%s" stroke-width="0.6" stroke-opacity="0.7" d="%s"/>`+"\n", colAdmitted, adm.String())
	fmt.Fprintf(&b, `<path id="denied" stroke="%s" stroke-width="0.6" stroke-opacity="0.5" d="%s"/>`+"\n", colDenied, den.String())

	// Legend, in the top right of the plot area on a white box.
	svgplot.Legend(&b, plotR-348, plotT+8, 340, []svgplot.LegendItem{
		{Label: "exact: admitted in (t−W, t], all sites", Color: colExact},
		{Label: "estimate at dc1: snapshot remote + local", Color: colEstimate, Dash: "6 3"},
		{Label: "dc1 local exact count", Color: colLocal},
		{Label: fmt.Sprintf("limit (%d)", tr.Limit), Color: colLimit, Dash: "8 5"},
	})
	svgplot.Footer(&b)
	_, err := io.WriteString(w, b.String())
	return err
}
