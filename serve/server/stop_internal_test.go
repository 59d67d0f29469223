package server

import (
	"net"
	"testing"

	"google.golang.org/grpc"
)

// TestServeGRPCAfterStop stops a gRPC server before it serves, as Run does when its
// context ends before the goroutine that serves has run (a SIGTERM as the enforcer
// starts, on a loaded machine): the stop came first, which is a clean stop, not an error
// that would make the process exit with status 1.
func TestServeGRPCAfterStop(t *testing.T) {
	for name, stop := range map[string]func(*grpc.Server){
		"GracefulStop": (*grpc.Server).GracefulStop,
		"Stop":         (*grpc.Server).Stop,
	} {
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			gs := grpc.NewServer()
			stop(gs)
			if err := serveGRPC(gs, ln); err != nil {
				t.Fatalf("serveGRPC after %s: %v, want nil", name, err)
			}
			// Serve closed the listener: nothing is left open.
			if _, err := ln.Accept(); err == nil {
				t.Fatal("listener still open")
			}
		})
	}
}
