package loadgen

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// oddDenied admits the calls whose descriptor value ends in an even digit.
type oddDenied struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (oddDenied) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	v := req.GetDescriptors()[0].GetEntries()[0].GetValue()
	code := rlsv3.RateLimitResponse_OK
	if strings.ContainsAny(v[len(v)-1:], "13579") {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return &rlsv3.RateLimitResponse{OverallCode: code}, nil
}

func TestGRPCCountsAdmittedPerKey(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, oddDenied{})
	go gs.Serve(ln)
	defer gs.Stop()
	r, err := Run(context.Background(), Config{API: GRPC, Addr: ln.Addr().String(), Callers: 4, Conns: 2, Keys: 10,
		Prefix: "k", Duration: 300 * time.Millisecond, PerKey: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Calls == 0 || r.Errors != 0 || r.Admitted+r.Denied != r.Calls || r.P50 <= 0 || r.P99 < r.P50 {
		t.Fatalf("result %+v", r)
	}
	var calls, admitted int64
	for i, k := range r.PerKey {
		calls += k.Calls
		admitted += k.Admitted
		if want := i%2 == 0; (k.Admitted == k.Calls) != want || (k.Admitted == 0) == want {
			t.Errorf("key %s: %d of %d admitted", k.Key, k.Admitted, k.Calls)
		}
	}
	if calls != r.Calls || admitted != r.Admitted || r.PerKey[3].Key != "k3" {
		t.Fatalf("per-key sums %d/%d, result %+v", admitted, calls, r)
	}
}

// With a rate, calls are paced: about rate × duration of them, whatever the server could
// take.
func TestHTTPPaced(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(`{"overall_code":"OK","statuses":[{"code":"OK"}]}`))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	r, err := Run(context.Background(), Config{API: HTTP, Addr: ln.Addr().String(), Callers: 8, Conns: 4, Keys: 5,
		Duration: time.Second, Rate: 200})
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 0 || r.Admitted != r.Calls || r.Calls < 150 || r.Calls > 201 {
		t.Fatalf("paced at 200/s for 1 s: %+v", r)
	}
}

// Hot keys take their share of the calls, spread evenly, round-robin among them; the other
// calls go round-robin over the cold keys.
func TestKeyOfHotShare(t *testing.T) {
	cfg, err := Config{Addr: "x", Keys: 100, HotKeys: 4, HotShare: 0.25}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	calls := make([]int, cfg.Keys)
	for n := range int64(100_000) {
		calls[keyOf(cfg, n)]++
	}
	for k, c := range calls {
		want := 25_000 / 4
		if k >= 4 {
			want = 75_000 / 96
		}
		if c < want-1 || c > want+1 {
			t.Errorf("key %d: %d calls, want %d", k, c, want)
		}
	}
	if _, err := (Config{Addr: "x", Keys: 4, HotKeys: 4, HotShare: 0.5}).withDefaults(); err == nil {
		t.Error("hot keys = keys with share < 1 accepted")
	}
}
