package rlqs

import (
	"context"
	"fmt"
	"math"
	"net"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/producer"
	"github.com/streamlimit/streamlimit/topics"
)

// ids returns n usages of distinct bucket ids, each reporting one request.
func ids(from, n int) []usage {
	us := make([]usage, n)
	for i := range us {
		us[i] = usage{bucket: map[string]string{"user": fmt.Sprint(from + i)}, allowed: 1}
	}
	return us
}

// actions returns the number of bucket actions of a response.
func actions(t *testing.T, resp []byte) int {
	t.Helper()
	var r rlqsv3.RateLimitQuotaResponse
	if err := proto.Unmarshal(resp, &r); err != nil {
		t.Fatal(err)
	}
	return len(r.GetBucketAction())
}

// TestManyBucketIDsBounded: reports naming new bucket ids without end keep at most
// MaxStreamBuckets per stream and MaxBytes in all; the ids past them are refused — no
// action, so that Envoy applies its no_assignment_behavior — and counted. Closing the
// streams gives every byte back.
func TestManyBucketIDsBounded(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	const perStream = 300
	one := bucketBytes("\x0a\x0b\x0a\x04user\x12\x03123", map[string]string{"user": "123"})
	budget := 2*streamBytes + 450*one // room for 450 buckets, fewer than two streams' worth
	srv := newSimpleServer(t, clk, Options{MaxStreamBuckets: perStream, MaxBytes: budget})
	done := make([]func(), 2)
	ss := make([]*session, 2)
	for i := range ss {
		var err error
		if _, done[i], err = srv.admitStream(context.Background()); err != nil {
			t.Fatal(err)
		}
		ss[i] = srv.newSession()
	}
	for round := range 10 { // 10 reports of 1000 new ids on each stream
		for i, s := range ss {
			resp, err := s.handle(context.Background(), clk.Now(), "api", ids((round*2+i)*1000, 1000))
			if err != nil {
				t.Fatal(err)
			}
			if n := len(s.byReq); n > perStream {
				t.Fatalf("stream %d holds %d buckets, bound %d", i, n, perStream)
			}
			if resp != nil && actions(t, resp) > perStream {
				t.Fatalf("stream %d: %d actions for at most %d buckets", i, actions(t, resp), perStream)
			}
		}
		clk.Advance(time.Second)
	}
	if used := srv.MemoryInUse(); used > budget {
		t.Errorf("memory in use %d, above the budget %d", used, budget)
	}
	held := len(ss[0].byReq) + len(ss[1].byReq)
	if held < 440 || len(ss[0].byReq) != perStream {
		t.Errorf("buckets held %d and %d: the first stream's bound, then the budget's rest, should be filled", len(ss[0].byReq), len(ss[1].byReq))
	}
	if g := testutil.ToFloat64(srv.metrics.buckets); int(g) != held {
		t.Errorf("buckets gauge %v, want %d", g, held)
	}
	refused := testutil.ToFloat64(srv.metrics.refusedBkts.WithLabelValues("stream")) + testutil.ToFloat64(srv.metrics.refusedBkts.WithLabelValues("memory"))
	if int(refused) != 20*1000-held {
		t.Errorf("refused %v bucket reports, want %d", refused, 20*1000-held)
	}
	for i, s := range ss {
		s.close(clk.Now())
		done[i]()
	}
	clk.Advance(time.Hour)
	srv.Sweep(clk.Now())
	if used := srv.MemoryInUse(); used != 0 {
		t.Errorf("memory in use %d after every stream closed and drained, want 0", used)
	}
}

// TestAddressShareBounded: the streams of one client address hold at most an eighth of
// MaxBytes, so that a client on another address still gets buckets when that one reports
// new ids without end.
func TestAddressShareBounded(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	budget := int64(8 << 20)
	srv := newSimpleServer(t, clk, Options{MaxBytes: budget})
	from := func(ip string) *session {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}})
		addr, done, err := srv.admitStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(done)
		ss := srv.newSession()
		ss.addr = addr
		return ss
	}
	greedy := []*session{from("10.0.0.1"), from("10.0.0.1"), from("10.0.0.1")}
	for round := range 10 {
		for i, ss := range greedy {
			if _, err := ss.handle(context.Background(), clk.Now(), "api", ids((round*3+i)*1000, 1000)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if used := srv.MemoryInUse(); used > budget/addrShare {
		t.Errorf("one address holds %d bytes, above its share %d", used, budget/addrShare)
	}
	if n := testutil.ToFloat64(srv.metrics.refusedBkts.WithLabelValues("addr")); n == 0 {
		t.Error("no bucket refused for the address's share")
	}
	other := from("10.0.0.2")
	if _, err := other.handle(context.Background(), clk.Now(), "api", ids(1_000_000, 100)); err != nil {
		t.Fatal(err)
	}
	if n := len(other.byReq); n != 100 {
		t.Errorf("another address holds %d of its 100 buckets, want all", n)
	}
}

// bucketIDForms returns n wire forms of one bucket id {a: 1, b: 2, c: 3}: its map
// entries in each order, each with a different unknown field (padding) appended.
func bucketIDForms(n int) [][]byte {
	entry := func(k, v string) []byte {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, k)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, v)
		return e
	}
	es := [][]byte{entry("a", "1"), entry("b", "2"), entry("c", "3")}
	orders := [][3]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}}
	out := make([][]byte, n)
	for i := range out {
		var b []byte
		for _, j := range orders[i%len(orders)] {
			b = protowire.AppendTag(b, 1, protowire.BytesType)
			b = protowire.AppendBytes(b, es[j])
		}
		b = protowire.AppendTag(b, 9, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(i))
		out[i] = b
	}
	return out
}

// TestOneBucketIDManyWireForms: one bucket id sent in 5000 wire forms is one bucket:
// the bucket gauge says 1, and the memory accounting holds what one bucket and a few
// remembered forms take, not 5000 forms' worth.
func TestOneBucketIDManyWireForms(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	srv := newSimpleServer(t, clk, Options{})
	ss := srv.newSession()
	forms := bucketIDForms(5000)
	var afterFew int64
	for i, raw := range forms {
		if _, err := ss.handle(context.Background(), clk.Now(), "api", []usage{{raw: raw, allowed: 1}}); err != nil {
			t.Fatal(err)
		}
		if i == maxAliases {
			afterFew = srv.MemoryInUse()
		}
		clk.Advance(10 * time.Millisecond)
	}
	if n := len(ss.byReq); n != 1 {
		t.Errorf("%d buckets for one bucket id, want 1", n)
	}
	if n := len(ss.byRaw); n > 1+maxAliases {
		t.Errorf("%d wire forms remembered, want at most %d", n, 1+maxAliases)
	}
	if g := testutil.ToFloat64(srv.metrics.buckets); g != 1 {
		t.Errorf("buckets gauge %v, want 1", g)
	}
	if used := srv.MemoryInUse(); used != afterFew || used > 2*bucketBytes(string(forms[0]), map[string]string{"a": "1", "b": "2", "c": "3"}) {
		t.Errorf("memory in use %d after 5000 forms, %d after %d: it should hold one bucket", used, afterFew, 1+maxAliases)
	}
	if n := srv.requests.len(); n != 1 {
		t.Errorf("%d shared requests, want 1", n)
	}
}

// TestForgedDemandLeavesHonestAssignment: a client that reports 4 000 000 000 denied
// requests a second for a bucket an honest client shares gets no larger share than one
// that reports the whole limit's rate: the honest client's assignment is the same in
// both runs, and not DENY_ALL.
func TestForgedDemandLeavesHonestAssignment(t *testing.T) {
	run := func(forged uint64) assignment {
		clk := clock.NewFake(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
		srv := newSimpleServer(t, clk, Options{}) // user: 100 per 10 s
		honest, forger := srv.newSession(), srv.newSession()
		for i := range 30 {
			if i%5 == 0 { // the honest Envoy reports every 5 s, 2 requests a second
				if _, err := honest.handle(context.Background(), clk.Now(), "api", []usage{{bucket: user42, allowed: 10}}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := forger.handle(context.Background(), clk.Now(), "api", []usage{{bucket: user42, denied: forged}}); err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Second)
		}
		for _, h := range honest.byReq {
			return h.m.a
		}
		t.Fatal("no honest bucket")
		return assignment{}
	}
	plausible := run(50) // the limit's rate (10 a second) or more over any span
	forged := run(4_000_000_000)
	if forged != plausible {
		t.Errorf("honest assignment %+v under forged demand, %+v under demand at the limit's rate", forged, plausible)
	}
	if forged.kind != kindTokens || forged.fill == 0 {
		t.Errorf("honest assignment %+v under forged demand, want a token bucket", forged)
	}
}

// bufServer serves srv over an in-process listener with the options the enforcer uses.
func bufServer(t *testing.T, srv *Server) *bufconn.Listener {
	t.Helper()
	ln := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(srv.ServerOptions()...)
	srv.Register(gs)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return ln
}

// dialBuf returns a client of ln on a connection of its own.
func dialBuf(t *testing.T, ln *bufconn.Listener, opts ...grpc.DialOption) rlqsv3.RateLimitQuotaServiceClient {
	t.Helper()
	opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }))
	cc, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return rlqsv3.NewRateLimitQuotaServiceClient(cc)
}

// report returns a usage reports message of the bucket ids user=from.. user=from+n-1.
func report(from, n int) *rlqsv3.RateLimitQuotaUsageReports {
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "api"}
	for i := range n {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"user": fmt.Sprint(from + i)}}, NumRequestsAllowed: 1})
	}
	return m
}

// TestIdleStreamsBounded: streams past MaxStreamsPerAddr from one address are refused
// with ResourceExhausted, a stream past MaxBytes too, and a stream that sends nothing for
// StreamIdleTimeout is cut; each open stream is charged to the memory accounting.
func TestIdleStreamsBounded(t *testing.T) {
	srv := newSimpleServer(t, clock.NewFake(time.Now()), Options{MaxStreamsPerAddr: 4, MaxBytes: 10 * streamBytes, StreamIdleTimeout: time.Hour})
	ln := bufServer(t, srv)
	c := dialBuf(t, ln)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var open []rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	for range 10 {
		st, err := c.StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, st)
	}
	// bufconn's peers have no IP address: they all count under one.
	eventually(t, "4 streams open, 6 refused", func() bool {
		return testutil.ToFloat64(srv.metrics.refusedStreams.WithLabelValues("per_addr")) == 6 && testutil.ToFloat64(srv.metrics.streams) == 4
	})
	refused := 0
	for _, st := range open {
		if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); status.Code(err) == codes.ResourceExhausted {
			refused++
		}
	}
	if refused != 6 {
		t.Errorf("%d streams ended with ResourceExhausted, want 6", refused)
	}
	eventually(t, "streams closed", func() bool { return srv.MemoryInUse() == 0 })

	// The memory budget: 10 streams' worth.
	srv.opts.MaxStreamsPerAddr = 0
	for range 12 {
		if _, err := c.StreamRateLimitQuotas(ctx); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "10 streams open, 2 refused", func() bool {
		return testutil.ToFloat64(srv.metrics.refusedStreams.WithLabelValues("memory")) == 2 && srv.MemoryInUse() == 10*streamBytes
	})
	cancel()
	eventually(t, "streams closed", func() bool { return srv.MemoryInUse() == 0 })

	// An idle stream is cut; one that reports is not.
	srv.opts.StreamIdleTimeout = 300 * time.Millisecond
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	idle, err := c.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	busy, err := c.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stop := time.Now().Add(time.Second)
	for time.Now().Before(stop) {
		if err := busy.Send(report(0, 1)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// grpc-go ends a stream whose read is cut with CANCELLED, whatever the handler says.
	if _, err := idle.Recv(); status.Code(err) != codes.Canceled {
		t.Errorf("idle stream ended with %v, want Canceled", err)
	}
	if n := testutil.ToFloat64(srv.metrics.cut.WithLabelValues("idle")); n != 1 {
		t.Errorf("%v streams cut idle, want 1", n)
	}
	if n := testutil.ToFloat64(srv.metrics.streams); n != 1 {
		t.Errorf("%v streams open, want the busy one", n)
	}
}

// TestNonReadingStreamCut: a client that sends reports and reads no response is cut
// after SendTimeout rather than buffered for, and a client on another connection is
// served meanwhile.
func TestNonReadingStreamCut(t *testing.T) {
	srv := newSimpleServer(t, clock.NewFake(time.Now()), Options{SendTimeout: 300 * time.Millisecond})
	ln := bufServer(t, srv)
	// A fixed 64 KiB window (no bandwidth estimation): the responses fill it at once.
	greedy := dialBuf(t, ln, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := greedy.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Each report names 2000 new buckets: some 150 KiB of actions in each response.
	go func() {
		for i := 0; ; i++ {
			if st.Send(report(i*2000, 2000)) != nil {
				return
			}
		}
	}()
	eventually(t, "the non-reading stream cut", func() bool {
		return testutil.ToFloat64(srv.metrics.cut.WithLabelValues("not_reading")) == 1
	})
	honest, err := dialBuf(t, ln).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := honest.Send(report(math.MaxInt32-i, 1)); err != nil {
			t.Fatal(err)
		}
		if _, err := honest.Recv(); err != nil {
			t.Fatalf("honest client's response: %v", err)
		}
	}
	eventually(t, "the cut stream's memory given back", func() bool {
		return testutil.ToFloat64(srv.metrics.streams) == 1
	})
}

// TestReportFloodKeepsCheckHits: a flood of usage reports over ever new buckets on many
// streams, published as bulk hits, does not make the producer drop a hit of the check
// API's decisions: a heavy client's, or a new client's, while the flood's own excess is
// dropped as bulk_no_room.
func TestReportFloodKeepsCheckHits(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topics.DefaultHitsTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	clk := clock.NewFake(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC))
	prod, err := producer.New(producer.Config{Brokers: kc.ListenAddrs(), Site: "eu", Clock: clk, FlushInterval: -1,
		MaxBufferedKeys: 1000, SiteHeartbeatInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.Parse("rules.yaml", []byte(userRules+`
  - key: client
    rate_limit: {window: 60s, requests_per_unit: 1000000}
`))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcer.New(enforcer.Config{Rules: rules.Static(cfg), Site: "eu", Clock: clk, Publisher: prod, ReportPublisher: prod.Bulk()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(lim, Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	streams := make([]*session, 20)
	for i := range streams {
		streams[i] = srv.newSession()
	}
	ctx := context.Background()
	var res enforcer.Result
	admitted := 0
	for round := range 10 {
		for i, ss := range streams { // 2000 new buckets a round
			if _, err := ss.handle(ctx, clk.Now(), "api", ids((round*len(streams)+i)*100, 100)); err != nil {
				t.Fatal(err)
			}
		}
		for c, client := range []string{"heavy", fmt.Sprintf("new-%d", round)} {
			for range 50*(1-c) + 1 {
				lim.DecideAt(ctx, clk.Now(), enforcer.Request{Domain: "api", Descriptors: [][]rules.Entry{{{Key: "client", Value: client}}}}, &res)
				if res.Code == enforcer.CodeOK {
					admitted++
				}
			}
		}
		clk.Advance(50 * time.Millisecond)
		if err := prod.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := prod.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st := prod.Stats()
	if admitted != 10*52 {
		t.Fatalf("check API admitted %d, want all %d", admitted, 10*52)
	}
	if n := st.DroppedByReason[producer.DropNoRoom] + st.DroppedByReason[producer.DropKafkaBacklog]; n != 0 {
		t.Errorf("producer dropped %d decision hits (by reason %v)", n, st.DroppedByReason)
	}
	if st.DroppedByReason[producer.DropBulkNoRoom] == 0 {
		t.Errorf("no bulk hit dropped (by reason %v): the flood did not fill its part, the test proves nothing", st.DroppedByReason)
	}
}
