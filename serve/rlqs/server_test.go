package rlqs

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/envoyfilter"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

const userRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {window: 10s, requests_per_unit: 100}
`

// recorder is a Publisher that counts what it is given.
type recorder struct {
	mu     sync.Mutex
	hits   map[string]int
	denied map[string]int
}

func (r *recorder) Hit(key string, _ time.Duration, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hits == nil {
		r.hits = map[string]int{}
	}
	r.hits[key] += n
}

func (r *recorder) Denied(key string, _ time.Duration, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.denied == nil {
		r.denied = map[string]int{}
	}
	r.denied[key] += n
}

func (r *recorder) get(key string) (hits, denied int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hits[key], r.denied[key]
}

// live is a Server on a real loopback listener, restartable on the same address.
type live struct {
	t    *testing.T
	srv  *Server
	pub  *recorder
	reg  *prometheus.Registry
	addr string
	gs   *grpc.Server
}

func startLive(t *testing.T, yaml string, opts Options) *live {
	t.Helper()
	cfg, err := rules.Parse("rules.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	pub := &recorder{}
	lim, err := enforcer.New(enforcer.Config{Rules: rules.Static(cfg), Site: "eu", Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	srv, err := NewServer(lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	l := &live{t: t, srv: srv, pub: pub, reg: reg, addr: "127.0.0.1:0"}
	l.serve()
	t.Cleanup(l.stop)
	return l
}

func (l *live) serve() {
	l.t.Helper()
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		l.t.Fatal(err)
	}
	l.addr = ln.Addr().String()
	l.gs = grpc.NewServer(ServerOption())
	l.srv.Register(l.gs)
	go func() { _ = l.gs.Serve(ln) }()
}

// stop cuts every stream at once, as a crashed server would.
func (l *live) stop() {
	if l.gs != nil {
		l.gs.Stop()
		l.gs = nil
	}
}

// envoy is one Envoy model connected to l.
func (l *live) envoy(opts envoyfilter.Options) *envoyfilter.Conn {
	l.t.Helper()
	cc, err := grpc.NewClient(l.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { _ = cc.Close() })
	if opts.Interval == 0 {
		// These tests check the protocol over real gRPC on the wall clock, not accuracy:
		// the Envoy reports at the server's assumed interval, shorter than Envoy's 5 s,
		// so that they run in a second or two. Accuracy is the simulator's (sim_test.go),
		// at Envoy's cadence.
		opts.Interval = l.srv.opts.ReportingInterval
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := envoyfilter.NewConn(ctx, envoyfilter.New(opts), cc, nil)
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	l.t.Cleanup(func() { cancel(); <-done })
	return c
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, what, cond)
}

var user42 = map[string]string{"user": "42"}

func settings(interval time.Duration) envoyfilter.Settings {
	return envoyfilter.Settings{ReportingInterval: interval}
}

// TestFirstRequestReportsAtOnce: a new bucket's first request is admitted by the default
// no_assignment_behavior and reported at once, and the server answers it with a token
// bucket, before the first periodic report; then the periodic reports come every interval
// and every admitted request is counted and published as a hit.
func TestFirstRequestReportsAtOnce(t *testing.T) {
	l := startLive(t, userRules, Options{ReportingInterval: time.Second})
	c := l.envoy(envoyfilter.Options{Domain: "api"})
	start := time.Now()
	if !c.Decide(user42, settings(time.Second)) {
		t.Fatal("first request denied under no_assignment_behavior ALLOW_ALL (unset)")
	}
	eventually(t, "the first assignment", func() bool { return c.Stats().Responses > 0 })
	if st := c.Stats(); st.Reports != 1 || time.Since(start) > 900*time.Millisecond {
		t.Fatalf("assignment after %d reports and %v: want it answering the immediate report, before the 1 s tick", st.Reports, time.Since(start))
	}
	strat, _ := c.Filter().Strategy(time.Now(), user42)
	tb := strat.GetTokenBucket()
	if tb == nil || tb.GetMaxTokens() < 1 || tb.GetFillInterval().AsDuration() != FillInterval {
		t.Fatalf("first assignment %v, want a token bucket", strat)
	}
	admitted := 1
	for range 20 {
		if c.Decide(user42, settings(time.Second)) {
			admitted++
		}
	}
	eventually(t, "two periodic reports", func() bool { return c.Stats().Reports >= 3 })
	eventually(t, "every admission published", func() bool { h, _ := l.pub.get("api|user=42#10s"); return h == admitted })
	if got := testutil.ToFloat64(l.srv.metrics.allowed); int(got) != admitted {
		t.Errorf("allowed_requests_total %v, want %d", got, admitted)
	}
}

// TestNoAssignmentDenyAll: with no_assignment_behavior DENY_ALL the first request is
// denied, reported as denied, and published as demand.
func TestNoAssignmentDenyAll(t *testing.T) {
	l := startLive(t, userRules, Options{ReportingInterval: time.Second})
	c := l.envoy(envoyfilter.Options{Domain: "api"})
	s := settings(time.Second)
	s.NoAssignment = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	if c.Decide(user42, s) {
		t.Fatal("first request admitted under DENY_ALL")
	}
	eventually(t, "the denial published as demand", func() bool { _, d := l.pub.get("api|user=42#10s"); return d == 1 })
	eventually(t, "an assignment", func() bool { return c.Stats().Responses > 0 })
	if !c.Decide(user42, s) {
		t.Error("denied once the server assigned room")
	}
}

// TestDisconnectKeepsAssignmentUntilTTL: when the server goes away, the Envoy keeps
// deciding on its last token bucket until the TTL, then on its expired fallback (DENY_ALL
// here) for its timeout, then on its no_assignment_behavior (ALLOW_ALL); when the server
// is back the stream is started again at the next report tick and assignments resume.
func TestDisconnectKeepsAssignmentUntilTTL(t *testing.T) {
	l := startLive(t, userRules, Options{ReportingInterval: 500 * time.Millisecond, TTL: 2 * time.Second})
	c := l.envoy(envoyfilter.Options{Domain: "api"})
	s := settings(500 * time.Millisecond)
	s.Expired = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	s.ExpiredTimeout = time.Second
	c.Decide(user42, s)
	eventually(t, "the first assignment", func() bool { return c.Stats().Responses > 0 })
	l.stop()
	last := c.Stats().LastResponse
	strat, _ := c.Filter().Strategy(last, user42)
	if strat.GetTokenBucket() == nil {
		t.Fatalf("strategy %v after the last response, want its token bucket", strat)
	}
	// The filter takes the time as an argument: its states after the cut can be read off at
	// any instant, exactly.
	for _, tc := range []struct {
		at   time.Duration
		want string
	}{
		{2*time.Second - time.Millisecond, "token_bucket"},
		{2 * time.Second, "DENY_ALL"},
		{3*time.Second - time.Millisecond, "DENY_ALL"},
		{3 * time.Second, "ALLOW_ALL (default)"},
	} {
		st, ok := c.Filter().Strategy(last.Add(tc.at), user42)
		got := "ALLOW_ALL (default)"
		switch {
		case !ok:
			got = "no bucket"
		case st.GetTokenBucket() != nil:
			got = "token_bucket"
		case st.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL && st != nil:
			got = "DENY_ALL"
		}
		if got != tc.want {
			t.Errorf("%v after the last assignment: %s, want %s", tc.at, got, tc.want)
		}
	}
	// Back: the next tick starts a new stream and the server assigns again.
	time.Sleep(700 * time.Millisecond) // a tick with no server: its reports are dropped
	if c.Stats().Dropped == 0 {
		t.Error("no report dropped while the server was away")
	}
	l.serve()
	eventually(t, "a new stream and an assignment on it", func() bool {
		st := c.Stats()
		return st.Streams >= 2 && st.LastResponse.After(last)
	})
}

// TestAbandonIdleBucket: a bucket reported idle for AbandonAfter is abandoned; the Envoy
// forgets it, and its next request makes it anew and reports it at once.
func TestAbandonIdleBucket(t *testing.T) {
	l := startLive(t, userRules, Options{ReportingInterval: 200 * time.Millisecond, AbandonAfter: 600 * time.Millisecond})
	c := l.envoy(envoyfilter.Options{Domain: "api"})
	c.Decide(user42, settings(200*time.Millisecond))
	eventually(t, "the bucket abandoned", func() bool { return c.Filter().Buckets() == 0 })
	if n := testutil.ToFloat64(l.srv.metrics.abandoned); n != 1 {
		t.Errorf("abandoned_total %v, want 1", n)
	}
	before := c.Stats().Reports
	c.Decide(user42, settings(200*time.Millisecond))
	if after := c.Stats().Reports; after != before+1 {
		t.Errorf("reports %d → %d on the abandoned bucket's next request, want one more at once", before, after)
	}
}

// TestClosedStreamStaysReservedUntilTTL: when a stream ends, its buckets' tokens and
// refill stay reserved — its Envoy may go on admitting on its last assignment — until the
// assignment's TTL has passed; then Sweep releases them and the other holders of the key
// get the room.
func TestClosedStreamStaysReservedUntilTTL(t *testing.T) {
	cfg, err := rules.Parse("rules.yaml", []byte(userRules))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	lim, err := enforcer.New(enforcer.Config{Rules: rules.Static(cfg), Site: "eu", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(lim, Options{Clock: clk, ReportingInterval: time.Second, TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	report := func(ss *session, allowed uint64) {
		t.Helper()
		if _, err := ss.handle(ctx, clk.Now(), "api", []usage{{bucket: user42, allowed: allowed}}); err != nil {
			t.Fatal(err)
		}
	}
	a, b := srv.newSession(), srv.newSession()
	for range 3 {
		report(a, 10)
		report(b, 10)
		clk.Advance(time.Second)
	}
	k := srv.keys.shards[fnv("api|user=42#10s")&63].m["api|user=42#10s"]
	held := func() float64 {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.held(srv.since(clk.Now()))
	}
	withA := held()
	a.close(clk.Now())
	srv.Sweep(clk.Now())
	if got := held(); got < withA-1e-9 {
		t.Errorf("held %.1f right after the stream closed, want at least %.1f: its Envoy may still admit", got, withA)
	}
	clk.Advance(3 * time.Second)
	srv.Sweep(clk.Now())
	var bAlone contribution
	for _, h := range b.byReq {
		bAlone = h.contrib
	}
	if got := held(); got > bAlone.tok+bAlone.rate*(srv.since(clk.Now()))-bAlone.rateAt+1e-9 {
		t.Errorf("held %.1f after the TTL, want only the open stream's", got)
	}
	if n := srv.keys.len(); n != 1 {
		t.Errorf("%d keys held, want 1", n)
	}
}
