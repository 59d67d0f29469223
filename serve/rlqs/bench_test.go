package rlqs

import (
	"context"
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// BenchmarkHandle times one stream's report of 100 buckets (keys shared with 99 other
// streams), from the decoded message to the response: the server's work per report
// message, without gRPC. b.N counts messages; ns/bucket is per bucket report.
func BenchmarkHandle(b *testing.B) {
	cfg, err := rules.Parse("bench.yaml", []byte(userRules))
	if err != nil {
		b.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	lim, err := enforcer.New(enforcer.Config{Rules: rules.Static(cfg), Site: "eu", Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := NewServer(lim, Options{Clock: clk, ReportingInterval: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	const streams, buckets, keys = 100, 100, 1000
	sess := make([]*session, streams)
	msgs := make([]*rlqsv3.RateLimitQuotaUsageReports, streams)
	for i := range sess {
		sess[i] = srv.newSession()
		m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "api"}
		for j := range buckets {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId:    &rlqsv3.BucketId{Bucket: map[string]string{"user": fmt.Sprint((i*buckets + j*7) % keys), "name": "per-user"}},
				TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 5, NumRequestsDenied: 1})
		}
		msgs[i] = m
	}
	ctx := context.Background()
	// Warm: every bucket exists on its stream.
	for i := range sess {
		if _, err := sess[i].handle(ctx, clk.Now(), msgs[i].GetDomain(), usagesOf(msgs[i], nil)); err != nil {
			b.Fatal(err)
		}
	}
	wires := make([][]byte, streams)
	for i := range wires {
		wires[i], _ = proto.Marshal(msgs[i])
	}
	b.SetBytes(int64(len(wires[0])))
	b.ReportAllocs()
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	var r wireReports
	for i := range b.N {
		clk.Advance(time.Second / streams)
		r.buf = append(r.buf[:0], wires[i%streams]...) // as the codec copies the message
		if err := r.decode(); err != nil {
			b.Fatal(err)
		}
		if _, err := sess[i%streams].handle(ctx, clk.Now(), string(r.domain), r.usages); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*buckets), "cpu-ns/bucket")
}

// BenchmarkGRPC sends b.N report messages of 100 buckets over 100 streams (4 connections)
// to a Server on a loopback listener, as fast as they go, and waits until the server has
// handled them all: the whole serving path, gRPC included, client and server in one
// process (cpu-ns/bucket counts both).
func BenchmarkGRPC(b *testing.B) {
	cfg, err := rules.Parse("bench.yaml", []byte(userRules))
	if err != nil {
		b.Fatal(err)
	}
	lim, err := enforcer.New(enforcer.Config{Rules: rules.Static(cfg), Site: "eu"})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := NewServer(lim, Options{ReportingInterval: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer(ServerOption())
	srv.Register(gs)
	go func() { _ = gs.Serve(ln) }()
	defer gs.Stop()
	const streams, conns, buckets, keys = 1000, 10, 100, 10000
	ccs := make([]*grpc.ClientConn, conns)
	for i := range ccs {
		ccs[i], err = grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
		if err != nil {
			b.Fatal(err)
		}
		defer ccs[i].Close()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sts := make([]grpc.ClientStream, streams)
	wires := make([][]byte, streams)
	for i := range sts {
		m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "api"}
		for j := range buckets {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId:    &rlqsv3.BucketId{Bucket: map[string]string{"user": fmt.Sprint((i*buckets + j*7) % keys), "name": "per-user"}},
				TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 5, NumRequestsDenied: 1})
		}
		wires[i], _ = proto.Marshal(m)
		sts[i], err = ccs[i%conns].NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/"+ServiceName+"/StreamRateLimitQuotas")
		if err != nil {
			b.Fatal(err)
		}
		go func(st grpc.ClientStream) {
			var d struct{}
			for st.RecvMsg(&d) == nil {
			}
		}(sts[i])
	}
	handled := func() float64 { return testutil.ToFloat64(srv.metrics.messages) }
	send := func(n int) {
		var wg sync.WaitGroup
		for i := range streams {
			wg.Go(func() {
				for k := i; k < n; k += streams {
					if err := sts[i].SendMsg(&wires[i]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	base := handled()
	send(streams) // every bucket made
	for handled() < base+streams {
		time.Sleep(time.Millisecond)
	}
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	base = handled()
	b.ResetTimer()
	send(b.N)
	for handled() < base+float64(b.N) {
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*buckets), "cpu-ns/bucket")
}

// rawCodec sends pre-encoded messages and discards what it receives.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(mem.BufferSlice, any) error { return nil }
func (rawCodec) Name() string                         { return "proto" }
