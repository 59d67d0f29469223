package testenv

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

var topicRE = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)

func TestTopicName(t *testing.T) {
	a := TopicName(t, "streamlimit.hits")
	b := TopicName(t, "streamlimit.hits")
	if a == b {
		t.Fatalf("two calls gave the same name %q", a)
	}
	for _, n := range []string{a, b} {
		if !topicRE.MatchString(n) || len(n) > 200 {
			t.Fatalf("invalid topic name %q", n)
		}
		if !strings.HasPrefix(n, "streamlimit.hits-TestTopicName-") {
			t.Fatalf("name %q lacks base and test name", n)
		}
	}
	t.Run("sub test/with spaces and ünïcode "+strings.Repeat("x", 300), func(t *testing.T) {
		n := TopicName(t, "base/with:bad chars")
		if !topicRE.MatchString(n) || len(n) > 200 {
			t.Fatalf("invalid topic name %q (len %d)", n, len(n))
		}
		if !strings.HasPrefix(n, "base-with-bad-chars-TestTopicName-sub_test-with_spaces_and_") {
			t.Fatalf("unexpected name %q", n)
		}
	})
}

func TestKeyPrefix(t *testing.T) {
	a, b := KeyPrefix(t), KeyPrefix(t)
	if a == b || !strings.HasPrefix(a, "test:TestKeyPrefix:") || !strings.HasSuffix(a, ":") {
		t.Fatalf("prefixes %q, %q", a, b)
	}
}

func TestRedisRoundTrip(t *testing.T) {
	c := RedisClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := KeyPrefix(t) + "k"
	want := "v-" + randHex(t)
	if err := c.Set(ctx, key, want, time.Minute).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	got, err := c.Get(ctx, key).Result()
	if err != nil || got != want {
		t.Fatalf("GET = %q, %v; want %q", got, err, want)
	}
}

// RedisClient keeps a test to its own keys and off the commands that would stall or wipe
// the shared server: a key of another space and CLIENT PAUSE fail with NOPERM; its own
// keys, a subtest's, and INFO work; the user is gone after the test.
func TestRedisClientIsolated(t *testing.T) {
	ctx := context.Background()
	var user string
	t.Run("inner", func(t *testing.T) {
		c := RedisClient(t)
		if err := c.Set(ctx, KeyPrefix(t)+"k", "v", time.Minute).Err(); err != nil {
			t.Fatalf("own key: %v", err)
		}
		t.Run("sub", func(t *testing.T) {
			if err := c.Set(ctx, KeyPrefix(t)+"k", "v", time.Minute).Err(); err != nil {
				t.Fatalf("a subtest's key: %v", err)
			}
		})
		for _, key := range []string{"other", "test:TestSomethingElse:k", "sl:x"} {
			if err := c.Set(ctx, key, "v", time.Minute).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("SET %s: %v, want NOPERM", key, err)
			}
		}
		for _, cmd := range [][]any{{"CLIENT", "PAUSE", "10"}, {"FLUSHALL"}, {"CONFIG", "GET", "maxmemory"}, {"KEYS", "*"}} {
			if err := c.Do(ctx, cmd...).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("%v: %v, want NOPERM", cmd, err)
			}
		}
		if err := c.Info(ctx, "commandstats").Err(); err != nil {
			t.Errorf("INFO: %v", err)
		}
		user = c.Options().Username
	})
	admin := redis.NewClient(&redis.Options{Addr: Redis(t)})
	defer admin.Close()
	if err := admin.Do(ctx, "ACL", "GETUSER", user).Err(); err != redis.Nil {
		t.Errorf("ACL GETUSER %s after the test: %v, want none", user, err)
	}
}

func TestKafkaRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	brokers, err := AdminClient(t).ListBrokers(ctx)
	if err != nil {
		t.Fatalf("ListBrokers: %v", err)
	}
	if len(brokers) == 0 || brokers[0].Host == "" || brokers[0].Port <= 0 {
		t.Fatalf("ListBrokers = %+v, want at least one broker with an address", brokers)
	}

	topic := CreateTopic(t, "testenv", 2, nil)
	prod := KafkaClient(t)
	want := "value-" + randHex(t)
	if err := prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(want)}).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	cons := KafkaClient(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	for {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("no record consumed: %v", err)
		}
		for _, e := range fs.Errors() {
			t.Logf("fetch error (retrying): %v", e.Err)
		}
		var got []string
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
		if len(got) > 0 {
			if len(got) != 1 || got[0] != want {
				t.Fatalf("consumed %q, want [%q]", got, want)
			}
			return
		}
	}
}

// TestPrivateKafkaRestart proves a private broker keeps its data across
// Stop(true) and Start, which fault tests rely on.
func TestPrivateKafkaRestart(t *testing.T) {
	RealParts(t)
	// Use the private broker only where the shared one is available, so
	// the same tests run on a machine with Docker but without a JDK.
	Kafka(t)
	b := PrivateKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topic := TopicName(t, "restart")
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic: %v", err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("before")}).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	addr := b.Addr()
	b.Stop(true)
	if got := b.Start(); got != addr {
		t.Fatalf("restarted on %s, want %s", got, addr)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	for {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("record produced before the restart was not consumed: %v", err)
		}
		var got []string
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
		if len(got) > 0 {
			if got[0] != "before" {
				t.Fatalf("consumed %q, want before", got)
			}
			return
		}
	}
}
