package sim

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// small is a matrix that runs in well under a second.
func small() Matrix {
	return Matrix{
		Scenarios: []Scenario{Uniform, Bursty},
		Sites:     []int{1, 3},
		Lags:      []time.Duration{0, 200 * time.Millisecond},
		Loads:     []float64{3},
		Base:      Config{Windows: 2, Seed: 7, Light: 1},
	}
}

func table(t *testing.T, m Matrix, parallel int) string {
	t.Helper()
	rs, err := RunMatrix(context.Background(), m, parallel)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WriteTable(&b, rs); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestDeterministic(t *testing.T) {
	a := table(t, small(), 1)
	b := table(t, small(), 2)
	if a != b {
		t.Fatalf("same seed, different tables:\n%s\n---\n%s", a, b)
	}
	if n := strings.Count(a, "\n| uniform |") + strings.Count(a, "\n| bursty |"); n != 8 {
		t.Fatalf("want 8 rows, got %d:\n%s", n, a)
	}
	m := small()
	m.Base.Seed = 8
	if c := table(t, m, 2); c == a {
		t.Fatal("another seed gave the same table: the seed is not used")
	}
}

func TestOracleHandMade(t *testing.T) {
	// limit 2 per 1000 ms; the window at t is (t−1000, t].
	arr := []Arrival{{0, 0}, {0, 1}, {0, 2}, {500, 0}, {999, 0}, {1000, 0}, {1001, 0}, {1500, 0}, {2001, 0}}
	// 0 yes, 0 yes, 0 no (2 in window), 500 no, 999 no, 1000 yes (the two at 0 left),
	// 1001 yes, 1500 no, 2001 yes (1000 left; 1001 still in).
	got := Oracle(arr, 2, 1000, 0)
	if got != (Ideal{Requests: 9, Admitted: 5}) {
		t.Fatalf("Oracle = %+v, want 9 requests, 5 admitted", got)
	}
	// Only requests from 1000 on count with a warm-up of 1000 ms.
	if got := Oracle(arr, 2, 1000, 1000); got != (Ideal{Requests: 4, Admitted: 3}) {
		t.Fatalf("Oracle with warm-up = %+v, want 4 requests, 3 admitted", got)
	}
}

func TestAccountingMatchesOracleDefinition(t *testing.T) {
	// Admitting exactly what the oracle admits gives no wrong decision and a max of 1.
	arr := []Arrival{{0, 0}, {0, 0}, {0, 0}, {500, 0}, {1000, 0}, {1001, 0}, {1500, 0}, {2001, 0}}
	acc := newAccounting(2, 1000, 0)
	var log []int64
	for _, a := range arr {
		n := 0
		for _, x := range log {
			if x > a.T-1000 {
				n++
			}
		}
		ok := n < 2
		if ok {
			log = append(log, a.T)
		}
		acc.decide(a.T, ok)
	}
	var r Result
	acc.result(&r)
	if r.WronglyAllowed != 0 || r.WronglyDenied != 0 || r.MaxRatio != 1 {
		t.Fatalf("exact decisions: %+v", r)
	}
	// Admitting everything: the third request at 0 and the one at 500 are wrongly allowed.
	acc = newAccounting(2, 1000, 0)
	for _, a := range arr[:4] {
		acc.decide(a.T, true)
	}
	acc.result(&r)
	// (Windows starting before the warm-up's end count as cold start.)
	if r.WronglyAllowed != 2 || r.ColdMaxRatio != 2 {
		t.Fatalf("admit all: wrongly allowed %d, max %v; want 2, 2", r.WronglyAllowed, r.ColdMaxRatio)
	}
}

func TestOneSiteNoLagIsNearlyExact(t *testing.T) {
	for _, sc := range Scenarios() {
		// With 1 ms sub-buckets the counting rule has no interpolated part: the enforcer
		// must then agree with the exact log on every admission.
		r, err := Run(context.Background(), Config{Scenario: sc, Sites: 1, Load: 5, Windows: 3, SubBuckets: 10000})
		if err != nil {
			t.Fatal(err)
		}
		_, d, _ := r.WrongPercent()
		if r.MaxRatio > 1 || r.WronglyAllowed != 0 || d > 1 || r.AdmittedVsIdeal() < 0.99 {
			t.Errorf("%s, 1 ms buckets: max %.3f, wrongly allowed %d, wrongly denied %.2f%%, admitted/ideal %.3f",
				sc, r.MaxRatio, r.WronglyAllowed, d, r.AdmittedVsIdeal())
		}
		// With the default 60 sub-buckets the oldest bucket is interpolated, which costs a
		// few percent at most (sub-windows are better, not perfect).
		r, err = Run(context.Background(), Config{Scenario: sc, Sites: 1, Load: 5, Windows: 3})
		if err != nil {
			t.Fatal(err)
		}
		if r.MaxRatio > 1.08 || r.AdmittedVsIdeal() < 0.98 || r.AggregatorErrors != 0 || r.SnapshotErrors != 0 {
			t.Errorf("%s, 60 buckets: max %.3f, admitted/ideal %.3f, errors %d/%d", sc, r.MaxRatio, r.AdmittedVsIdeal(), r.AggregatorErrors, r.SnapshotErrors)
		}
	}
}

func TestPipelineCarriesRemoteCounts(t *testing.T) {
	// Three sites must see each other through the aggregator: without the pipeline each
	// would admit its own share at least, with it the total stays near the limit.
	r, err := Run(context.Background(), Config{Scenario: Uniform, Sites: 3, Lag: 50 * time.Millisecond, Load: 3, Windows: 3, Light: 2, Trace: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.MaxRatio > 1.1 || r.AdmittedVsIdeal() < 0.9 {
		t.Fatalf("3 sites, 50 ms: max %.3f admitted/ideal %.3f", r.MaxRatio, r.AdmittedVsIdeal())
	}
	if r.LightDenied != 0 || r.LightRequests == 0 {
		t.Fatalf("light clients: %d of %d denied", r.LightDenied, r.LightRequests)
	}
	remote := 0.0
	for _, p := range r.Trace.Points {
		remote = max(remote, p.Remote)
	}
	if remote < 30 {
		t.Fatalf("site dc1 never saw more than %.1f remote requests in its snapshot", remote)
	}
}

func TestSVGWellFormed(t *testing.T) {
	r, err := Run(context.Background(), Config{Scenario: Uniform, Sites: 3, Lag: 200 * time.Millisecond, Load: 5, Windows: 2, Trace: true})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WriteSVG(&b, r, PlotOptions{}); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	dec := xml.NewDecoder(&b)
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			for _, a := range se.Attr {
				if a.Name.Local == "id" {
					ids[a.Value] = se.Name.Local
				}
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q", root)
	}
	for id, el := range map[string]string{"exact": "polyline", "estimate": "polyline", "local": "polyline", "limit": "line",
		"admitted": "path", "denied": "path", "legend": "g"} {
		if ids[id] != el {
			t.Errorf("series %q: got element %q, want %q", id, ids[id], el)
		}
	}
	if _, err := Run(context.Background(), Config{Windows: 1}); err != nil {
		t.Fatal(err)
	}
	if err := WriteSVG(io.Discard, Result{}, PlotOptions{}); err == nil {
		t.Fatal("plotting an untraced run succeeded")
	}
}

func TestCompareBoundaryBurst(t *testing.T) {
	// 100 requests in the last 10 ms of a fixed window and 100 in the first 10 ms of the
	// next: a fixed window admits all 200 within 20 ms.
	var arr []Arrival
	for i := range int64(200) {
		arr = append(arr, Arrival{T: 9990 + i/10})
	}
	res, err := Compare(context.Background(), CompareConfig{Arrivals: arr, Limit: 100, Window: 10 * time.Second, Windows: 2, Warmup: -1})
	if err != nil {
		t.Fatal(err)
	}
	got := map[Counter]CompareResult{}
	for _, r := range res {
		got[r.Counter] = r
	}
	if r := got[FixedWindow]; r.MaxRatio <= 1 || r.WronglyAllowed == 0 {
		t.Errorf("fixed window: max %.3f, wrongly allowed %d; want > 1 and > 0", r.MaxRatio, r.WronglyAllowed)
	}
	// The two-window counter rounds its weighted part down, which may admit one request
	// more than the exact log (package algo).
	for _, c := range []Counter{TwoWindow, SubWindows, ExactLog} {
		if r := got[c]; r.MaxRatio > 1.01 {
			t.Errorf("%s: max %.3f > 1 on a boundary burst", c, r.MaxRatio)
		}
	}
	if r := got[ExactLog]; r.WronglyAllowed != 0 || r.WronglyDenied != 0 || r.Admitted != r.Ideal.Admitted {
		t.Errorf("exact log disagrees with the oracle: %+v", r.Result)
	}
	// The generated bursty traffic ranks the methods as the textbook comparison does.
	res, err = Compare(context.Background(), CompareConfig{Windows: 4, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !(res[0].MaxRatio > res[2].MaxRatio && res[2].MaxRatio >= res[3].MaxRatio && res[3].MaxRatio == 1) {
		t.Errorf("bursty: fixed %.3f, sub-window %.3f, exact %.3f", res[0].MaxRatio, res[2].MaxRatio, res[3].MaxRatio)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{{Scenario: "nope"}, {Sites: -1}, {Lag: -time.Second}, {Window: time.Microsecond}} {
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, Config{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled run: %v", err)
	}
}

// The sweep's plot is well-formed XML with a line per scenario, its references drawn, a
// per-site split beyond the plot's top labelled with its figure.
func TestSweepSVGWellFormed(t *testing.T) {
	pts := []SweepPoint{
		{Scenario: DCMix, Setting: SweepServingSpan, Value: -1, MaxRatio: 1.02, Under: 0.16, Migrating: 0.29},
		{Scenario: DCMix, Setting: SweepServingSpan, Value: time.Second, MaxRatio: 1.02, Under: 0.12, Migrating: 0.22},
		{Scenario: DCMix, Setting: SweepServingSpan, Ref: RefSplit, MaxRatio: 1.02, Under: 12.6, Migrating: 50.9},
		{Scenario: DCBursty, Setting: SweepServingSpan, Value: time.Second, MaxRatio: 1.00, Under: -1, Migrating: -1},
	}
	var b bytes.Buffer
	if err := WriteSweepSVG(&b, pts); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	dec := xml.NewDecoder(strings.NewReader(s))
	for {
		if _, err := dec.Token(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("sweep SVG is not well-formed XML: %v", err)
		}
	}
	for _, want := range []string{`id="sweep-mix"`, "mix (1.02, 12.6%)", "exact central limiter", "Serving span"} {
		if !strings.Contains(s, want) {
			t.Errorf("sweep SVG lacks %q", want)
		}
	}
}
