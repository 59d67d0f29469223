package server_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/streamlimit/streamlimit/enforcer/rls"
	"github.com/streamlimit/streamlimit/enforcer/server"
)

func dialGRPC(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestGRPCHealthFollowsReadiness: the gRPC health service of both gRPC listeners says
// what /readyz says. An enforcer whose counts topic does not exist yet cannot restore it,
// so it is NOT_SERVING for the whole server and for each service; once the topic exists
// and is restored it is SERVING, and a Watch that started before sees the change.
func TestGRPCHealthFollowsReadiness(t *testing.T) {
	const counts = "counts"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "hits"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	srv := startServer(t, server.Config{Brokers: cluster.ListenAddrs(), HitsTopic: "hits", CountsTopic: counts,
		GRPCAddr: "127.0.0.1:0", RLQSAddr: "127.0.0.1:0"})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rlsHealth := healthpb.NewHealthClient(dialGRPC(t, srv.GRPCAddr()))
	rlqsHealth := healthpb.NewHealthClient(dialGRPC(t, srv.RLQSAddr()))
	healthOf := func(c healthpb.HealthClient, service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("Check(%q): %v", service, err)
		}
		return r.GetStatus()
	}
	watch, err := rlsHealth.Watch(ctx, &healthpb.HealthCheckRequest{Service: rls.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("first Watch update %v, %v; want NOT_SERVING", r.GetStatus(), err)
	}
	if ok, why := srv.Ready(); ok {
		t.Fatalf("ready without a counts topic: %s", why)
	}
	for _, c := range []healthpb.HealthClient{rlsHealth, rlqsHealth} {
		if st := healthOf(c, ""); st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("before ready: %v", st)
		}
	}
	if st := healthOf(rlsHealth, rls.ServiceName); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("%s before ready: %v", rls.ServiceName, st)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, counts); err != nil {
		t.Fatal(err)
	}
	r, err := watch.Recv()
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch update after the restore %v, %v; want SERVING", r.GetStatus(), err)
	}
	if ok, why := srv.Ready(); !ok {
		t.Fatalf("SERVING while not ready: %s", why)
	}
	for _, c := range []healthpb.HealthClient{rlsHealth, rlqsHealth} {
		if st := healthOf(c, ""); st != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("after ready: %v", st)
		}
	}
}

// listServices asks the reflection service at addr for the services it serves; nil and
// the call's code when it is refused.
func listServices(t *testing.T, addr string) ([]string, codes.Code) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(dialGRPC(t, addr)).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{ListServices: ""}}); err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		return nil, status.Code(err)
	}
	var names []string
	for _, s := range r.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names, codes.OK
}

// TestGRPCReflection: reflection is on by default and lists the rate-limit service and
// the health service, as grpcurl's `list` shows them; NoGRPCReflection takes it away.
func TestGRPCReflection(t *testing.T) {
	srv := startServer(t, server.Config{GRPCAddr: "127.0.0.1:0", RLQSAddr: "127.0.0.1:0"})
	names, _ := listServices(t, srv.GRPCAddr())
	for _, want := range []string{rls.ServiceName, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, without %s", names, want)
		}
	}
	if names, _ := listServices(t, srv.RLQSAddr()); !slices.Contains(names, "envoy.service.rate_limit_quota.v3.RateLimitQuotaService") {
		t.Errorf("RLQS reflection lists %v", names)
	}

	off := startServer(t, server.Config{GRPCAddr: "127.0.0.1:0", NoGRPCReflection: true})
	if names, code := listServices(t, off.GRPCAddr()); code != codes.Unimplemented {
		t.Errorf("NoGRPCReflection: reflection answers %v, %v", names, code)
	}
}

// With bearer tokens the health service stays open, as /readyz does, and reflection asks
// for a token like the services it describes.
func TestGRPCReflectionAsksForAToken(t *testing.T) {
	srv := startServer(t, server.Config{GRPCAddr: "127.0.0.1:0", AuthTokens: []string{"s3cret"}})
	conn := dialGRPC(t, srv.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health without a token: %v, %v", r.GetStatus(), err)
	}
	if names, code := listServices(t, srv.GRPCAddr()); code != codes.Unauthenticated {
		t.Errorf("reflection without a token answers %v, %v", names, code)
	}
}
