// Command rlqsload drives an RLQS server (envoy.service.rate_limit_quota.v3) as a fleet of
// Envoys would (-streams streams over -conns connections, each reporting -buckets buckets
// every -interval) and measures the bucket reports the server counted per second and,
// given -server-pid, its CPU time per report. With -bench NAME it prints one line in
// `go test -bench` format for bench/summarize.
//
//	go run ./bench/cmd/rlqsload -addr 127.0.0.1:8083 -metrics http://127.0.0.1:8081/metrics -streams 10000 -buckets 100
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// envoyWindowBytes is Envoy's default HTTP/2 stream and connection window
// (OptionsLimits' DEFAULT_INITIAL_STREAM_WINDOW_SIZE and
// DEFAULT_INITIAL_CONNECTION_WINDOW_SIZE, source/common/http/utility.h in Envoy's source).
const envoyWindowBytes = 256 << 20

const method = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"

func main() {
	var (
		addr, metricsURL, bench, domain string
		streams, conns, buckets, keys   int
		pid                             int
		interval, duration, warmup      time.Duration
	)
	flag.StringVar(&addr, "addr", "127.0.0.1:8083", "RLQS server host:port")
	flag.StringVar(&metricsURL, "metrics", "", "the server's /metrics URL (required: the count of bucket reports served)")
	flag.IntVar(&pid, "server-pid", 0, "the server's process id, for its CPU time per report")
	flag.IntVar(&streams, "streams", 10_000, "streams (Envoys)")
	flag.IntVar(&conns, "conns", 100, "connections the streams share")
	flag.IntVar(&buckets, "buckets", 100, "buckets each stream reports")
	flag.IntVar(&keys, "keys", 10_000, "distinct bucket ids (user values); stream i reports ids i×buckets … modulo keys")
	flag.StringVar(&domain, "domain", "api", "the reports' domain")
	flag.DurationVar(&interval, "interval", time.Second, "each stream's report interval")
	flag.DurationVar(&warmup, "warmup", 5*time.Second, "reports before the measurement")
	flag.DurationVar(&duration, "duration", 10*time.Second, "measured period")
	flag.StringVar(&bench, "bench", "", "print one go-test-bench line named BenchmarkBENCH")
	flag.Parse()
	if metricsURL == "" {
		fmt.Fprintln(os.Stderr, "rlqsload: -metrics is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, addr, metricsURL, bench, domain, streams, conns, buckets, keys, pid, interval, warmup, duration); err != nil {
		fmt.Fprintln(os.Stderr, "rlqsload:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr, metricsURL, bench, domain string, streams, conns, buckets, keys, pid int, interval, warmup, duration time.Duration) error {
	ccs := make([]*grpc.ClientConn, conns)
	for i := range ccs {
		// Fixed receive windows, as Envoy's HTTP/2 client has (256 MiB by default): grpc-go's
		// default sizes its windows by bandwidth estimation, which pings the server at
		// every response it receives — a ping the server must read and acknowledge with a
		// write of its own, a cost no Envoy puts on it.
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(envoyWindowBytes), grpc.WithInitialConnWindowSize(envoyWindowBytes),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
		if err != nil {
			return err
		}
		defer cc.Close()
		ccs[i] = cc
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sent, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for s := range streams {
		msg := encode(domain, s, buckets, keys)
		phase := time.Duration(rand.Int64N(int64(interval)))
		wg.Go(func() {
			st, err := ccs[s%conns].NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
			if err != nil {
				if ctx.Err() == nil {
					failed.Add(1)
				}
				return
			}
			go func() {
				var m discard
				for st.RecvMsg(&m) == nil {
				}
			}()
			next := start.Add(phase)
			for {
				t := time.NewTimer(time.Until(next))
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				if err := st.SendMsg(&msg); err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
					}
					return
				}
				sent.Add(1)
				next = next.Add(interval)
			}
		})
	}
	if !sleep(ctx, warmup) {
		return ctx.Err()
	}
	r0, err := served(metricsURL)
	if err != nil {
		return err
	}
	c0, s0, t0 := cpu(pid), sent.Load(), time.Now()
	if !sleep(ctx, duration) {
		return ctx.Err()
	}
	r1, err := served(metricsURL)
	if err != nil {
		return err
	}
	c1, s1, el := cpu(pid), sent.Load(), time.Since(t0)
	cancel()
	wg.Wait()
	reports := (r1 - r0) / el.Seconds()
	offered := float64(streams*buckets) / interval.Seconds()
	msgs := float64(s1-s0) / el.Seconds()
	var cpuPer, cores float64
	if pid > 0 && r1 > r0 {
		cpuPer = (c1 - c0).Seconds() * 1e6 / (r1 - r0)
		cores = (c1 - c0).Seconds() / el.Seconds()
	}
	rss := rssMiB(pid)
	if bench != "" {
		fmt.Printf("Benchmark%s 1 %d ns/op %.0f reports/s %.0f offered-reports/s %.0f messages/s %.3f server-cpu-µs/report %.2f server-cores %.0f server-rss-MiB %d failed-streams\n",
			bench, el.Nanoseconds(), reports, offered, msgs, cpuPer, cores, rss, failed.Load())
		return nil
	}
	fmt.Printf("%d streams × %d buckets every %v (offered %.0f bucket reports/s): served %.0f/s, %.0f messages/s sent, server CPU %.3f µs per report (%.2f cores), RSS %.0f MiB, %d streams failed\n",
		streams, buckets, interval, offered, reports, msgs, cpuPer, cores, rss, failed.Load())
	return nil
}

// encode returns stream s's report of its buckets, as Envoy sends it every interval.
func encode(domain string, s, buckets, keys int) []byte {
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: domain}
	for j := range buckets {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{"user": strconv.Itoa((s*buckets + j) % keys), "name": "per-user"}},
			TimeElapsed:        durationpb.New(time.Second),
			NumRequestsAllowed: 5, NumRequestsDenied: 1,
		})
	}
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// scraper reads the server's metrics on a fresh connection each time, with a long
// timeout: a saturated server answers late, and a kept-alive connection it has timed out
// would read as EOF.
var scraper = &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}

// served returns the server's streamlimit_rlqs_bucket_reports_total.
func served(url string) (float64, error) {
	resp, err := scraper.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "streamlimit_rlqs_bucket_reports_total "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("%s: no streamlimit_rlqs_bucket_reports_total", url)
}

// cpu returns process pid's CPU time (user + system), 0 without a pid.
func cpu(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name (which may hold spaces) start at the last ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// rssMiB returns process pid's resident set size in MiB, 0 without a pid.
func rssMiB(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// rawCodec sends pre-encoded messages and discards what it receives.
type rawCodec struct{}

type discard struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, _ any) error { return nil }

func (rawCodec) Name() string { return "proto" }

var _ encoding.CodecV2 = rawCodec{}
