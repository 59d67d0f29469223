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

	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/topics"
)

// BenchmarkHandle times one stream's report of 100 buckets (keys shared with 99 other
// streams), from the message in wire form to the response: the server's work per report
// message, without gRPC. b.N counts messages; cpu-ns/bucket is per bucket report.
//
// snapshot=3dc is the path of a deployment: the enforcer has the counts of three data
// centers (this site's and two others', fresh), and each report's quota is shared among
// them by the demand its report stands for. snapshot=none is a single site (--no-kafka),
// whose global limits are its default share.
func BenchmarkHandle(b *testing.B) {
	for _, snap := range []string{"none", "3dc"} {
		b.Run("snapshot="+snap, func(b *testing.B) { benchHandle(b, snap == "3dc") })
	}
}

func benchHandle(b *testing.B, withSnapshot bool) {
	cfg, err := rules.Parse("bench.yaml", []byte(userRules))
	if err != nil {
		b.Fatal(err)
	}
	const streams, buckets, keys = 100, 100, 1000
	clk := clock.NewFake(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	ecfg := enforcer.Config{Rules: rules.Static(cfg), Site: "eu", Clock: clk}
	var sn *snapshot.Snapshot
	if withSnapshot {
		if sn, err = snapshot.NewMemory(snapshot.Config{Site: "eu", Clock: clk}); err != nil {
			b.Fatal(err)
		}
		ecfg.Snapshot = sn
	}
	lim, err := enforcer.New(ecfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	userOf := func(k int) enforcer.Request {
		return enforcer.Request{Domain: "api", Descriptors: [][]rules.Entry{{{Key: "user", Value: fmt.Sprint(k)}}}}
	}
	var feed func() // keeps the snapshot fresh: heartbeats and counts of three sites
	if withSnapshot {
		agg, err := aggregator.NewMemory(aggregator.Config{})
		if err != nil {
			b.Fatal(err)
		}
		names := make([]string, keys)
		for k := range names {
			qs, _ := lim.Reporter(userOf(k)).Report(ctx, clk.Now(), 0, 0, time.Second, nil)
			names[k] = qs[0].Key
		}
		feed = func() {
			now := clk.Now()
			ms := now.UnixMilli()
			for _, site := range []string{"eu", "us", "ap"} {
				topic := topics.DefaultHitsTopic
				if site != "eu" {
					topic = topics.RemoteHitsTopic(site, topics.DefaultHitsTopic)
				}
				add := func(h topics.Hit) {
					h.Site = site
					if err := agg.AddFrom(now, topic, h); err != nil {
						b.Fatal(err)
					}
				}
				add(topics.Hit{Key: topics.SiteHeartbeatKey, BucketStart: ms})
				if site == "eu" {
					continue // its own hits are its reports'
				}
				for _, k := range names {
					add(topics.Hit{Key: k, BucketStart: ms - ms%100, Window: (10 * time.Second).Milliseconds(), Count: 1})
				}
			}
			for _, e := range agg.Emit(now) {
				if err := sn.Apply(e.Key, e.Value); err != nil {
					b.Fatal(err)
				}
			}
		}
		feed()
	}
	srv, err := NewServer(lim, Options{Clock: clk, ReportingInterval: time.Second})
	if err != nil {
		b.Fatal(err)
	}
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
	// Warm: every bucket exists on its stream.
	for i := range sess {
		if _, err := sess[i].handle(ctx, clk.Now(), msgs[i].GetDomain(), usagesOf(msgs[i], nil)); err != nil {
			b.Fatal(err)
		}
	}
	if withSnapshot {
		// The path measured is the shared one: fresh counts, not a fallback.
		qs, _ := lim.Reporter(userOf(1)).Report(ctx, clk.Now(), 0, 0, time.Second, nil)
		if len(qs) != 1 || qs[0].Fallback {
			b.Fatalf("quotas %+v: want one, not a fallback", qs)
		}
	}
	wires := make([][]byte, streams)
	for i := range wires {
		wires[i], _ = proto.MarshalOptions{Deterministic: true}.Marshal(msgs[i]) // one wire form per bucket id, as Envoy sends
	}
	b.SetBytes(int64(len(wires[0])))
	b.ReportAllocs()
	var ru0, ru1, f0, f1 syscall.Rusage
	var feedCPU time.Duration
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	var r wireReports
	for i := range b.N {
		clk.Advance(time.Second / streams)
		if feed != nil && i%(streams/10) == 0 {
			// Every 100 ms of the clock, as the aggregator emits; not counted.
			b.StopTimer()
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &f0)
			feed()
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &f1)
			feedCPU += cpuOf(&f1) - cpuOf(&f0)
			b.StartTimer()
		}
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
	cpu := cpuOf(&ru1) - cpuOf(&ru0) - feedCPU
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*buckets), "cpu-ns/bucket")
}

// cpuOf is the user and system time of ru.
func cpuOf(ru *syscall.Rusage) time.Duration {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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
	b.ReportMetric(float64((cpuOf(&ru1)-cpuOf(&ru0)).Nanoseconds())/float64(b.N*buckets), "cpu-ns/bucket")
}

// rawCodec sends pre-encoded messages and discards what it receives.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(mem.BufferSlice, any) error { return nil }
func (rawCodec) Name() string                         { return "proto" }
