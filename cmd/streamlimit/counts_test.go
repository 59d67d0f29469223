package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// golden compares got with testdata/name.golden, or rewrites the file with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test -update rewrites it)\n--- got:\n%s\n--- want:\n%s", p, got, want)
	}
}

// t0 is the fixed "now" of the tests (the hidden --now flag).
var t0 = time.Date(2025, 11, 21, 15, 46, 40, 0, time.UTC)

const nowFlag = "--now=2025-11-21T15:46:40Z"

// countsFixture is what writeCounts puts into a fresh counts topic.
type countsFixture struct {
	brokers, topic string
	// final is the last count per live key.
	final map[string]topics.Count
	// history is every counter record per key, in order; nil marks a tombstone.
	history map[string][]*topics.Count
	records int
}

func cnt(key string, w time.Duration, ago time.Duration, sites ...any) topics.Count {
	c := topics.Count{Key: key, Window: w.Milliseconds(), AsOf: t0.Add(-ago).UnixMilli()}
	for i := 0; i < len(sites); i += 2 {
		v := sites[i+1].(float64)
		c.Sites = append(c.Sites, topics.SiteCount{Site: sites[i].(string), Count: v})
		c.Total += v
	}
	return c
}

// writeCounts creates a counts topic of 3 partitions and writes: keys updated several
// times, a key that ends on a tombstone, a count in the JSON encoding, two heartbeats and
// one undecodable record.
func writeCounts(t *testing.T) *countsFixture {
	t.Helper()
	cfg, err := topics.Config{}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	f := &countsFixture{
		brokers: testenv.Kafka(t),
		topic:   testenv.CreateTopic(t, "counts", 3, cfg.CountsConfigs()),
		final:   map[string]topics.Count{},
		history: map[string][]*topics.Count{},
	}
	var recs []*kgo.Record
	ts := t0.Add(-time.Minute)
	next := func() time.Time { ts = ts.Add(time.Second); return ts }
	put := func(c topics.Count, asJSON bool) {
		var v []byte
		var err error
		if asJSON {
			v, err = c.MarshalJSON()
		} else {
			v, err = c.MarshalBinary()
		}
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Key: []byte(c.Key), Value: v, Timestamp: next()})
		f.history[c.Key] = append(f.history[c.Key], &c)
		f.final[c.Key] = c
	}
	del := func(key string) {
		recs = append(recs, &kgo.Record{Key: []byte(key), Timestamp: next()})
		f.history[key] = append(f.history[key], nil)
		delete(f.final, key)
	}
	put(cnt("api|user=42#60s", time.Minute, 9*time.Second, "eu-1", 4.0), false)
	put(cnt("api|user=7#60s", time.Minute, 8*time.Second, "us-1", 3.0), false)
	put(cnt("login|user=42#60s", time.Minute, 7*time.Second, "eu-1", 1.0), false)
	put(cnt("api|user=42#60s", time.Minute, 5*time.Second, "eu-1", 8.0, "us-1", 1.0), false)
	put(cnt("api|ip=10.0.0.1#3600s", time.Hour, 30*time.Second, "ap-1", 99.96), false)
	del("login|user=42#60s")
	put(cnt("api|user=7#60s", time.Minute, 1500*time.Millisecond, "ap-1", 5.0, "eu-1", 5.0, "us-1", 20.0), false)
	put(cnt("web|user=9#60s", time.Minute, 3*time.Second, "eu-1", 3.0), true)
	put(cnt("api|user=42#60s", time.Minute, 2*time.Second, "eu-1", 10.0, "us-1", 2.5), false)
	for _, hb := range []topics.Heartbeat{
		{Instance: "agg-a", Topic: "hits", Partition: 0, AsOf: t0.Add(-time.Second).UnixMilli(), Offset: 100, HighWatermark: 100},
		{Instance: "agg-b", Topic: "us.hits", Partition: 1, AsOf: t0.Add(-3200 * time.Millisecond).UnixMilli(), Offset: 40, HighWatermark: 45},
	} {
		v, err := hb.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Key: []byte(topics.HeartbeatKey(hb.Topic, hb.Partition)), Value: v, Timestamp: next()})
	}
	recs = append(recs, &kgo.Record{Key: []byte("api|bad#60s"), Value: []byte{0xff, 1, 2}, Timestamp: next()})
	f.records = len(recs)
	produce(t, f, recs...)
	return f
}

func produce(t *testing.T, f *countsFixture, recs ...*kgo.Record) {
	t.Helper()
	cl := testenv.KafkaClient(t, kgo.DefaultProduceTopic(f.topic), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// countJSON is one count as the CLI prints it in JSON.
type countJSON struct {
	topics.Count
	AgeMs int64
}

func decodeCountJSON(t *testing.T, b []byte) countJSON {
	t.Helper()
	var age struct {
		AgeMs *int64 `json:"age_ms"`
	}
	if err := json.Unmarshal(b, &age); err != nil || age.AgeMs == nil {
		t.Fatalf("no age_ms in %s: %v", b, err)
	}
	// The contract's decoder is strict; drop the extra field before handing it over.
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "age_ms")
	rest, _ := json.Marshal(m)
	c, err := topics.DecodeCount(rest)
	if err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return countJSON{c, *age.AgeMs}
}

func TestCounts(t *testing.T) {
	f := writeCounts(t)
	base := []string{"--brokers", f.brokers, "--counts-topic", f.topic, nowFlag}
	counts := func(args ...string) (string, error) {
		out, _, err := runSplit(t, append(append([]string{"counts"}, args...), base...)...)
		return out, err
	}

	t.Run("get json", func(t *testing.T) {
		out, err := counts("get", "api|user=42#60s", "--json")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		got := decodeCountJSON(t, []byte(out))
		if want := f.final["api|user=42#60s"]; !reflect.DeepEqual(got.Count, want) || got.AgeMs != 2000 {
			t.Fatalf("got %+v age %d, want %+v age 2000", got.Count, got.AgeMs, want)
		}
		if want := `{"key":"api|user=42#60s","w":60000,"asof":1763739998000,"total":12.5,"sites":{"eu-1":10,"us-1":2.5},"age_ms":2000}` + "\n"; out != want {
			t.Fatalf("get --json\n got %s\nwant %s", out, want)
		}
	})
	t.Run("get missing and deleted", func(t *testing.T) {
		for key, reason := range map[string]string{"nobody#60s": "no record", "login|user=42#60s": "deleted"} {
			_, err := counts("get", key)
			if err == nil || !strings.Contains(err.Error(), "not in topic") || !strings.Contains(err.Error(), reason) {
				t.Errorf("get %s: %v, want an error saying %q", key, err, reason)
			}
		}
	})
	t.Run("get table", func(t *testing.T) {
		out, err := counts("get", "api|user=7#60s")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		golden(t, "counts_get", out)
	})

	top := func(t *testing.T, args ...string) []string {
		t.Helper()
		out, err := counts(append([]string{"top", "--json"}, args...)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var raw []json.RawMessage
		if err := json.Unmarshal([]byte(out), &raw); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		var keys []string
		for _, r := range raw {
			c := decodeCountJSON(t, r)
			if want := f.final[c.Key]; !reflect.DeepEqual(c.Count, want) || c.AgeMs != t0.UnixMilli()-want.AsOf {
				t.Errorf("top row %+v, wrote %+v", c, want)
			}
			keys = append(keys, c.Key)
		}
		return keys
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		// The tombstoned key, the heartbeats and the bad record are not counters.
		{"all", nil, []string{"api|ip=10.0.0.1#3600s", "api|user=7#60s", "api|user=42#60s", "web|user=9#60s"}},
		{"n", []string{"-n", "2"}, []string{"api|ip=10.0.0.1#3600s", "api|user=7#60s"}},
		{"site", []string{"--site", "us-1"}, []string{"api|user=7#60s", "api|user=42#60s"}},
		{"prefix", []string{"--prefix", "api|user="}, []string{"api|user=7#60s", "api|user=42#60s"}},
		{"window", []string{"--window", "1m", "--site", "eu-1"}, []string{"api|user=42#60s", "api|user=7#60s", "web|user=9#60s"}},
		{"none", []string{"--prefix", "nope"}, nil},
	} {
		t.Run("top "+tc.name, func(t *testing.T) {
			if got := top(t, tc.args...); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("top %v = %q, want %q", tc.args, got, tc.want)
			}
		})
	}
	t.Run("top table", func(t *testing.T) {
		out, err := counts("top")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		golden(t, "counts_top", out)
		out, err = counts("top", "--site", "us-1", "-n", "1")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		golden(t, "counts_top_site", out)
	})

	t.Run("tail json", func(t *testing.T) {
		out, err := counts("tail", "--json", "--from-beginning", "--follow=false")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		// Partitions interleave freely; within a key (one partition) the order is the
		// order written.
		got := map[string][]*topics.Count{}
		for line := range strings.Lines(out) {
			var del struct {
				Key     string `json:"key"`
				Deleted bool   `json:"deleted"`
			}
			if err := json.Unmarshal([]byte(line), &del); err != nil {
				t.Fatalf("%v: %s", err, line)
			}
			if del.Deleted {
				got[del.Key] = append(got[del.Key], nil)
				continue
			}
			c := decodeCountJSON(t, []byte(line))
			got[c.Key] = append(got[c.Key], &c.Count)
		}
		if !reflect.DeepEqual(got, f.history) {
			t.Fatalf("tail:\n%s\nwant every record written: %v", out, f.history)
		}
	})
	t.Run("tail table", func(t *testing.T) {
		out, err := counts("tail", "--from-beginning", "--follow=false")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		// One line per counter record; sort them, since partitions interleave.
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		slices.Sort(lines)
		golden(t, "counts_tail", strings.Join(lines, "\n")+"\n")
	})
	t.Run("tail follows", func(t *testing.T) {
		var buf, errBuf syncBuffer
		cmd := newRootCmd()
		cmd.SetOut(&buf)
		cmd.SetErr(&errBuf)
		n := 0
		for _, h := range f.history {
			n += len(h)
		}
		cmd.SetArgs(append([]string{"counts", "tail", "--from-beginning", "--json", "--max", strconv.Itoa(n + 1), "--for", "2m"}, base...))
		done := make(chan error, 1)
		go func() { done <- cmd.ExecuteContext(context.Background()) }()
		eventually(t, "tail to print the existing records", func() bool { return strings.Count(buf.String(), "\n") >= n })
		c := cnt("late|user=1#60s", time.Minute, 0, "eu-1", 1.0)
		v, _ := c.MarshalBinary()
		produce(t, f, &kgo.Record{Key: []byte(c.Key), Value: v})
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("tail did not stop after --max records")
		}
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != n+1 {
			t.Fatalf("%d lines, want %d:\n%s", len(lines), n+1, buf.String())
		}
		if got := decodeCountJSON(t, []byte(lines[n])); !reflect.DeepEqual(got.Count, c) || got.AgeMs != 0 {
			t.Fatalf("last line %s, want %+v", lines[n], c)
		}
	})
}

// runSplit executes the CLI with args and returns its stdout, stderr and error.
func runSplit(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := newRootCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err = cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// syncBuffer is a log or output read while it is written.
type syncBuffer = testenv.SyncBuffer

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, time.Minute, what, cond)
}
