// Package loadgen drives a rate-limit service with Envoy's RLS v3 gRPC call
// (ShouldRateLimit) or streamlimit's HTTP check API (POST /v1/check) and measures what it
// answers: throughput, the p50 and p99 of per-call latency, and how many calls were
// admitted, in total and per key. Run sends what a Config says. It is the engine of
// bench/cmd/loadgen and of the serving benchmark (docs/performance.md).
package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// API names the protocol a Config drives.
type API string

// The APIs a Config can drive.
const (
	// GRPC is Envoy's envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit.
	GRPC API = "grpc"
	// HTTP is streamlimit's POST /v1/check with a JSON body.
	HTTP API = "http"
)

// Config says what to send where. Zero fields take the default written in their comment.
//
// Keys are the values of one descriptor entry ("user" = "0" … "Keys−1", with Prefix), used
// round-robin by every caller. With Rate > 0 the calls are paced open-loop: call i is due
// at start + i/Rate whichever caller sends it, and its latency is measured from when it was
// due, so that a server that falls behind shows it in the percentiles instead of slowing
// the generator down. With Rate 0 every caller sends its next call as soon as the last one
// returns (closed loop: the throughput the server can sustain). A hot-key run is Keys 10
// with a per-key Rate and PerKey set, or HotKeys among many cold keys with HotShare of
// the calls.
type Config struct {
	// API is GRPC or HTTP. Default GRPC.
	API API
	// Addr is the server's host:port. Required.
	Addr string
	// Callers is the number of goroutines sending calls, each with one call in flight.
	// Default 32.
	Callers int
	// Conns is the number of connections: gRPC client connections the callers share
	// round-robin (HTTP/2 multiplexes their calls), or the most HTTP/1.1 keep-alive
	// connections (a caller waits for a free one). Default 4.
	Conns int
	// Keys is the number of distinct descriptor values. Default 10 000.
	Keys int
	// HotKeys, when > 0, makes the first HotKeys of the Keys hot: HotShare of the calls go
	// to them (round-robin among them), the rest to the other keys. Default 0: every key
	// alike.
	HotKeys int
	// HotShare is the fraction of calls that go to the hot keys, in (0, 1]. Default 0.5
	// when HotKeys is set.
	HotShare float64
	// Prefix is prepended to every descriptor value, so that runs against one server do
	// not share keys. Default "".
	Prefix string
	// Domain and Descriptor are the request's domain and its descriptor entry's key.
	// Defaults "api" and "user".
	Domain, Descriptor string
	// Duration is how long calls are sent. Default 10s.
	Duration time.Duration
	// Warmup, when > 0, sends one call per key before the measurement (so that the server
	// holds every counter), then waits Warmup. Default 0: no warm-up.
	Warmup time.Duration
	// Rate is the total offered load in calls per second, paced open-loop; 0 means as fast
	// as the callers go (closed loop). Default 0.
	Rate float64
	// PerKey, when set, makes Result.PerKey list the calls and admissions of every key.
	PerKey bool
}

func (c Config) withDefaults() (Config, error) {
	if c.API == "" {
		c.API = GRPC
	}
	if c.API != GRPC && c.API != HTTP {
		return c, fmt.Errorf("loadgen: API %q: want grpc or http", c.API)
	}
	if c.Addr == "" {
		return c, errors.New("loadgen: Addr is required")
	}
	if c.Callers == 0 {
		c.Callers = 32
	}
	if c.Conns == 0 {
		c.Conns = 4
	}
	if c.Keys == 0 {
		c.Keys = 10_000
	}
	if c.Domain == "" {
		c.Domain = "api"
	}
	if c.Descriptor == "" {
		c.Descriptor = "user"
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.HotKeys > 0 && c.HotShare == 0 {
		c.HotShare = 0.5
	}
	if c.HotKeys < 0 || c.HotKeys > c.Keys || c.HotShare < 0 || c.HotShare > 1 || (c.HotKeys == c.Keys && c.HotShare < 1 && c.HotKeys > 0) {
		return c, fmt.Errorf("loadgen: hot keys %d of %d with share %g: want 0 ≤ hot ≤ keys, share in (0, 1], and cold keys left unless the share is 1",
			c.HotKeys, c.Keys, c.HotShare)
	}
	if c.Callers < 1 || c.Conns < 1 || c.Keys < 1 || c.Duration < 0 || c.Rate < 0 {
		return c, fmt.Errorf("loadgen: callers %d, conns %d, keys %d must be ≥ 1, duration %v and rate %g ≥ 0",
			c.Callers, c.Conns, c.Keys, c.Duration, c.Rate)
	}
	return c, nil
}

// KeyResult is what one key got.
type KeyResult struct {
	Key      string `json:"key"`
	Calls    int64  `json:"calls"`
	Admitted int64  `json:"admitted"`
}

// Result is what a run measured.
type Result struct {
	// Calls is the number of calls answered (admitted or denied) in the measured period.
	Calls int64 `json:"calls"`
	// Admitted and Denied split Calls by the overall code.
	Admitted int64 `json:"admitted"`
	Denied   int64 `json:"denied"`
	// Errors counts calls that failed (transport error, bad status, unparsable answer).
	Errors int64 `json:"errors"`
	// FirstError is the first failure, "" when none.
	FirstError string `json:"first_error,omitempty"`
	// Elapsed is the measured period.
	Elapsed time.Duration `json:"elapsed_ns"`
	// Start is when the first call was sent, End when every counted call had returned: the
	// server decided every counted call within [Start, End] (what a limit can admit over
	// the run is bounded through them, bench/summarize).
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// ReqPerSec is Calls / Elapsed.
	ReqPerSec float64 `json:"req_per_s"`
	// P50 and P99 are percentiles of per-call latency (from the due time when paced).
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	// PerKey lists every key's calls and admissions when Config.PerKey is set.
	PerKey []KeyResult `json:"per_key,omitempty"`
}

// caller sends one call for key index i and reports whether it was admitted.
type caller func(ctx context.Context, i int) (admitted bool, err error)

// Run sends calls as cfg says until cfg.Duration has passed or ctx is done, and returns
// what it measured. It fails only when it cannot connect or the warm-up fails.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Result{}, err
	}
	newCaller, closeAll, err := connect(cfg)
	if err != nil {
		return Result{}, err
	}
	defer closeAll()
	if cfg.Warmup > 0 {
		call := newCaller(0)
		for i := range cfg.Keys {
			if _, err := call(ctx, i); err != nil {
				return Result{}, fmt.Errorf("loadgen: warm-up call %d: %w", i, err)
			}
		}
		time.Sleep(cfg.Warmup)
	}

	type local struct {
		lats                  []time.Duration
		calls, admitted, errs int64
		firstErr              error
		keyCalls, keyAdmitted []int64
	}
	var (
		next   atomic.Int64
		wg     sync.WaitGroup
		locals = make([]*local, cfg.Callers)
	)
	// The calls' deadline is the period's end itself: a call cut off by the deadline has
	// then always ended at or after end, so it is told apart from a failure below.
	start := time.Now()
	end := start.Add(cfg.Duration)
	runCtx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	var interval time.Duration
	if cfg.Rate > 0 {
		interval = time.Duration(float64(time.Second) / cfg.Rate)
	}
	for c := range cfg.Callers {
		l := &local{lats: make([]time.Duration, 0, 1<<14)}
		if cfg.PerKey {
			l.keyCalls, l.keyAdmitted = make([]int64, cfg.Keys), make([]int64, cfg.Keys)
		}
		locals[c] = l
		call := newCaller(c)
		wg.Go(func() {
			for {
				n := next.Add(1) - 1
				due := time.Now()
				if interval > 0 {
					due = start.Add(time.Duration(n) * interval)
					if !due.Before(end) {
						return
					}
					if d := time.Until(due); d > 0 {
						select {
						case <-time.After(d):
						case <-runCtx.Done():
							return
						}
					}
				} else if !due.Before(end) {
					return
				}
				k := keyOf(cfg, n)
				ok, err := call(runCtx, k)
				if err != nil {
					if runCtx.Err() != nil || !time.Now().Before(end) {
						return // the period ended during the call: not a failure
					}
					l.errs++
					if l.firstErr == nil {
						l.firstErr = err
					}
					continue
				}
				l.lats = append(l.lats, time.Since(due))
				l.calls++
				if ok {
					l.admitted++
				}
				if cfg.PerKey {
					l.keyCalls[k]++
					if ok {
						l.keyAdmitted[k]++
					}
				}
			}
		})
	}
	wg.Wait()
	elapsed := min(time.Since(start), cfg.Duration)

	r := Result{Start: start, End: time.Now()}
	var lats []time.Duration
	if cfg.PerKey {
		r.PerKey = make([]KeyResult, cfg.Keys)
		for k := range r.PerKey {
			r.PerKey[k].Key = cfg.Prefix + strconv.Itoa(k)
		}
	}
	for _, l := range locals {
		lats = append(lats, l.lats...)
		r.Calls += l.calls
		r.Admitted += l.admitted
		r.Errors += l.errs
		if l.firstErr != nil && r.FirstError == "" {
			r.FirstError = l.firstErr.Error()
		}
		for k := range l.keyCalls {
			r.PerKey[k].Calls += l.keyCalls[k]
			r.PerKey[k].Admitted += l.keyAdmitted[k]
		}
	}
	r.Denied = r.Calls - r.Admitted
	r.Elapsed = elapsed
	if elapsed > 0 {
		r.ReqPerSec = float64(r.Calls) / elapsed.Seconds()
	}
	if len(lats) > 0 {
		slices.Sort(lats)
		r.P50 = lats[(len(lats)-1)/2]
		r.P99 = lats[int(0.99*float64(len(lats)-1))]
	}
	return r, nil
}

// keyOf returns the key index of call n: round-robin over every key, or, with hot keys,
// HotShare of the calls (spread evenly: call n is hot when ⌊(n+1)·share⌋ > ⌊n·share⌋)
// round-robin over the hot keys and the others over the cold ones.
func keyOf(cfg Config, n int64) int {
	if cfg.HotKeys == 0 {
		return int(n % int64(cfg.Keys))
	}
	hotBefore := int64(float64(n) * cfg.HotShare)
	if int64(float64(n+1)*cfg.HotShare) > hotBefore {
		return int(hotBefore % int64(cfg.HotKeys))
	}
	cold := int64(cfg.Keys - cfg.HotKeys)
	return cfg.HotKeys + int((n-hotBefore)%cold)
}

// connect opens cfg.Conns connections and returns a caller factory (one caller per
// goroutine, each on connection c mod Conns) and a function that closes them.
func connect(cfg Config) (func(c int) caller, func(), error) {
	values := make([]string, cfg.Keys)
	for i := range values {
		values[i] = cfg.Prefix + strconv.Itoa(i)
	}
	switch cfg.API {
	case HTTP:
		tr := &http.Transport{
			MaxConnsPerHost: cfg.Conns, MaxIdleConnsPerHost: cfg.Conns, MaxIdleConns: cfg.Conns,
			DisableCompression: true,
			DialContext:        (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		}
		client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		url := "http://" + cfg.Addr + "/v1/check"
		bodies := make([][]byte, cfg.Keys)
		for i, v := range values {
			bodies[i] = []byte(`{"domain":` + strconv.Quote(cfg.Domain) + `,"descriptors":[{"entries":[{"key":` +
				strconv.Quote(cfg.Descriptor) + `,"value":` + strconv.Quote(v) + `}]}]}`)
		}
		okMark, overMark := []byte(`"overall_code":"OK"`), []byte(`"overall_code":"OVER_LIMIT"`)
		newCaller := func(int) caller {
			var buf bytes.Buffer
			return func(ctx context.Context, i int) (bool, error) {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(bodies[i]))
				if err != nil {
					return false, err
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					return false, err
				}
				buf.Reset()
				_, err = buf.ReadFrom(resp.Body)
				resp.Body.Close()
				switch {
				case err != nil:
					return false, err
				case resp.StatusCode == http.StatusOK && bytes.Contains(buf.Bytes(), okMark):
					return true, nil
				case resp.StatusCode == http.StatusTooManyRequests && bytes.Contains(buf.Bytes(), overMark):
					return false, nil
				case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests:
					return false, fmt.Errorf("status %d: %.200s", resp.StatusCode, buf.Bytes())
				}
				return false, fmt.Errorf("no overall_code in %.200s", buf.Bytes())
			}
		}
		return newCaller, tr.CloseIdleConnections, nil
	default:
		conns := make([]*grpc.ClientConn, cfg.Conns)
		closeAll := func() {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
		}
		for i := range conns {
			// Each connection is its own ClientConn: gRPC would otherwise share one HTTP/2
			// connection among them.
			c, err := grpc.NewClient(cfg.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithUserAgent("streamlimit-loadgen/"+strconv.Itoa(i)))
			if err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("loadgen: grpc client: %w", err)
			}
			conns[i] = c
		}
		reqs := make([]*rlsv3.RateLimitRequest, cfg.Keys)
		for i, v := range values {
			reqs[i] = &rlsv3.RateLimitRequest{Domain: cfg.Domain, HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{
				{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: cfg.Descriptor, Value: v}}},
			}}
		}
		newCaller := func(c int) caller {
			client := rlsv3.NewRateLimitServiceClient(conns[c%len(conns)])
			return func(ctx context.Context, i int) (bool, error) {
				resp, err := client.ShouldRateLimit(ctx, reqs[i])
				if err != nil {
					return false, err
				}
				switch resp.GetOverallCode() {
				case rlsv3.RateLimitResponse_OK:
					return true, nil
				case rlsv3.RateLimitResponse_OVER_LIMIT:
					return false, nil
				}
				return false, fmt.Errorf("overall code %v", resp.GetOverallCode())
			}
		}
		return newCaller, closeAll, nil
	}
}
