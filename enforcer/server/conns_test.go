package server_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/enforcer/server"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// hostileConns is how many connections TestConnectionFlood holds open, half on each
// listener, from hostileAddrs loopback addresses.
const (
	hostileConns = 10_000
	hostileAddrs = 10
)

// raiseFileLimit lifts the process's open-file limit to its hard limit, and fails (skips
// outside CI) when that cannot hold n more descriptors.
func raiseFileLimit(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < lim.Max {
		old := lim.Cur
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			lim.Cur = old
			_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		})
	}
	if lim.Cur < n+1024 {
		testenv.Unavailable(t, "open-file limit %d: the test needs %d (ulimit -n)", lim.Cur, n+1024)
	}
}

// TestConnectionFlood holds 10 000 hostile connections open against one enforcer, half
// on the HTTP API (each sends half a request's headers) and half on gRPC (each sends
// nothing), from 10 loopback addresses, and measures a normal client from another
// address: 100 check requests, each on a new connection, and 100 gRPC calls, each on a new
// connection. Each listener holds at most --max-conns-per-addr (128) connections per
// address and closes the rest when accepted, so the normal client's connections are
// accepted at once. The connections held stay held while the normal client is measured
// (handshake and header bounds of 2 minutes), and the measurement starts once every
// hostile connection has been accepted. Its p99 must stay below 50 ms, or below 3× its p99
// with no hostile connection when the machine is that slow. Before, the hostile connections took the
// listeners' 4 096 slots (held 5 s on HTTP, 120 s on gRPC, where grpc-go waits that long
// for a handshake) and the normal client waited in the accept queue: seconds.
func TestConnectionFlood(t *testing.T) {
	raiseFileLimit(t, hostileConns+2*hostileAddrs*server.DefaultMaxConnsPerAddr)
	// The hostile connections the listeners hold stay held through the measurement: with
	// the default 5 s bounds on a handshake and on a request's headers, the first of them
	// would time out, all at once, while the normal client is measured.
	reg := prometheus.NewRegistry()
	srv := startServer(t, server.Config{GRPCAddr: "127.0.0.1:0", Registry: reg,
		Limits: server.Limits{GRPCHandshakeTimeout: 2 * time.Minute, ReadHeaderTimeout: 2 * time.Minute}})
	httpP99, grpcP99 := normalClient(t, srv)
	t.Logf("no hostile connection: normal client p99 %v (HTTP), %v (gRPC)", httpP99, grpcP99)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu   sync.Mutex
		held []net.Conn
		wg   sync.WaitGroup
	)
	defer func() {
		cancel()
		wg.Wait()
		for _, c := range held {
			c.Close()
		}
	}()
	start := time.Now()
	for a := range hostileAddrs {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(10+a))}, Timeout: 10 * time.Second}
		wg.Go(func() {
			for i := range hostileConns / hostileAddrs {
				addr := srv.HTTPAddr()
				if i%2 == 1 {
					addr = srv.GRPCAddr()
				}
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("hostile dial: %v", err)
					}
					return
				}
				if i%2 == 0 {
					fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Ty")
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("%d hostile connections open in %v", len(held), time.Since(start).Round(time.Millisecond))
	// A dial returns once the kernel has queued the connection, before the server accepts
	// it: wait until the listeners have accepted every hostile connection (and closed those
	// over the per-address bound), so that the normal client is measured beside 10 000 open
	// connections and not behind thousands still in the accept queue.
	wantRefused := float64(hostileConns - 2*hostileAddrs*server.DefaultMaxConnsPerAddr)
	testenv.Eventually(t, time.Minute, fmt.Sprintf("the listeners to refuse %v hostile connections", wantRefused), func() bool {
		return testenv.Counter(t, reg, "streamlimit_enforcer_conns_refused_total") >= wantRefused
	})
	t.Logf("accepted every hostile connection in %v", time.Since(start).Round(time.Millisecond))
	hp, gp := normalClient(t, srv)
	t.Logf("with them: normal client p99 %v (HTTP), %v (gRPC)", hp, gp)
	for _, c := range []struct {
		api        string
		got, quiet time.Duration
	}{{"HTTP", hp, httpP99}, {"gRPC", gp, grpcP99}} {
		if c.got >= max(50*time.Millisecond, 3*c.quiet) {
			t.Errorf("%s: a normal client's p99 is %v with %d hostile connections open (%v without)", c.api, c.got, hostileConns, c.quiet)
		}
	}
}

// normalClient measures a client from 127.0.0.1: the p99 of 100 check requests and of
// 100 gRPC calls, each on a connection of its own. A hundred of each, so that the p99 is
// the second slowest, not the slowest: one call delayed by a busy machine (a CI run saw
// the slowest of 30 gRPC calls take 126 ms while HTTP's p99 was 8 ms) is not the
// server's doing.
func normalClient(t *testing.T, srv *server.Server) (httpP99, grpcP99 time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var hs, gs []time.Duration
	for range 100 {
		t0 := time.Now()
		resp, err := client.Post("http://"+srv.HTTPAddr()+"/v1/check", "application/json", strings.NewReader(checkBody))
		if err != nil {
			t.Fatalf("normal client: %v", err)
		}
		resp.Body.Close()
		hs = append(hs, time.Since(t0))
	}
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "n"}}}}}
	for range 100 {
		t0 := time.Now()
		conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
		cancel()
		conn.Close()
		if err != nil {
			t.Fatalf("normal gRPC client: %v", err)
		}
		gs = append(gs, time.Since(t0))
	}
	return p99(hs), p99(gs)
}

func p99(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[(len(ds)*99+99)/100-1]
}

// TestPerAddrConnCap: with MaxConnsPerAddr 2, a third connection from one address is
// closed when accepted, while another address is served.
func TestPerAddrConnCap(t *testing.T) {
	srv := startServer(t, server.Config{Limits: server.Limits{MaxConnsPerAddr: 2}})
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, 2)}}
	for range 2 {
		c, err := d.Dial("tcp", srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	c, err := d.Dial("tcp", srv.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !closedWithin(c, 5*time.Second) {
		t.Fatal("a third connection from one address was held")
	}
	resp, err := http.Get("http://" + srv.HTTPAddr() + "/healthz") // from 127.0.0.1
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("another address: %v %v", resp, err)
	}
	resp.Body.Close()
}

// TestEarlyTooLarge: a request that declares a body larger than any endpoint reads is
// answered 413 at once and its connection closed, without a byte of the body (before: it
// was held until the read timeout, 10 s). The gRPC listener closes a connection that
// sends nothing after its handshake timeout (before: 120 s).
func TestEarlyTooLarge(t *testing.T) {
	srv := startServer(t, server.Config{GRPCAddr: "127.0.0.1:0", Limits: server.Limits{GRPCHandshakeTimeout: 300 * time.Millisecond}})
	for _, path := range []string{"/v1/check", "/json", "/v1/auth"} {
		c, err := net.Dial("tcp", srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, int64(10)<<30)
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("%s with Content-Length 10 GiB: %v %v, want 413 at once", path, resp, err)
		} else if !resp.Close {
			t.Errorf("%s: the connection is kept after a 413", path)
		}
		c.Close()
	}
	c, err := net.Dial("tcp", srv.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !closedWithin(c, 5*time.Second) {
		t.Fatal("a silent gRPC connection was held past its handshake timeout")
	}
}
