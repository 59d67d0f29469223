package sim

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
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
	svgW, svgH      = 960, 555
	plotL, plotR    = 70, 930
	plotT, plotB    = 70, 400
	tickA, tickD    = 462, 494 // rows of the admitted and denied ticks
	tickH           = 22
	colExact        = "#555555"
	colEstimate     = "#e07b00"
	colLocal        = "#3a7dc9"
	colLimit        = "#c62828"
	colAdmitted     = "#2e7d32"
	colDenied       = "#c62828"
	fontFamily      = "Helvetica, Arial, sans-serif"
	legendLineWidth = 28
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
	step := niceStep(yMax / 6)
	yMax = math.Ceil(yMax/step) * step
	x := func(t int64) float64 { return plotL + float64(t-from)/float64(span)*(plotR-plotL) }
	y := func(v float64) float64 { return plotB - v/yMax*(plotB-plotT) }

	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s" font-size="13">
<rect width="100%%" height="100%%" fill="white"/>
<text x="%d" y="28" font-size="16" font-weight="bold">%s</text>
<text x="%d" y="50" fill="#444">streamlimit sim — exact sliding-window count of admitted requests vs the estimate site dc1 decides on</text>
`, svgW, svgH, svgW, svgH, fontFamily, plotL, esc(title), plotL)
	// Grid and axes.
	b.WriteString(`<g id="axes" stroke="#ddd" stroke-width="1">` + "\n")
	for v := 0.0; v <= yMax+step/2; v += step {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`+"\n", plotL, y(v), plotR, y(v))
	}
	tStep := niceStep(float64(span) / 1000 / 10)
	for s := math.Ceil(float64(from)/1000/tStep) * tStep; s*1000 <= float64(to); s += tStep {
		xs := x(int64(s * 1000))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`+"\n", xs, plotT, xs, plotB)
	}
	b.WriteString("</g>\n")
	fmt.Fprintf(&b, `<g stroke="black" stroke-width="1"><line x1="%d" y1="%d" x2="%d" y2="%d"/><line x1="%d" y1="%d" x2="%d" y2="%d"/></g>`+"\n",
		plotL, plotT, plotL, plotB, plotL, plotB, plotR, plotB)
	b.WriteString(`<g id="labels" fill="#333">` + "\n")
	for v := 0.0; v <= yMax+step/2; v += step {
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", plotL-8, y(v)+4, v)
	}
	for s := math.Ceil(float64(from)/1000/tStep) * tStep; s*1000 <= float64(to); s += tStep {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%g</text>`+"\n", x(int64(s*1000)), plotB+18, s)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">time (s since start; warm-up ends at %gs)</text>`+"\n", (plotL+plotR)/2, plotB+34, float64(tr.WarmupMs)/1000)
	fmt.Fprintf(&b, `<text transform="translate(20 %d) rotate(-90)" text-anchor="middle">requests in the sliding window</text>`+"\n", (plotT+plotB)/2)
	b.WriteString("</g>\n")

	// Series.
	fmt.Fprintf(&b, `<line id="limit" x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-width="1.5" stroke-dasharray="8 5"/>`+"\n",
		plotL, y(float64(tr.Limit)), plotR, y(float64(tr.Limit)), colLimit)
	poly := func(id, col string, width float64, dash string, v func(TracePoint) float64) {
		fmt.Fprintf(&b, `<polyline id="%s" fill="none" stroke="%s" stroke-width="%g"`, id, col, width)
		if dash != "" {
			fmt.Fprintf(&b, ` stroke-dasharray="%s"`, dash)
		}
		b.WriteString(` points="`)
		for i, p := range pts {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%.1f,%.1f", x(p.T), y(v(p)))
		}
		b.WriteString(`"/>` + "\n")
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
	items := []struct{ label, col, dash string }{
		{"exact: admitted in (t−W, t], all sites", colExact, ""},
		{"estimate at dc1: snapshot remote + local", colEstimate, "6 3"},
		{"dc1 local exact count", colLocal, ""},
		{fmt.Sprintf("limit (%d)", tr.Limit), colLimit, "8 5"},
	}
	lx, ly := plotR-348, plotT+8
	fmt.Fprintf(&b, `<g id="legend"><rect x="%d" y="%d" width="340" height="%d" fill="white" fill-opacity="0.9" stroke="#bbb"/>`+"\n", lx, ly, 12+20*len(items))
	for i, it := range items {
		yy := ly + 18 + 20*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2.5"`, lx+10, yy-4, lx+10+legendLineWidth, yy-4, it.col)
		if it.dash != "" {
			fmt.Fprintf(&b, ` stroke-dasharray="%s"`, it.dash)
		}
		fmt.Fprintf(&b, `/><text x="%d" y="%d">%s</text>`+"\n", lx+16+legendLineWidth, yy, esc(it.label))
	}
	b.WriteString("</g>\n</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceStep rounds v up to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
	return r.Replace(s)
}
