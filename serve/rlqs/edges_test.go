package rlqs

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// TestUndecodableReportIsInvalidArgument: a report that is not a usage reports message
// ends the stream with InvalidArgument, the client's fault, not Internal.
func TestUndecodableReportIsInvalidArgument(t *testing.T) {
	l := startLive(t, userRules, Options{})
	cc, err := grpc.NewClient(l.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	st, err := cc.NewStream(context.Background(), &serviceDesc.Streams[0], "/"+ServiceName+"/StreamRateLimitQuotas")
	if err != nil {
		t.Fatal(err)
	}
	bad := []byte{0x12, 0x05, 0x0a} // bucket_quota_usages of 5 bytes, 1 there
	if err := st.SendMsg(&bad); err != nil {
		t.Fatal(err)
	}
	err = st.RecvMsg(new([]byte))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("stream ended with %v, want InvalidArgument", err)
	}
}

// newSimpleServer is a Server on a fake clock without a publisher.
func newSimpleServer(t *testing.T, clk *clock.Fake, opts Options) *Server {
	t.Helper()
	cfg, err := rules.Parse("rules.yaml", []byte(userRules))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := enforcer.New(enforcer.Config{Rules: rules.Static(cfg), Site: "eu", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	opts.Clock = clk
	srv, err := NewServer(lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// TestEmptyBucketIDAndHugeCounts: a usage without a bucket id, or with an empty one, gets
// no action; a report with a count above 2^32-1 is refused whole, with InvalidArgument,
// as every other door refuses such a count, and nothing of it is counted.
func TestEmptyBucketIDAndHugeCounts(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	srv := newSimpleServer(t, clk, Options{})
	ss := srv.newSession()
	empty, _ := proto.Marshal(&rlqsv3.BucketId{})
	for _, u := range []usage{{}, {bucket: map[string]string{}}, {raw: []byte{}}, {raw: empty}} {
		resp, err := ss.handle(context.Background(), clk.Now(), "api", []usage{u})
		if err != nil || resp != nil {
			t.Errorf("usage %+v: response %x, error %v; want none", u, resp, err)
		}
	}
	for _, u := range []usage{
		{bucket: user42, allowed: 1 << 63},
		{bucket: user42, denied: math.MaxUint32 + 1},
		{bucket: user42, allowed: math.MaxInt64, denied: math.MaxUint64},
	} {
		// The good usage first: refused with the bad one.
		_, err := ss.handle(context.Background(), clk.Now(), "api", []usage{{bucket: map[string]string{"user": "7"}, allowed: 1}, u})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "above 2^32-1") {
			t.Errorf("usage %+v: error %v, want InvalidArgument naming the bound", u, err)
		}
	}
	if len(ss.byReq) != 0 {
		t.Errorf("%d buckets kept from refused reports, want none", len(ss.byReq))
	}
	// 2^32-1 itself is taken.
	if _, err := ss.handle(context.Background(), clk.Now(), "api", []usage{{bucket: user42, allowed: math.MaxUint32, denied: math.MaxUint32}}); err != nil {
		t.Errorf("counts of 2^32-1: %v", err)
	}
}

// TestNextHoldsWhateverTheStart: every token bucket next assigns admits at most over in
// h whether it starts full or empty — max_tokens plus h of refill — give or take the
// least fill of a token a minute, on the grid or off it (exact); and on the grid a
// slightly larger allotment gives the same bucket most of the time, so that Envoy keeps
// its tokens.
func TestNextHoldsWhateverTheStart(t *testing.T) {
	same, n := 0, 0
	for _, exact := range []bool{false, true} {
		for _, h := range []float64{1, 5} {
			for over := 1.0; over < 1e6; over *= 1.07 {
				a := next(over, over, h, false, exact, time.Second)
				if a.kind != kindTokens {
					t.Fatalf("over %.1f: kind %d, want a token bucket", over, a.kind)
				}
				most := float64(a.burst) + a.rate(time.Second)*h
				if most > over+h/FillInterval.Seconds()+1e-9 {
					t.Errorf("over %.1f in %vs: max_tokens %d + fill %d/min × h = %.2f", over, h, a.burst, a.fill, most)
				}
				if most < 0.5*over && over >= 4 {
					t.Errorf("over %.1f in %vs: assigns only %.2f", over, h, most)
				}
				if !exact {
					n++
				}
				if !exact && next(over*1.01, over*1.01, h, false, false, time.Second) == a {
					same++
				}
			}
		}
	}
	if same < n/2 {
		t.Errorf("a 1%% larger allotment changed the bucket %d times of %d", n-same, n)
	}
	if a := next(0.9, 0.9, 5, false, false, time.Second); a.kind != kindDeny {
		t.Errorf("below one request: %+v, want DENY_ALL", a)
	}
}

// TestNewStreamTakesOverItsReservation: a stream that ends and whose Envoy reports the
// same bucket on a new stream at its timer's phase releases the old stream's reservation
// at once, not at its TTL.
func TestNewStreamTakesOverItsReservation(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	srv := newSimpleServer(t, clk, Options{TTL: 10 * time.Second})
	ctx := context.Background()
	report := func(ss *session, id map[string]string) {
		t.Helper()
		if _, err := ss.handle(ctx, clk.Now(), "api", []usage{{bucket: id, allowed: 3}}); err != nil {
			t.Fatal(err)
		}
	}
	other := map[string]string{"user": "43"}
	a, b := srv.newSession(), srv.newSession()
	for range 3 {
		report(a, user42)
		clk.Advance(2 * time.Second)
		report(b, other)
		clk.Advance(3 * time.Second)
	}
	// a's last report was 5 s ago; it was cut 2 s ago, and its Envoy reports again
	// now, a period after its last report.
	a.close(clk.Now().Add(-2 * time.Second))
	req := a.byReq[requestOf(&srv.requests, "api", user42)]
	srv.requests.release(req.req)
	if req == nil || req.taken {
		t.Fatal("the closed stream's holder is missing or taken already")
	}
	c := srv.newSession()
	report(c, user42)
	if !req.taken || len(req.keys) != 0 {
		t.Errorf("the new stream's report left the old holder reserved (taken %v, %d keys)", req.taken, len(req.keys))
	}
	// Another bucket's new stream takes nothing of it.
	b.close(clk.Now())
	d := srv.newSession()
	report(d, user42)
	hb := b.byReq[requestOf(&srv.requests, "api", other)]
	srv.requests.release(hb.req)
	if hb.taken {
		t.Error("a report of another bucket took over the holder of user 43")
	}
}

// TestTakeOverByTimerPhase: a new stream's first report of a bucket takes over the
// closed stream's holder whose client's report timer is at its phase — the reservation
// released once, the demand and model carried on — and no other: not one of another
// client's timer, even the only one there, and none for a bucket's first report at its
// client (time_elapsed under a second), which continues no stream.
func TestTakeOverByTimerPhase(t *testing.T) {
	t0 := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	srv := newSimpleServer(t, clk, Options{ReportingInterval: 5 * time.Second})
	ctx := context.Background()
	report := func(ss *session, at time.Duration, first bool, allowed uint64) *holder {
		t.Helper()
		clk.Set(t0.Add(at))
		if _, err := ss.handle(ctx, clk.Now(), "api", []usage{{bucket: user42, allowed: allowed, first: first}}); err != nil {
			t.Fatal(err)
		}
		for _, h := range ss.byReq {
			return h
		}
		t.Fatal("no holder")
		return nil
	}
	orphans := func() int {
		n := 0
		srv.requests.each(func(r *request) { r.mu.Lock(); n += len(r.orphans); r.mu.Unlock() })
		return n
	}
	// Envoy A's timer fires at 0 s + 5k, B's at 2 s + 5k.
	a, b := srv.newSession(), srv.newSession()
	report(a, 0, true, 5)
	old := report(a, 5*time.Second, false, 5)
	report(b, 2*time.Second, true, 5)
	report(b, 7*time.Second, false, 5)
	a.close(t0.Add(8 * time.Second))
	// A new bucket of user 42 on another client's stream (its first report there)
	// continues no stream.
	report(srv.newSession(), 8500*time.Millisecond, true, 5)
	if orphans() != 1 {
		t.Fatalf("%d orphans after A's stream ended and a new bucket elsewhere, want A's old holder", orphans())
	}
	b.close(t0.Add(9 * time.Second))
	// A's new stream, at its timer's phase, takes A's old holder and carries it on.
	demand := old.demand
	h := report(srv.newSession(), 10*time.Second+3*time.Millisecond, false, 25)
	if orphans() != 1 || !old.taken || h.m.a.kind == kindNone || h.period != 0 && math.Abs(h.period-5) > 0.01 {
		t.Errorf("A's new stream: %d orphans left, A's old taken %v, model %+v, period %.3f; want B's left and A's carried on", orphans(), old.taken, h.m, h.period)
	}
	if d := 0.5*demand + 0.5*25/5.003; math.Abs(h.demand-d) > 1e-9 {
		t.Errorf("A's new stream: demand %.3f, want %.3f (A's old %.3f smoothed with the report's 5/s)", h.demand, d, demand)
	}
	// Another client's new stream, 1 s off B's timer, does not take B's old holder.
	report(srv.newSession(), 11*time.Second, false, 5)
	if orphans() != 1 {
		t.Fatalf("%d orphans after a stream at another phase, want B's old holder still", orphans())
	}
	report(srv.newSession(), 12*time.Second, false, 5)
	if orphans() != 0 {
		t.Errorf("%d orphans after B's new stream, want none", orphans())
	}
}
