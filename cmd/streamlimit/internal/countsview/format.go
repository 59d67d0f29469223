package countsview

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/streamlimit/streamlimit/topics"
)

// FormatCount formats a count with at most one decimal ("12", "12.5"), rounding half away
// from zero.
func FormatCount(v float64) string {
	r := math.Round(v*10) / 10
	if r == 0 {
		r = 0 // no "-0"
	}
	return strconv.FormatFloat(r, 'f', -1, 64)
}

// FormatAge formats a non-negative age compactly: to the millisecond under a second, to
// the tenth of a second under a minute, to the second above. A negative age (a clock ahead
// of ours) is shown with its sign.
func FormatAge(d time.Duration) string {
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	switch {
	case d < time.Second:
		d = d.Round(time.Millisecond)
	case d < time.Minute:
		d = d.Round(100 * time.Millisecond)
	default:
		d = d.Round(time.Second)
	}
	return sign + d.String()
}

// FormatTime formats a unix-millisecond instant in UTC, to the millisecond.
func FormatTime(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
}

// FormatSites formats a count's breakdown as "eu-1 10, us-1 2.5", or "-" when empty.
func FormatSites(c *topics.Count) string {
	if len(c.Sites) == 0 {
		return "-"
	}
	parts := make([]string, len(c.Sites))
	for i, s := range c.Sites {
		parts[i] = s.Site + " " + FormatCount(s.Count)
	}
	return strings.Join(parts, ", ")
}

// AppendCountJSON appends c's contract JSON form (topics.Count.AppendJSON) with one more
// field, "age_ms": now − AsOf in milliseconds.
func AppendCountJSON(dst []byte, c *topics.Count, now time.Time) ([]byte, error) {
	start := len(dst)
	dst, err := c.AppendJSON(dst)
	if err != nil {
		return dst[:start], err
	}
	dst = dst[:len(dst)-1] // the closing brace
	dst = append(dst, `,"age_ms":`...)
	dst = strconv.AppendInt(dst, now.UnixMilli()-c.AsOf, 10)
	return append(dst, '}'), nil
}

// Table lays out rows of cells in aligned columns with text/tabwriter. Columns marked in
// Right are right-aligned (numbers); the others are left-aligned. The zero value is an
// empty table without a header.
type Table struct {
	// Header is the first row; none when nil.
	Header []string
	// Right[i] right-aligns column i.
	Right []bool
	// Rows are the data rows; a row may have fewer cells than the header.
	Rows [][]string
}

// Add appends one row.
func (t *Table) Add(cells ...string) { t.Rows = append(t.Rows, cells) }

// WriteTo writes the table to w, columns separated by two spaces, without trailing
// blanks.
func (t *Table) WriteTo(w io.Writer) (int64, error) {
	rows := t.Rows
	if t.Header != nil {
		rows = append([][]string{t.Header}, rows...)
	}
	// tabwriter aligns left; pad right-aligned cells to their column's width first, so
	// that equal-width cells line up on the right.
	width := map[int]int{}
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		for i, c := range r {
			if i < len(t.Right) && t.Right[i] {
				c = strings.Repeat(" ", width[i]-utf8.RuneCountInString(c)) + c
			}
			if i > 0 {
				fmt.Fprint(tw, "\t")
			}
			fmt.Fprint(tw, c)
		}
		fmt.Fprint(tw, "\n")
	}
	if err := tw.Flush(); err != nil {
		return 0, err
	}
	var out strings.Builder
	for line := range strings.Lines(b.String()) {
		out.WriteString(strings.TrimRight(line, " \n"))
		out.WriteByte('\n')
	}
	n, err := io.WriteString(w, out.String())
	return int64(n), err
}
