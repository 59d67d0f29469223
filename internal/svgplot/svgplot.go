// Package svgplot holds the house style of streamlimit's SVG line charts — a title and
// subtitle, a white plot area with a light grid, axes with tick labels, polylines and a
// legend box — shared by the simulator's plots and the usage history's plots. The output is
// self-contained SVG (no scripts, no external references).
package svgplot

import (
	"fmt"
	"math"
	"strings"
)

// FontFamily is the font of every chart.
const FontFamily = "Helvetica, Arial, sans-serif"

// Header writes the SVG root element, a white background, the title and the subtitle. The
// caller closes the root with Footer.
func Header(b *strings.Builder, width, height, left int, title, subtitle string) {
	fmt.Fprintf(b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s" font-size="13">
<rect width="100%%" height="100%%" fill="white"/>
<text x="%d" y="28" font-size="16" font-weight="bold">%s</text>
<text x="%d" y="50" fill="#444">%s</text>
`, width, height, width, height, FontFamily, left, Esc(title), left, Esc(subtitle))
}

// Footer closes the root element Header opened.
func Footer(b *strings.Builder) { b.WriteString("</svg>\n") }

// Frame is a plot area in px and the data ranges it shows: x from X0 to X1, y from 0 to
// YMax.
type Frame struct {
	Left, Right, Top, Bottom int
	X0, X1                   float64
	YMax, YStep              float64
	// XTicks are the x values of the vertical grid lines, labelled by XLabel.
	XTicks []float64
	XLabel func(x float64) string
	// XTitle and YTitle name the axes.
	XTitle, YTitle string
}

// X maps a data x to px.
func (f *Frame) X(v float64) float64 {
	return float64(f.Left) + (v-f.X0)/(f.X1-f.X0)*float64(f.Right-f.Left)
}

// Y maps a data y to px.
func (f *Frame) Y(v float64) float64 {
	return float64(f.Bottom) - v/f.YMax*float64(f.Bottom-f.Top)
}

// Write draws the grid, the axes, the tick labels and the axis titles.
func (f *Frame) Write(b *strings.Builder) {
	b.WriteString(`<g id="axes" stroke="#ddd" stroke-width="1">` + "\n")
	for i := 0; float64(i)*f.YStep <= f.YMax+f.YStep/2; i++ {
		v := float64(i) * f.YStep
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`+"\n", f.Left, f.Y(v), f.Right, f.Y(v))
	}
	for _, t := range f.XTicks {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`+"\n", f.X(t), f.Top, f.X(t), f.Bottom)
	}
	b.WriteString("</g>\n")
	fmt.Fprintf(b, `<g stroke="black" stroke-width="1"><line x1="%d" y1="%d" x2="%d" y2="%d"/><line x1="%d" y1="%d" x2="%d" y2="%d"/></g>`+"\n",
		f.Left, f.Top, f.Left, f.Bottom, f.Left, f.Bottom, f.Right, f.Bottom)
	b.WriteString(`<g id="labels" fill="#333">` + "\n")
	// Multiples of the step, not sums of it, so that 3 × 0.2 is labelled 0.6.
	for i := 0; float64(i)*f.YStep <= f.YMax+f.YStep/2; i++ {
		v := math.Round(float64(i)*f.YStep*1e9) / 1e9
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", f.Left-8, f.Y(v)+4, v)
	}
	for _, t := range f.XTicks {
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", f.X(t), f.Bottom+18, Esc(f.XLabel(t)))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", (f.Left+f.Right)/2, f.Bottom+34, Esc(f.XTitle))
	fmt.Fprintf(b, `<text transform="translate(20 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", (f.Top+f.Bottom)/2, Esc(f.YTitle))
	b.WriteString("</g>\n")
}

// Polyline draws one series through pts (data coordinates), dashed when dash is not empty.
func (f *Frame) Polyline(b *strings.Builder, id, color string, width float64, dash string, pts [][2]float64) {
	fmt.Fprintf(b, `<polyline id="%s" fill="none" stroke="%s" stroke-width="%g"`, Esc(id), color, width)
	if dash != "" {
		fmt.Fprintf(b, ` stroke-dasharray="%s"`, dash)
	}
	b.WriteString(` points="`)
	for i, p := range pts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(b, "%.1f,%.1f", f.X(p[0]), f.Y(p[1]))
	}
	b.WriteString(`"/>` + "\n")
}

// LegendItem is one line of a legend: a stroke sample and its label.
type LegendItem struct {
	Label, Color, Dash string
}

// legendLineWidth is the length of a legend's stroke sample, in px.
const legendLineWidth = 28

// Legend draws items in a white box of the given width whose top left corner is (x, y).
func Legend(b *strings.Builder, x, y, width int, items []LegendItem) {
	fmt.Fprintf(b, `<g id="legend"><rect x="%d" y="%d" width="%d" height="%d" fill="white" fill-opacity="0.9" stroke="#bbb"/>`+"\n", x, y, width, 12+20*len(items))
	for i, it := range items {
		yy := y + 18 + 20*i
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2.5"`, x+10, yy-4, x+10+legendLineWidth, yy-4, it.Color)
		if it.Dash != "" {
			fmt.Fprintf(b, ` stroke-dasharray="%s"`, it.Dash)
		}
		fmt.Fprintf(b, `/><text x="%d" y="%d">%s</text>`+"\n", x+16+legendLineWidth, yy, Esc(it.Label))
	}
	b.WriteString("</g>\n")
}

// NiceStep rounds v up to 1, 2 or 5 times a power of ten.
func NiceStep(v float64) float64 {
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

// Esc escapes s for SVG text and attribute values.
func Esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
	return r.Replace(s)
}
