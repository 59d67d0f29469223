package e2e_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/sitestore"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/server"
	"github.com/streamlimit/streamlimit/topics"
)

// The rule every multi-DC test enforces: a global sliding window of ruleLimit requests per
// ruleWindow for each user. The window is short so that a test sees many windows quickly.
const (
	ruleLimit  = 100
	ruleWindow = 5 * time.Second
	domain     = "e2e"
)

func rulesYAML(limit int, window time.Duration) string {
	return fmt.Sprintf(`domain: %s
descriptors:
  - key: user
    rate_limit: {window: %s, requests_per_unit: %d, scope: global}
`, domain, window, limit)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	// Write and rename, so that the rules reloader never reads a half-written file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// redisTimeout is the enforcers' bound on a site counter call in these tests: the default.
const redisTimeout = sitestore.DefaultTimeout

func testLogger(t *testing.T) *slog.Logger {
	// Warnings and errors only: the tests' own t.Logf lines are the report.
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	if strings.Contains(string(p), "http: panic serving") {
		// net/http recovered it and closed the connection: the client saw only EOF.
		w.t.Error("an enforcer's HTTP handler panicked (above)")
	}
	return len(p), nil
}

// createTopics creates the named topics on brokers with the same partition count, waits for
// their leaders, and deletes them in t.Cleanup (best effort: the broker may be gone).
func createTopics(t *testing.T, brokers []string, partitions int32, configs map[string]*string, names ...string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, names...)
		cl.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := adm.CreateTopics(ctx, partitions, 1, configs, names...)
	if err != nil {
		t.Fatalf("create topics %v: %v", names, err)
	}
	for _, r := range resp {
		if r.Err != nil {
			t.Fatalf("create topic %s: %v", r.Topic, r.Err)
		}
	}
	eventually(t, 60*time.Second, "topic leaders", func() bool {
		md, err := adm.Metadata(ctx, names...)
		if err != nil {
			return false
		}
		for _, n := range names {
			td, ok := md.Topics[n]
			if !ok || td.Err != nil || len(td.Partitions) != int(partitions) {
				return false
			}
			for _, p := range td.Partitions {
				if p.Err != nil || p.Leader < 0 {
					return false
				}
			}
		}
		return true
	})
}

func compacted() map[string]*string {
	c, seg := "compact", "60000"
	return map[string]*string{"cleanup.policy": &c, "segment.ms": &seg}
}

func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, timeout, what, cond)
}

// site is one data center of the test: its hits topic, its enforcers and maybe a Redis.
type site struct {
	name      string
	topic     string
	enforcers int
	redis     *testenv.RedisServer
}

// node is one running enforcer server.
type node struct {
	site string
	srv  *server.Server
	reg  *prometheus.Registry
	addr string
	stop func()
}

// topology is a three-DC deployment on one Kafka cluster: eu writes base, us and ap their
// MirrorMaker-style copies "us.<base>" and "ap.<base>"; eu and us have two enforcers each on
// their own Redis, ap one enforcer counting in process; one aggregator group reads all by
// pattern into a compacted counts topic.
type topology struct {
	brokers []string
	base    string
	counts  string
	rules   string
	sites   []*site
	nodes   []*node
	agg     *aggregator.Aggregator
	aggReg  *prometheus.Registry
	aggStop func()
}

type topologyOptions struct {
	brokers      []string
	partitions   int32
	rules        string // YAML
	maxStaleness time.Duration
	// customize, when set, edits each server's config before New.
	customize func(*server.Config)
	// aggregator edits the aggregator's config before New.
	aggregator func(*aggregator.Config)
	// noAggregator leaves the aggregator to the test.
	noAggregator bool
}

func startTopology(t *testing.T, o topologyOptions) *topology {
	t.Helper()
	if o.partitions == 0 {
		o.partitions = 4
	}
	tp := &topology{brokers: o.brokers, base: testenv.TopicName(t, "hits"), counts: testenv.TopicName(t, "counts")}
	tp.sites = []*site{
		{name: "eu", topic: tp.base, enforcers: 2, redis: startPrivateRedis(t)},
		{name: "us", topic: topics.RemoteHitsTopic("us", tp.base), enforcers: 2, redis: startPrivateRedis(t)},
		{name: "ap", topic: topics.RemoteHitsTopic("ap", tp.base), enforcers: 1},
	}
	var hitsTopics []string
	for _, s := range tp.sites {
		hitsTopics = append(hitsTopics, s.topic)
	}
	createTopics(t, o.brokers, o.partitions, nil, hitsTopics...)
	createTopics(t, o.brokers, 2, compacted(), tp.counts)

	tp.rules = filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, tp.rules, o.rules)

	if !o.noAggregator {
		tp.aggReg = prometheus.NewRegistry()
		cfg := aggregator.Config{
			Brokers:      o.brokers,
			TopicPattern: topics.HitsPattern(tp.base),
			CountsTopic:  tp.counts,
			Group:        testenv.TopicName(t, "group"),
			MaxWindow:    time.Minute,
			Logger:       testLogger(t),
			Registerer:   tp.aggReg,
		}
		if o.aggregator != nil {
			o.aggregator(&cfg)
		}
		agg, err := aggregator.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		tp.agg = agg
		tp.aggStop = runInBackground(t, "aggregator", agg.Run)
		eventually(t, 90*time.Second, "aggregator ready", agg.Ready)
	}

	for _, s := range tp.sites {
		for i := range s.enforcers {
			reg := prometheus.NewRegistry()
			cfg := server.Config{
				Config: streamlimit.Config{
					Site:           s.name,
					Rules:          tp.rules,
					ReloadInterval: 200 * time.Millisecond,
					Brokers:        o.brokers,
					HitsTopic:      s.topic,
					CountsTopic:    tp.counts,
					MaxStaleness:   o.maxStaleness,
					Tuning:         enforcer.Tuning{DefaultShare: 1.0 / 3},
					// The default bound, stated here because the load tests read it: an
					// answer slower than it was decided in process (tested on its own in
					// TestFaultRedisDown), and checkBound lowers its floor near such answers.
					Redis:  sitestore.Redis{Timeout: redisTimeout},
					Logger: testLogger(t).With("site", s.name, "enforcer", i),
				},
				HTTPAddr: "127.0.0.1:0",
				GRPCAddr: "off",
				Registry: reg,
			}
			if s.redis != nil {
				cfg.Redis.Addrs = []string{s.redis.Addr()}
				cfg.SiteEnforcers = s.enforcers
			}
			if o.customize != nil {
				o.customize(&cfg)
			}
			srv, err := server.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			n := &node{site: s.name, srv: srv, reg: reg, addr: srv.HTTPAddr()}
			n.stop = runInBackground(t, "enforcer "+s.name, srv.Run)
			tp.nodes = append(tp.nodes, n)
		}
	}
	for _, n := range tp.nodes {
		eventually(t, 60*time.Second, "enforcer snapshot restored", func() bool { ok, _ := n.srv.Ready(); return ok })
	}
	return tp
}

// runInBackground runs f until the returned stop is called (or the test ends), and fails
// the test if f returns an error.
func runInBackground(t *testing.T, name string, f func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("%s did not stop within 60s", name)
		}
	}
	t.Cleanup(stop)
	return stop
}

// startPrivateRedis runs a redis-server of the test's own, so that the test can kill it.
func startPrivateRedis(t *testing.T) *testenv.RedisServer {
	t.Helper()
	return testenv.StartRedisServer(t, testenv.RedisServerOptions{})
}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// scrape reads the text exposition at url.
func scrape(t testing.TB, url string) []sample {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	return parseMetrics(t, resp.Body)
}

func parseMetrics(t testing.TB, r io.Reader) []sample {
	t.Helper()
	var out []sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			t.Fatalf("metrics line %q", line)
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		s := sample{labels: map[string]string{}, value: v}
		head := line[:sp]
		if i := strings.IndexByte(head, '{'); i >= 0 {
			s.name = head[:i]
			for _, kv := range splitLabels(strings.TrimSuffix(head[i+1:], "}")) {
				k, val, _ := strings.Cut(kv, "=")
				s.labels[k] = strings.Trim(val, `"`)
			}
		} else {
			s.name = head
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// splitLabels splits `a="x",b="y,z"` on the commas outside quotes.
func splitLabels(s string) []string {
	var out []string
	inQ, start := false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			inQ = !inQ
		case ',':
			if !inQ {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// metric sums the samples named name whose labels include want (alternating key, value).
func metric(samples []sample, name string, want ...string) float64 {
	var sum float64
	for _, s := range samples {
		if s.name != name {
			continue
		}
		ok := true
		for i := 0; i+1 < len(want); i += 2 {
			if s.labels[want[i]] != want[i+1] {
				ok = false
			}
		}
		if ok {
			sum += s.value
		}
	}
	return sum
}

// gather reads a registry in the same form.
func gather(t testing.TB, reg *prometheus.Registry) []sample {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []sample
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			s := sample{name: mf.GetName(), labels: map[string]string{}}
			for _, lp := range m.GetLabel() {
				s.labels[lp.GetName()] = lp.GetValue()
			}
			switch {
			case m.Counter != nil:
				s.value = m.Counter.GetValue()
			case m.Gauge != nil:
				s.value = m.Gauge.GetValue()
			case m.Histogram != nil:
				out = append(out, sample{name: mf.GetName() + "_count", labels: s.labels, value: float64(m.Histogram.GetSampleCount())})
				s.name, s.value = mf.GetName()+"_sum", m.Histogram.GetSampleSum()
			default:
				continue
			}
			out = append(out, s)
		}
	}
	return out
}

// percentile returns the p-quantile (0..1) of ds by the nearest-rank method.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// vmRSS returns the resident set size and its high-water mark of process pid, from
// /proc/<pid>/status, in bytes.
func vmRSS(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			hwm = kb << 10
		}
	}
	if rss == 0 {
		return 0, 0, errors.New("no VmRSS in /proc status")
	}
	return rss, hwm, nil
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
