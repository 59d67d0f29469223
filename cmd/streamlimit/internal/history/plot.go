package history

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/streamlimit/streamlimit/internal/svgplot"
)

// PlotOptions says what WritePlot draws. Key, From, To and Step are required.
type PlotOptions struct {
	// Key is the counter key to draw.
	Key string
	// Window selects the key's counter when its hits count toward several windows (in
	// ms); 0 accepts a key with one window only.
	Window int64
	// From, To and Step are the range and the step the rows were made with.
	From, To time.Time
	Step     time.Duration
	// Title is drawn above the plot. Default: the key and the range.
	Title string
}

// chart geometry, in px: the simulator's plot area, without its decision ticks.
const (
	plotW, plotH   = 960, 480
	plotL, plotR   = 70, 930
	plotT, plotB   = 70, 400
	colTotal       = "#555555"
	colDeniedTotal = "#c62828"
)

// siteColors are the sites' colours, in site name order (repeating past the last).
var siteColors = [...]string{"#3a7dc9", "#e07b00", "#2e7d32", "#8e44ad", "#00838f", "#ad1457", "#6d4c41", "#7cb342"}

// WritePlot draws one key's usage over time: per step, the hits admitted at each site, at
// all sites together, and the requests refused at all sites (when any were). Steps without
// rows are drawn as zero. It fails when rows hold nothing of the key, or hold it for several
// windows and PlotOptions.Window does not choose one.
func WritePlot(w io.Writer, rows []Row, o PlotOptions) error {
	if o.Step <= 0 || !o.From.Before(o.To) {
		return errors.New("history: plot: from, to and step are required")
	}
	var windows []int64
	for _, r := range rows {
		if r.Key == o.Key && !slices.Contains(windows, r.Window) {
			windows = append(windows, r.Window)
		}
	}
	slices.Sort(windows)
	switch {
	case len(windows) == 0:
		return fmt.Errorf("history: plot: no hits of key %q in the range", o.Key)
	case o.Window == 0 && len(windows) > 1:
		return fmt.Errorf("history: plot: key %q counts toward windows %v ms: choose one", o.Key, windows)
	case o.Window == 0:
		o.Window = windows[0]
	case !slices.Contains(windows, o.Window):
		return fmt.Errorf("history: plot: no hits of key %q toward a %d ms window (it has %v)", o.Key, o.Window, windows)
	}
	step := o.Step.Milliseconds()
	first := o.From.UnixMilli() - floorMod(o.From.UnixMilli(), step)
	n := int((o.To.UnixMilli() - first + step - 1) / step) // steps in [first, To)
	perSite := make(map[string][]float64)
	total, denied := make([]float64, n), make([]float64, n)
	anyDenied := false
	for _, r := range rows {
		if r.Key != o.Key || r.Window != o.Window {
			continue
		}
		i := int((r.Start - first) / step)
		if i < 0 || i >= n {
			continue
		}
		s := perSite[r.Site]
		if s == nil {
			s = make([]float64, n)
			perSite[r.Site] = s
		}
		s[i] += float64(r.Admitted)
		total[i] += float64(r.Admitted)
		denied[i] += float64(r.Denied)
		anyDenied = anyDenied || r.Denied > 0
	}
	sites := make([]string, 0, len(perSite))
	for s := range perSite {
		sites = append(sites, s)
	}
	slices.Sort(sites)

	yMax := 1.0
	for i := range n {
		yMax = max(yMax, total[i]*1.05, denied[i]*1.05)
	}
	yStep := svgplot.NiceStep(yMax / 6)
	yMax = math.Ceil(yMax/yStep) * yStep
	// A point per step, at the step's middle.
	xs := make([]float64, n)
	for i := range n {
		xs[i] = float64(first + int64(i)*step + step/2)
	}
	x0, x1 := float64(first), float64(first+int64(n)*step)
	fr := svgplot.Frame{Left: plotL, Right: plotR, Top: plotT, Bottom: plotB, X0: x0, X1: x1, YMax: yMax, YStep: yStep,
		XTitle: "time (UTC)", YTitle: "requests per " + shortDuration(o.Step)}
	tick := timeTick(time.Duration(x1-x0) * time.Millisecond / 10)
	layout := "15:04"
	if tick < time.Minute {
		layout = "15:04:05"
	}
	fr.XLabel = func(ms float64) string { return time.UnixMilli(int64(ms)).UTC().Format(layout) }
	tk := tick.Milliseconds()
	for t := int64(x0) + floorMod(-int64(x0), tk); float64(t) <= x1; t += tk {
		fr.XTicks = append(fr.XTicks, float64(t))
	}

	title := o.Title
	if title == "" {
		title = o.Key
	}
	sub := fmt.Sprintf("streamlimit counts plot — %s to %s, per %s, window %s, from the hits topics",
		o.From.UTC().Format(time.RFC3339), o.To.UTC().Format(time.RFC3339), shortDuration(o.Step), shortDuration(time.Duration(o.Window)*time.Millisecond))
	var b strings.Builder
	svgplot.Header(&b, plotW, plotH, plotL, title, sub)
	fr.Write(&b)
	series := func(v []float64) [][2]float64 {
		pts := make([][2]float64, n)
		for i := range n {
			pts[i] = [2]float64{xs[i], v[i]}
		}
		return pts
	}
	var legend []svgplot.LegendItem
	for i, s := range sites {
		col := siteColors[i%len(siteColors)]
		fr.Polyline(&b, "site-"+s, col, 1.5, "", series(perSite[s]))
		legend = append(legend, svgplot.LegendItem{Label: "admitted at " + s, Color: col})
	}
	fr.Polyline(&b, "total", colTotal, 2.5, "", series(total))
	legend = append(legend, svgplot.LegendItem{Label: "admitted, all sites", Color: colTotal})
	if anyDenied {
		fr.Polyline(&b, "denied", colDeniedTotal, 1.5, "6 3", series(denied))
		legend = append(legend, svgplot.LegendItem{Label: "refused, all sites", Color: colDeniedTotal, Dash: "6 3"})
	}
	svgplot.Legend(&b, plotR-268, plotT+8, 260, legend)
	svgplot.Footer(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// timeTick returns the first of the usual clock intervals at least d.
func timeTick(d time.Duration) time.Duration {
	for _, t := range []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
		time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour} {
		if t >= d {
			return t
		}
	}
	return 24 * time.Hour * time.Duration(math.Ceil(float64(d)/float64(24*time.Hour)))
}

// shortDuration prints d without zero minutes and seconds: 1m, 1h, 1h30m, 1.5s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
