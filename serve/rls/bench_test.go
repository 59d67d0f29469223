package rls

import (
	"context"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// benchRules is a global rule, as in production; with no snapshot the Limiter decides it
// on its local share (DefaultShare 1), counting exactly in process. The limit is high so
// that the 10 k keys stay admitted and every call takes the full path.
const benchRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {name: per-minute, unit: minute, requests_per_unit: 1000000000}
`

const benchKeys = 10_000

func benchRequests() []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, benchKeys)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			descriptor("user", strconv.Itoa(i)),
		}}
	}
	return reqs
}

func benchServer(b testing.TB) *Server {
	b.Helper()
	l, err := enforcer.New(enforcer.Config{Rules: rules.Static(loadRules(b, benchRules)), Site: "t", Clock: clock.Real{}})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := NewServer(l, Options{})
	if err != nil {
		b.Fatal(err)
	}
	return srv
}

// BenchmarkShouldRateLimit measures one call in process: mapping the request, the
// Limiter's decision and building the response with its headers.
func BenchmarkShouldRateLimit(b *testing.B) {
	srv := benchServer(b)
	reqs := benchRequests()
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		resp, err := srv.ShouldRateLimit(ctx, reqs[i%benchKeys])
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			b.Fatalf("%v %v", resp, err)
		}
		i++
	}
}

// BenchmarkGRPC measures calls from a real gRPC client over loopback TCP to a real gRPC
// server in the same process, with 1 and 8 concurrent callers per GOMAXPROCS; client and
// server share the machine's cores. It reports throughput and the p50 and p99 of per-call
// latency.
func BenchmarkGRPC(b *testing.B) {
	for _, par := range []int{1, 8} {
		b.Run("callers="+strconv.Itoa(par)+"xGOMAXPROCS", func(b *testing.B) { benchGRPC(b, par) })
	}
}

func benchGRPC(b *testing.B, parallelism int) {
	srv := benchServer(b)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	srv.Register(gs)
	go gs.Serve(lis)
	defer gs.GracefulStop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	reqs := benchRequests()
	ctx := context.Background()
	if _, err := client.ShouldRateLimit(ctx, reqs[0]); err != nil {
		b.Fatal(err)
	}

	var (
		mu   sync.Mutex
		lats []time.Duration
		next atomic.Int64
	)
	b.ReportAllocs()
	b.SetParallelism(parallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		local := make([]time.Duration, 0, 1024)
		for pb.Next() {
			req := reqs[next.Add(1)%benchKeys]
			t := time.Now()
			resp, err := client.ShouldRateLimit(ctx, req)
			local = append(local, time.Since(t))
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				b.Errorf("%v %v", resp, err)
				return
			}
		}
		mu.Lock()
		lats = append(lats, local...)
		mu.Unlock()
	})
	b.StopTimer()
	if len(lats) == 0 {
		return
	}
	slices.Sort(lats)
	pct := func(p float64) float64 { return float64(lats[int(p*float64(len(lats)-1))].Microseconds()) }
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}
