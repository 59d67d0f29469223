// Package examples holds clients of streamlimit in other languages (python/, java/) and
// the test that runs them against a real Kafka broker and a real aggregator.
package examples

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topicadmin"
	"github.com/streamlimit/streamlimit/topics"
)

// need fails the test under CI=true, and skips it otherwise, when a tool it needs is
// missing, with the hint to install it.
func need(t *testing.T, what, hint string) {
	t.Helper()
	testenv.Unavailable(t, "%s is missing: %s", what, hint)
}

// kafkaClientJars returns the classpath of Apache Kafka's Java client: the jars that
// e2e/services/kafka.sh fetched from Maven Central for the test broker.
func kafkaClientJars(t *testing.T) string {
	cache := os.Getenv("STREAMLIMIT_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "streamlimit")
	}
	jars, _ := filepath.Glob(filepath.Join(cache, "kafka-*", "libs", "kafka-clients-*.jar"))
	if len(jars) == 0 {
		return ""
	}
	return filepath.Join(filepath.Dir(jars[len(jars)-1]), "*")
}

// TestClientsInOtherLanguages runs the Python (confluent-kafka) and Java (kafka-clients)
// examples against the real broker with an aggregator counting their hits, once with each
// counts format: each publishes hits with its library's partitioner and reads the key's
// count back; the totals must be exact, and no hit may have landed on a partition that
// does not own its key.
func TestClientsInOtherLanguages(t *testing.T) {
	brokers := testenv.Kafka(t)
	python, err := exec.LookPath("python3")
	if err == nil {
		err = exec.Command(python, "-c", "import confluent_kafka").Run()
	}
	if err != nil {
		need(t, "python3 with confluent-kafka", "pip install -r examples/python/requirements.txt")
	}
	java, err := exec.LookPath("java")
	jars := kafkaClientJars(t)
	if err != nil || jars == "" {
		need(t, "java with Apache Kafka's client jars", "install Java 17 and run e2e/services/kafka.sh start once")
	}
	for _, format := range []string{aggregator.CountsBinary, aggregator.CountsJSON} {
		t.Run(format, func(t *testing.T) { runClients(t, brokers, format, python, java, jars) })
	}
}

// runClients runs both clients against an aggregator writing counts in format.
func runClients(t *testing.T, brokers, format, python, java, jars string) {
	cfg := topics.Config{HitsTopic: testenv.TopicName(t, "hits"), CountsTopic: testenv.TopicName(t, "counts"),
		HitsPartitions: 6, CountsPartitions: 3}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := topicadmin.Ensure(ctx, testenv.AdminClient(t), cfg); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	agg, err := aggregator.New(aggregator.Config{Brokers: []string{brokers}, Topics: []string{cfg.HitsTopic},
		CountsTopic: cfg.CountsTopic, CountsFormat: format, Group: testenv.TopicName(t, "group"), Registerer: reg,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- agg.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("aggregator: %v", err)
		}
	}()
	for deadline := time.Now().Add(60 * time.Second); !agg.Ready(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("aggregator not ready after 60 s")
		}
	}

	// A ten-minute window: the two clients' hits must still be in it when the second one
	// reads the count, however slowly the JVM starts on a loaded machine.
	key := "api|user=" + strings.ReplaceAll(t.Name(), "/", "_") + "#10m0s"
	common := []string{"--brokers", brokers, "--hits-topic", cfg.HitsTopic, "--counts-topic", cfg.CountsTopic,
		"--key", key, "--window-ms", "600000", "--timeout", "60"}
	run := func(name string, args ...string) string {
		t.Helper()
		cctx, stop := context.WithTimeout(ctx, 90*time.Second)
		defer stop()
		out, err := exec.CommandContext(cctx, args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s client: %v\n%s", name, err, out)
		}
		t.Logf("%s client:\n%s", name, out)
		return string(out)
	}
	out := run("python", append([]string{python, filepath.Join("python", "streamlimit_client.py"), "--site", "py", "--hits", "5"}, common...)...)
	if want := "count " + key + " total=5 py=5\n"; !strings.HasSuffix(out, want) {
		t.Errorf("python client printed %q, want it to end with %q", out, want)
	}
	if strings.Contains(out, offsetOutOfRange) {
		t.Errorf("python client logged %q: it fetched below a partition's log start", offsetOutOfRange)
	}
	out = run("java", append([]string{java, "-cp", jars, filepath.Join("java", "StreamlimitClient.java"), "--site", "java", "--hits", "7"}, common...)...)
	if want := "count " + key + " total=12 java=7 py=5\n"; !strings.HasSuffix(out, want) {
		t.Errorf("java client printed %q, want it to end with %q", out, want)
	}
	// Both partitioners placed every hit where the Go producer would: none was re-routed.
	if n := testenv.Counter(t, reg, "streamlimit_aggregator_rerouted_total"); n != 0 {
		t.Errorf("%v hits were re-routed: a client's partitioner does not match the producer's", n)
	}
}
