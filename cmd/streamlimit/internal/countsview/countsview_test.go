package countsview

import (
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/topics"
)

func TestFormatCount(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 3: "3", 12.5: "12.5", 12.25: "12.3", 99.96: "100", 0.04: "0", -0.01: "0", 1e6: "1000000"} {
		if got := FormatCount(v); got != want {
			t.Errorf("FormatCount(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestFormatAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		1234567 * time.Nanosecond: "1ms", 1500 * time.Millisecond: "1.5s", 90*time.Second + 400*time.Millisecond: "1m30s",
		-2 * time.Second: "-2s", 0: "0s",
	} {
		if got := FormatAge(d); got != want {
			t.Errorf("FormatAge(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestTableAlignsNumbersRight(t *testing.T) {
	tb := Table{Header: []string{"KEY", "TOTAL", "NOTE"}, Right: []bool{false, true}}
	tb.Add("a", "1.5", "x")
	tb.Add("longer|key", "100", "")
	var b strings.Builder
	if _, err := tb.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"KEY         TOTAL  NOTE\n" +
		"a             1.5  x\n" +
		"longer|key    100\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestTop(t *testing.T) {
	mk := func(key string, w time.Duration, sites ...topics.SiteCount) topics.Count {
		c := topics.Count{Key: key, Window: w.Milliseconds(), Sites: sites}
		for _, s := range sites {
			c.Total += s.Count
		}
		return c
	}
	counts := map[string]topics.Count{}
	for _, c := range []topics.Count{
		mk("a|1", time.Minute, topics.SiteCount{Site: "eu", Count: 5}),
		mk("a|2", time.Minute, topics.SiteCount{Site: "eu", Count: 1}, topics.SiteCount{Site: "us", Count: 9}),
		mk("a|3", time.Hour, topics.SiteCount{Site: "us", Count: 10}),
		mk("b|1", time.Minute, topics.SiteCount{Site: "eu", Count: 5}),
	} {
		counts[c.Key] = c
	}
	keys := func(cs []topics.Count) string {
		var k []string
		for _, c := range cs {
			k = append(k, c.Key)
		}
		return strings.Join(k, " ")
	}
	for _, tc := range []struct {
		o    TopOptions
		want string
	}{
		{TopOptions{}, "a|2 a|3 a|1 b|1"}, // ties (a|2 and a|3 at 10, a|1 and b|1 at 5) by key
		{TopOptions{N: 2}, "a|2 a|3"},
		{TopOptions{Site: "eu"}, "a|1 b|1 a|2"},
		{TopOptions{Prefix: "b|"}, "b|1"},
		{TopOptions{Window: time.Hour}, "a|3"},
		{TopOptions{Site: "ap"}, ""},
	} {
		if got := keys(Top(counts, tc.o)); got != tc.want {
			t.Errorf("Top(%+v) = %q, want %q", tc.o, got, tc.want)
		}
	}
}

func TestFreshnessAt(t *testing.T) {
	now := time.UnixMilli(10_000)
	f := FreshnessAt([]topics.Heartbeat{
		{Topic: "hits", AsOf: 9_000, Offset: 5, HighWatermark: 7},
		{Topic: "us.hits", AsOf: 6_500, Offset: 3, HighWatermark: 3, Replaying: true},
	}, now)
	if f != (Freshness{Sources: 2, OldestAge: 3500 * time.Millisecond, MaxLag: 2, Replaying: 1}) {
		t.Fatalf("%+v", f)
	}
	if f := FreshnessAt(nil, now); f.Sources != 0 {
		t.Fatalf("%+v", f)
	}
}

func TestAppendCountJSON(t *testing.T) {
	c := topics.Count{Key: "k", Window: 1000, AsOf: 500, Total: 2, Sites: []topics.SiteCount{{Site: "eu", Count: 2}}}
	b, err := AppendCountJSON([]byte("x"), &c, time.UnixMilli(1750))
	if err != nil || string(b) != `x{"key":"k","w":1000,"asof":500,"total":2,"sites":{"eu":2},"age_ms":1250}` {
		t.Fatalf("%s %v", b, err)
	}
	bad := topics.Count{Key: "", Window: 1}
	if b, err := AppendCountJSON([]byte("x"), &bad, time.Now()); err == nil || string(b) != "x" {
		t.Fatalf("invalid count: %s %v", b, err)
	}
}
