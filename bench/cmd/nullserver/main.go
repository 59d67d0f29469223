// Command nullserver is the ceiling of the serving benchmark: an Envoy RLS v3 gRPC server
// and an HTTP check endpoint that answer OK at once, without looking at the request
// beyond what their protocol needs (the HTTP body is read, so that the connection can be
// reused). Whatever a real rate-limit server does costs throughput and latency against it.
//
//	go run ./bench/cmd/nullserver -grpc 127.0.0.1:0 -http 127.0.0.1:0
//
// It prints "ADDR <http> <grpc>" once both listen, and serves until SIGTERM or interrupt.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// nullRLS answers every ShouldRateLimit with OK and one OK status per descriptor, as a
// rate-limit service that admits everything must.
type nullRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (nullRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	st := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors()))
	for i := range st {
		st[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: st}, nil
}

// nullCheck answers POST /v1/check with the check API's OK answer for one descriptor.
func nullCheck(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"overall_code":"OK","statuses":[{"code":"OK"}]}` + "\n"))
}

func main() {
	httpAddr := flag.String("http", "127.0.0.1:8091", "address of POST /v1/check")
	grpcAddr := flag.String("grpc", "127.0.0.1:8092", "address of the RLS v3 gRPC service")
	flag.Parse()
	if err := run(*httpAddr, *grpcAddr); err != nil {
		fmt.Fprintln(os.Stderr, "nullserver:", err)
		os.Exit(1)
	}
}

func run(httpAddr, grpcAddr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hl, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return err
	}
	gl, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", nullCheck)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	// The same gRPC server options as the enforcer's (serve/server), so that the
	// comparison measures what the enforcer does per call, not a transport setting.
	gs := grpc.NewServer(grpc.NumStreamWorkers(uint32(64 * runtime.GOMAXPROCS(0))))
	rlsv3.RegisterRateLimitServiceServer(gs, nullRLS{})
	errs := make(chan error, 2)
	go func() { errs <- hs.Serve(hl) }()
	go func() { errs <- gs.Serve(gl) }()
	fmt.Printf("ADDR %s %s\n", hl.Addr(), gl.Addr())
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	gs.Stop()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, grpc.ErrServerStopped) {
		err = nil
	}
	return err
}
