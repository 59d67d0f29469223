package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

// `aggregator --counts-format json` (docs/records.md) writes count records any JSON reader
// decodes, with the counts of the hits it read.
func TestAggregatorCommandCountsJSON(t *testing.T) {
	brokers := testenv.Kafka(t)
	cfg, err := topics.Config{}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	hits := testenv.CreateTopic(t, "hits", 2, nil)
	counts := testenv.CreateTopic(t, "counts", 2, cfg.CountsConfigs())
	now := time.Now()
	h := topics.Hit{Key: "api|user=42#60s", Site: "eu-1", BucketStart: now.UnixMilli(), Window: 60_000, Count: 4}
	v, err := h.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	cl := testenv.KafkaClient(t, kgo.DefaultProduceTopic(hits))
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte(h.Key), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cmd := newRootCmd()
	var out, errOut syncBuffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"aggregator", "--brokers", brokers, "--topics", hits, "--counts-topic", counts,
		"--group", testenv.TopicName(t, "group"), "--admin-listen", "127.0.0.1:0", "--counts-format", "json"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("aggregator: %v", err)
		}
	}()

	rd := testenv.KafkaClient(t, kgo.ConsumeTopics(counts), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
		fs := rd.PollFetches(pctx)
		pcancel()
		for _, r := range fs.Records() {
			if string(r.Key) != h.Key || r.Value == nil {
				continue
			}
			if !strings.HasPrefix(string(r.Value), "{") {
				t.Fatalf("count record is not JSON: %q", r.Value)
			}
			c, err := topics.DecodeCount(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			if c.Total != 4 || c.Site("eu-1") != 4 {
				t.Fatalf("count %+v, want 4 at eu-1", c)
			}
			readWithKcat(t, brokers, counts, h.Key)
			return
		}
	}
	t.Fatalf("no count of %s in %s within 60 s; aggregator said:\n%s", h.Key, counts, errOut.String())
}

// readWithKcat runs docs/records.md's kcat command on the counts topic while the aggregator
// writes to it, and checks that it exits (within a minute: without its stop offset it may
// not for minutes) and prints key's count as JSON.
func readWithKcat(t *testing.T, brokers, topic, key string) {
	t.Helper()
	doc, err := os.ReadFile("../../docs/records.md")
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(l, "kcat -C ") && strings.Contains(l, "-t counts") {
			line = l
		}
	}
	if line == "" {
		t.Fatal("docs/records.md has no kcat command reading counts")
	}
	testenv.Tool(t, "kcat", "apt-get install kcat")
	line = strings.Replace(line, "-b localhost:9092", "-b "+brokers, 1)
	line = strings.Replace(line, "-t counts", "-t "+topic, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	start := time.Now()
	out, err := cmd.Output()
	if ctx.Err() != nil {
		t.Fatalf("%s: still running after %v", line, time.Since(start).Round(time.Second))
	}
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	t.Logf("docs/records.md's kcat command exited in %v", time.Since(start).Round(time.Millisecond))
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(l, " ")
		if k != key {
			continue
		}
		var c struct {
			Total float64 `json:"total"`
		}
		if err := json.Unmarshal([]byte(v), &c); err != nil || c.Total != 4 {
			t.Fatalf("kcat printed %q: %v", l, err)
		}
		return
	}
	t.Fatalf("kcat printed no count of %s:\n%s", key, out)
}
