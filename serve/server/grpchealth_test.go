package server_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
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

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/serve/rls"
	"github.com/streamlimit/streamlimit/serve/server"
	"github.com/streamlimit/streamlimit/topics"
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
	srv := startServer(t, server.Config{
		Config:   streamlimit.Config{Brokers: cluster.ListenAddrs(), HitsTopic: "hits", CountsTopic: counts},
		GRPCAddr: "127.0.0.1:0",
		RLQSAddr: "127.0.0.1:0",
	})

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
	// A stream the server has already ended (Unimplemented with reflection off, or
	// Unauthenticated) can fail Send with io.EOF, as grpc-go documents: the call's status
	// is then Recv's.
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{ListServices: ""}}); err != nil && !errors.Is(err, io.EOF) {
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

// TestReadinessFollowsClockSkew: an enforcer whose clock is seconds behind the
// aggregator's (a heartbeat on the counts topic dated 5 s after this clock) is not ready,
// and /readyz and the gRPC health service say why: every count would be refused as from
// the future, and its global limits decided on local shares alone.
func TestReadinessFollowsClockSkew(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "hits", "counts"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	srv := startServer(t, server.Config{
		Config:   streamlimit.Config{Brokers: cluster.ListenAddrs(), HitsTopic: "hits", CountsTopic: "counts"},
		GRPCAddr: "127.0.0.1:0",
	})
	health := healthpb.NewHealthClient(dialGRPC(t, srv.GRPCAddr()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ok, _ := srv.Ready(); !ok; ok, _ = srv.Ready() {
		if ctx.Err() != nil {
			t.Fatal("not ready with an empty counts topic")
		}
		time.Sleep(10 * time.Millisecond)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	hb := topics.Heartbeat{Instance: "agg-1", Topic: "hits", Partition: 0, AsOf: time.Now().Add(5 * time.Second).UnixMilli()}
	v, err := hb.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "counts", Key: []byte(topics.HeartbeatKey("hits", 0)), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for ok, _ := srv.Ready(); ok; ok, _ = srv.Ready() {
		if ctx.Err() != nil {
			t.Fatal("still ready 30 s after a heartbeat from 5 s ahead")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, why := srv.Ready(); !strings.Contains(why, "behind them (bound 1s)") {
		t.Errorf("not ready because %q, want the clock named", why)
	}
	r, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
	for err == nil && r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
		r, err = health.Check(ctx, &healthpb.HealthCheckRequest{})
	}
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health %v, %v; want NOT_SERVING", r.GetStatus(), err)
	}
}
