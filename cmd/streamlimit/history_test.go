package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/cmd/streamlimit/internal/history"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/producer"
	"github.com/streamlimit/streamlimit/topics"
)

// historyFixture is what writeHistory puts into a fresh hits topic and its copy from
// another data center.
type historyFixture struct {
	brokers, hits string
	// t0 is the first minute of the range [t0, t0+3m) the tests export.
	t0 time.Time
}

// writeHistory produces, with the real producer, hits of site us-1 into a new hits topic
// and hits of site eu-1 into its MirrorMaker-2 copy "eu.<hits>", then adds by hand: an old
// record written before everything else (the seek by time must not read it), a JSON hit,
// an undecodable record and an aggregator's re-routed copy of a hit.
func writeHistory(t *testing.T) *historyFixture {
	t.Helper()
	f := &historyFixture{brokers: testenv.Kafka(t), hits: testenv.CreateTopic(t, "hits", 3, nil)}
	remote := topics.RemoteHitsTopic("eu", f.hits)
	adm := testenv.AdminClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if r, err := adm.CreateTopic(ctx, 3, 1, nil, remote); err != nil || r.Err != nil {
		t.Fatalf("create %s: %v %v", remote, err, r.Err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, remote)
	})
	// At least three minutes ago, on a multiple of 3 minutes (steps are multiples of the
	// step since the epoch): every bucket of the range has ended, and --step 3m puts the
	// whole range in one row.
	f.t0 = time.Now().UTC().Truncate(3 * time.Minute).Add(-3 * time.Minute)
	at := func(d time.Duration) time.Time { return f.t0.Add(d) }

	raw := testenv.KafkaClient(t, kgo.DefaultProduceTopic(f.hits), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.AllowAutoTopicCreation())
	rawHit := func(h topics.Hit, ts time.Time, headers ...kgo.RecordHeader) *kgo.Record {
		v, err := h.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return &kgo.Record{Key: []byte(h.Key), Value: v, Timestamp: ts, Headers: headers}
	}
	// An hour-old hit, first on its partition: found only by reading from the start.
	old := rawHit(topics.Hit{Key: "api|user=42#60s", Site: "us-1", BucketStart: at(-time.Hour).UnixMilli(), Window: 60000, Count: 50}, at(-time.Hour))
	if err := raw.ProduceSync(ctx, old).FirstErr(); err != nil {
		t.Fatal(err)
	}

	for _, site := range []struct {
		name, topic string
		hits        func(p *producer.Producer)
	}{
		{"us-1", f.hits, func(p *producer.Producer) {
			p.HitAt("api|user=42#60s", time.Minute, at(-time.Second), 7) // before the range
			// Once a record is out, the producer knows the topic's partitions and sends the
			// rest in hit batches, which the export reads hit by hit.
			if err := p.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			p.HitAt("api|user=42#60s", time.Minute, at(10*time.Second), 3)
			p.HitAt("api|user=42#60s", time.Minute, at(50*time.Second), 2)
			p.HitAt("api|user=42#60s", time.Hour, at(5*time.Second), 1) // the same key toward another window
			p.HitAt("api|user=42#60s", time.Minute, at(61*time.Second), 4)
			p.DeniedAt("api|user=42#60s", time.Minute, at(70*time.Second), 2)
			p.HitAt("api|user=7#60s", time.Minute, at(125*time.Second), 6)
		}},
		{"eu-1", remote, func(p *producer.Producer) {
			p.HitAt("api|user=42#60s", time.Minute, at(20*time.Second), 10)
		}},
	} {
		p, err := producer.New(producer.Config{Brokers: []string{f.brokers}, Topic: site.topic, Site: site.name,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		site.hits(p)
		if err := p.Close(ctx); err != nil {
			t.Fatalf("producer %s: %v", site.name, err)
		}
	}
	now := time.Now()
	jsonHit := &kgo.Record{Key: []byte("web|user=9#60s"), Timestamp: now,
		Value: []byte(`{"key":"web|user=9#60s","site":"ap-1","ts":` + itoa(at(30*time.Second).UnixMilli()) + `,"w":60000,"n":2}`)}
	bad := &kgo.Record{Key: []byte("api|user=42#60s"), Value: []byte{0xff, 1, 2}, Timestamp: now}
	copied := rawHit(topics.Hit{Key: "api|user=42#60s", Site: "us-1", BucketStart: at(15 * time.Second).UnixMilli(), Window: 60000, Count: 100},
		now, kgo.RecordHeader{Key: topics.HeaderRerouted, Value: []byte(f.hits + "/0/9")})
	if err := raw.ProduceSync(ctx, jsonHit, bad, copied).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return f
}

func itoa(v int64) string { b, _ := json.Marshal(v); return string(b) }

// historyCSV is the export of writeHistory's range, with its first minute written as
// 10:00 on the date of docs/operations.md's example (toDoc maps it back).
const historyCSV = `start,key,window_ms,site,admitted,denied
2026-11-25T10:00:00Z,api|user=42#60s,60000,eu-1,10,0
2026-11-25T10:00:00Z,api|user=42#60s,60000,us-1,5,0
2026-11-25T10:00:00Z,api|user=42#60s,3600000,us-1,1,0
2026-11-25T10:00:00Z,web|user=9#60s,60000,ap-1,2,0
2026-11-25T10:01:00Z,api|user=42#60s,60000,us-1,4,2
2026-11-25T10:02:00Z,api|user=7#60s,60000,us-1,6,0
`

// docDay is the first minute of the doc's example export.
var docDay = time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)

// toDoc rewrites the fixture's minutes as the doc's.
func (f *historyFixture) toDoc(s string) string {
	for i := range 3 {
		m := time.Duration(i) * time.Minute
		s = strings.ReplaceAll(s, f.t0.Add(m).Format(time.RFC3339), docDay.Add(m).Format(time.RFC3339))
	}
	return s
}

func TestCountsExport(t *testing.T) {
	f := writeHistory(t)
	rng := []string{"--brokers", f.brokers, "--hits-topic", f.hits,
		"--from", f.t0.Format(time.RFC3339), "--to", f.t0.Add(3 * time.Minute).Format(time.RFC3339)}
	export := func(args ...string) (string, string) {
		t.Helper()
		out, errOut, err := runSplit(t, append(append([]string{"counts", "export"}, rng...), args...)...)
		if err != nil {
			t.Fatalf("counts export %v: %v\n%s", args, err, errOut)
		}
		return out, errOut
	}

	t.Run("csv per minute", func(t *testing.T) {
		out, errOut := export()
		if got := f.toDoc(out); got != historyCSV {
			t.Fatalf("export\n got:\n%s\nwant:\n%s", got, historyCSV)
		}
		// 8 hit records in the range (one per producer bucket), the one before it, the
		// re-routed copy and the undecodable record skipped; the hour-old record not read.
		for _, want := range []string{"8 hits in 6 rows", "1 outside the range, 0 of other keys", "1 re-routed copies", "1 undecodable skipped (",
			topics.RemoteHitsTopic("eu", f.hits) + ", " + f.hits} {
			if !strings.Contains(errOut, want) {
				t.Errorf("summary %q lacks %q", errOut, want)
			}
		}
	})
	t.Run("jsonl with a step and a prefix", func(t *testing.T) {
		out, errOut := export("--format", "jsonl", "--step", "3m", "--prefix", "api|user=42")
		// The hits of other keys are counted as such, not as outside the range.
		if !strings.Contains(errOut, "1 outside the range, ") || strings.Contains(errOut, " 0 of other keys") {
			t.Errorf("summary %q: want the one record outside the range, and the other keys' hits apart", errOut)
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var r struct {
				Start     string
				TS        int64
				Key, Site string
				W, N, D   int64
			}
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			if r.TS != f.t0.UnixMilli() || r.Start != f.t0.Format(time.RFC3339) {
				t.Errorf("row %q does not start at %s (%d)", line, f.t0.Format(time.RFC3339), f.t0.UnixMilli())
			}
			got = append(got, r.Key+" "+itoa(r.W)+" "+r.Site+" "+itoa(r.N)+" "+itoa(r.D))
		}
		want := []string{"api|user=42#60s 60000 eu-1 10 0", "api|user=42#60s 60000 us-1 9 2", "api|user=42#60s 3600000 us-1 1 0"}
		if !slices.Equal(got, want) {
			t.Fatalf("3-minute rows %q, want %q", got, want)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		for _, args := range [][]string{{"--format", "parquet"}, {"--format", "xml"}, {"--step", "1500us"}, {"--to", f.t0.Add(-time.Minute).Format(time.RFC3339)}, {"--from", "yesterday"}} {
			_, _, err := runSplit(t, append(append([]string{"counts", "export"}, rng...), args...)...)
			if err == nil {
				t.Errorf("export %v succeeded", args)
			}
		}
		_, _, err := runSplit(t, "counts", "export", "--format", "parquet")
		if !errors.Is(err, history.ErrNoParquet) {
			t.Errorf("--format parquet: %v, want ErrNoParquet", err)
		}
	})
	t.Run("plot", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "user42.svg")
		_, _, err := runSplit(t, append([]string{"counts", "plot", "api|user=42#60s", "--svg", p}, rng...)...)
		if err == nil || !strings.Contains(err.Error(), "choose one") {
			t.Fatalf("plot of a key with two windows: %v, want an error asking for --window", err)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a failed plot left %s: %v", p, err)
		}
		if _, _, err := runSplit(t, append([]string{"counts", "plot", "api|user=42#60s", "--window", "1m", "--svg", p}, rng...)...); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		lines := svgPolylines(t, b)
		// One point per minute at its middle; y grows downwards. Minute 0: us-1 5, eu-1 10;
		// minute 1: us-1 4 and 2 refused; minute 2: nothing of this key.
		for id, want := range map[string][3]float64{"site-eu-1": {10, 0, 0}, "site-us-1": {5, 4, 0}, "total": {15, 4, 0}, "denied": {0, 2, 0}} {
			ys := lines[id]
			if len(ys) != 3 {
				t.Fatalf("series %q has %d points, want 3 (%v)", id, len(ys), lines)
			}
			base := lines["total"][2] // the zero line
			unit := (base - lines["total"][0]) / 15
			for i := range 3 {
				if got := (base - ys[i]) / unit; got < want[i]-0.01 || got > want[i]+0.01 {
					t.Errorf("series %q minute %d: %.2f, want %v", id, i, got, want[i])
				}
			}
		}
	})
}

// svgPolylines returns every polyline's y coordinates (px) by id, checking the SVG is
// well-formed.
func svgPolylines(t *testing.T, b []byte) map[string][]float64 {
	t.Helper()
	out := map[string][]float64{}
	dec := xml.NewDecoder(strings.NewReader(string(b)))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed: %v", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Local != "polyline" {
			continue
		}
		var id, pts string
		for _, a := range se.Attr {
			switch a.Name.Local {
			case "id":
				id = a.Value
			case "points":
				pts = a.Value
			}
		}
		for _, p := range strings.Fields(pts) {
			_, y, _ := strings.Cut(p, ",")
			var v float64
			if err := json.Unmarshal([]byte(y), &v); err != nil {
				t.Fatalf("point %q: %v", p, err)
			}
			out[id] = append(out[id], v)
		}
	}
}

// TestDocsHistory runs docs/operations.md's usage-history commands against writeHistory's
// topics and checks that its example export is what export prints for them.
func TestDocsHistory(t *testing.T) {
	sec := docSection(t, "../../docs/operations.md", "## Usage history from the hits topics")
	_, cmds, ok := strings.Cut(sec, "```sh\n")
	if !ok {
		t.Fatal("no sh block in docs/operations.md's usage history section")
	}
	cmds, _, _ = strings.Cut(cmds, "```")
	_, example, ok := strings.Cut(sec, "```csv\n")
	if !ok {
		t.Fatal("no csv block in docs/operations.md's usage history section")
	}
	example, _, _ = strings.Cut(example, "```")
	if example != historyCSV {
		t.Errorf("the doc's example export differs from the tested one:\n%s\nwant:\n%s", example, historyCSV)
	}
	if _, err := csv.NewReader(strings.NewReader(example)).ReadAll(); err != nil {
		t.Errorf("the doc's example export is not CSV: %v", err)
	}

	f := writeHistory(t)
	dir := t.TempDir()
	n := 0
	for _, line := range strings.Split(cmds, "\n") {
		line, _, _ = strings.Cut(line, "  #")
		if strings.TrimSpace(line) == "" {
			continue
		}
		args := shellWords(t, line)
		if args[0] != "streamlimit" {
			t.Fatalf("docs/operations.md command %q does not run streamlimit", line)
		}
		args = args[1:]
		for i, a := range args {
			if (a == "-o" || a == "--svg") && i+1 < len(args) {
				args[i+1] = filepath.Join(dir, args[i+1])
			}
		}
		// The doc's absolute range is the fixture's (its 10:00 = t0).
		for i, a := range args {
			if ts, err := time.Parse(time.RFC3339, a); err == nil {
				args[i] = f.t0.Add(ts.Sub(docDay)).Format(time.RFC3339)
			}
		}
		n++
		out, errOut, err := runSplit(t, append(args, "--brokers", f.brokers, "--hits-topic", f.hits)...)
		if err != nil {
			t.Errorf("docs/operations.md command %q: %v\n%s", line, err, errOut)
			continue
		}
		if slices.Contains(args, "--to") && !slices.Contains(args, "-o") && f.toDoc(out) != historyCSV {
			t.Errorf("docs/operations.md command %q printed\n%s\nwant the doc's example\n%s", line, f.toDoc(out), historyCSV)
		}
	}
	if n < 3 {
		t.Fatalf("%d docs/operations.md commands, want export, export and plot", n)
	}
}

// shellWords splits a command line as sh would for the docs' simple commands: words
// separated by spaces, single quotes kept together.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var out []string
	var w strings.Builder
	quoted, in := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, in = !quoted, true
		case r == ' ' && !quoted:
			if in {
				out = append(out, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(r)
			in = true
		}
	}
	if quoted {
		t.Fatalf("unbalanced quote in %q", line)
	}
	if in {
		out = append(out, w.String())
	}
	return out
}
