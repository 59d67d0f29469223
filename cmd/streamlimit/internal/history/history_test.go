package history

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)

// Keys may hold commas and quotes (descriptor values); both formats must carry them intact.
func TestWriteRoundTrips(t *testing.T) {
	rows := []Row{
		{Start: t0.UnixMilli(), Key: `api|q="a,b"#60s`, Window: 60000, Site: "eu-1", Admitted: 3, Denied: 1},
		{Start: t0.Add(time.Minute).UnixMilli(), Key: "api|user=<42>&x#60s", Window: 0, Site: "us-1", Admitted: 9},
	}
	var b strings.Builder
	if err := Write(&b, CSV, rows); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(strings.NewReader(b.String())).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{CSVHeader,
		{"2026-11-25T10:00:00Z", `api|q="a,b"#60s`, "60000", "eu-1", "3", "1"},
		{"2026-11-25T10:01:00Z", "api|user=<42>&x#60s", "0", "us-1", "9", "0"}}
	if len(recs) != len(want) {
		t.Fatalf("csv %q", recs)
	}
	for i := range want {
		if strings.Join(recs[i], "\x00") != strings.Join(want[i], "\x00") {
			t.Errorf("csv line %d: %q, want %q", i, recs[i], want[i])
		}
	}

	b.Reset()
	if err := Write(&b, JSONLines, rows); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 2 || lines[1] != `{"start":"2026-11-25T10:01:00Z","ts":1795600860000,"key":"api|user=<42>&x#60s","w":0,"site":"us-1","n":9,"d":0}` {
		t.Fatalf("jsonl %q", lines)
	}
	var r jsonRow
	if err := json.Unmarshal([]byte(lines[0]), &r); err != nil || r.Key != rows[0].Key || r.N != 3 || r.D != 1 {
		t.Fatalf("jsonl line 0 %q: %+v %v", lines[0], r, err)
	}
}

func TestParseFormat(t *testing.T) {
	for in, want := range map[string]Format{"csv": CSV, "jsonl": JSONLines, "json": JSONLines} {
		if f, err := ParseFormat(in); f != want || err != nil {
			t.Errorf("ParseFormat(%q) = %q, %v", in, f, err)
		}
	}
	if _, err := ParseFormat("parquet"); !errors.Is(err, ErrNoParquet) {
		t.Errorf("parquet: %v", err)
	}
	if _, err := ParseFormat("xml"); err == nil {
		t.Error("xml accepted")
	}
}

// Bad ranges fail before any connection is made (there is no broker here).
func TestReplayRejectsBadOptions(t *testing.T) {
	for name, o := range map[string]Options{
		"no range":     {},
		"empty range":  {From: t0, To: t0},
		"reversed":     {From: t0, To: t0.Add(-time.Minute)},
		"sub-ms step":  {From: t0, To: t0.Add(time.Hour), Step: 1500 * time.Microsecond},
		"negative lag": {From: t0, To: t0.Add(time.Hour), Slack: -time.Second},
	} {
		if _, err := Replay(context.Background(), o); err == nil || !strings.HasPrefix(err.Error(), "history: ") {
			t.Errorf("%s: %v, want a history error", name, err)
		}
	}
}

func TestWritePlotChoosesTheWindow(t *testing.T) {
	rows := []Row{
		{Start: t0.UnixMilli(), Key: "k", Window: 60000, Site: "eu-1", Admitted: 3},
		{Start: t0.UnixMilli(), Key: "k", Window: 3600000, Site: "eu-1", Admitted: 3},
		{Start: t0.UnixMilli(), Key: "other", Window: 60000, Site: "eu-1", Admitted: 3},
	}
	o := PlotOptions{Key: "k", From: t0, To: t0.Add(5 * time.Minute), Step: time.Minute}
	var b strings.Builder
	if err := WritePlot(&b, rows, o); err == nil || !strings.Contains(err.Error(), "[60000 3600000]") {
		t.Errorf("two windows, none chosen: %v", err)
	}
	o.Window = 120000
	if err := WritePlot(&b, rows, o); err == nil {
		t.Error("a window the key does not have was plotted")
	}
	o.Key, o.Window = "nobody", 0
	if err := WritePlot(&b, rows, o); err == nil {
		t.Error("a key without rows was plotted")
	}
	o.Key, o.Window = "k", 60000
	if err := WritePlot(&b, rows, o); err != nil {
		t.Fatal(err)
	}
	// Five steps, the four empty ones drawn at zero; no refused requests, no denied series.
	s := b.String()
	i := strings.Index(s, `id="total"`)
	pts := strings.Fields(s[strings.Index(s[i:], `points="`)+i+8 : strings.Index(s[i:], `"/>`)+i])
	if len(pts) != 5 || strings.Contains(s, `id="denied"`) {
		t.Fatalf("total series %q; denied drawn: %v", pts, strings.Contains(s, `id="denied"`))
	}
}
