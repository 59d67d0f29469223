package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topicadmin"
	"github.com/streamlimit/streamlimit/topics"
)

func describeJSON(t *testing.T, args ...string) []topicDesc {
	t.Helper()
	out, _, err := runSplit(t, append([]string{"topics", "describe", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("describe: %v\n%s", err, out)
	}
	var descs []topicDesc
	if err := json.Unmarshal([]byte(out), &descs); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return descs
}

func settingOf(d topicDesc, name string) topicSetting {
	for _, s := range d.Settings {
		if s.Name == name {
			return s
		}
	}
	return topicSetting{}
}

// Topics made by topicadmin.Ensure, plus a MirrorMaker-style copy of hits, match.
func TestTopicsDescribeMatches(t *testing.T) {
	brokers := testenv.Kafka(t)
	adm := testenv.AdminClient(t)
	cfg := topics.Config{HitsTopic: testenv.TopicName(t, "hits"), CountsTopic: testenv.TopicName(t, "counts"),
		HitsPartitions: 2, CountsPartitions: 3, ReplicationFactor: 1}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), cfg.HitsTopic, cfg.CountsTopic) })
	if _, err := topicadmin.Ensure(ctx, adm, cfg); err != nil {
		t.Fatal(err)
	}
	ncfg, _ := cfg.Normalize()
	remote := topics.RemoteHitsTopic("us", cfg.HitsTopic)
	if _, err := adm.CreateTopic(ctx, 2, 1, ncfg.HitsConfigs(), remote); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), remote) })
	// A new topic reaches every broker's metadata a little after CreateTopic returns.
	for {
		td, err := adm.ListTopics(ctx, remote)
		if err == nil && td.Has(remote) && td[remote].Err == nil && len(td[remote].Partitions) == 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%s never listed: %v", remote, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	args := []string{"--brokers", brokers, "--hits-topic", cfg.HitsTopic, "--counts-topic", cfg.CountsTopic,
		"--partitions", "2", "--counts-partitions", "3", "--replication-factor", "1"}
	descs := describeJSON(t, args...)
	if len(descs) != 3 || descs[0].Topic != cfg.HitsTopic || descs[1].Topic != remote || descs[1].Site != "us" || descs[2].Topic != cfg.CountsTopic {
		t.Fatalf("topics %+v", descs)
	}
	for _, d := range descs {
		if !d.Exists || !d.Match {
			t.Errorf("%s does not match: %+v", d.Topic, d.Settings)
		}
	}
	if s := settingOf(descs[2], "cleanup.policy"); s.Have != "compact" || s.Want != "compact" {
		t.Errorf("counts cleanup.policy %+v", s)
	}
	if s := settingOf(descs[0], "retention.ms"); s.Have != "86400000" {
		t.Errorf("hits retention.ms %+v", s)
	}
	out, _, err := runSplit(t, append([]string{"topics", "describe"}, args...)...)
	if err != nil || !strings.Contains(out, "all 3 topics match") || strings.Contains(out, "MISMATCH") {
		t.Fatalf("table: %v\n%s", err, out)
	}
}

// A counts topic that is not compacted and has the wrong partition count is shown as a
// mismatch; a missing hits topic as missing.
func TestTopicsDescribeMismatch(t *testing.T) {
	brokers := testenv.Kafka(t)
	counts := testenv.CreateTopic(t, "counts", 1, nil)
	hits := testenv.TopicName(t, "hits") // never created
	args := []string{"--brokers", brokers, "--hits-topic", hits, "--counts-topic", counts, "--counts-partitions", "3"}
	descs := describeJSON(t, args...)
	if len(descs) != 2 {
		t.Fatalf("topics %+v", descs)
	}
	if descs[0].Exists || descs[0].Match {
		t.Errorf("missing hits topic reported as %+v", descs[0])
	}
	c := descs[1]
	if !c.Exists || c.Match {
		t.Fatalf("counts %+v", c)
	}
	for name, want := range map[string]topicSetting{
		"partitions":     {Name: "partitions", Have: "1", Want: "3"},
		"cleanup.policy": {Name: "cleanup.policy", Have: "delete", Want: "compact"},
	} {
		if got := settingOf(c, name); got != want {
			t.Errorf("%s: %+v, want %+v", name, got, want)
		}
	}
	out, _, err := runSplit(t, append([]string{"topics", "describe"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"cleanup.policy", "delete", "compact", "MISMATCH", "differ from what ensure creates"} {
		if !strings.Contains(out, w) {
			t.Errorf("table lacks %q:\n%s", w, out)
		}
	}
}
