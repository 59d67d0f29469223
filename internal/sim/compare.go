package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
)

// Counter names one counting method of the counting-rules comparison.
type Counter string

// The counting methods compared, each run through the project's real code.
const (
	// FixedWindow is algo.FixedWindow: windows aligned to multiples of W.
	FixedWindow Counter = "fixed window"
	// TwoWindow is algo.SlidingWindowEstimate: the current aligned window plus the previous one
	// weighted by its overlap (the common "approximate sliding window").
	TwoWindow Counter = "sliding window counter (2 windows)"
	// SubWindows is the aggregator's rule (package window) with the
	// comparison's sub-bucket count, through sitecount.Local, which global limits use
	// for a site's own count.
	SubWindows Counter = "sub-window counts"
	// ExactLog is algo.SlidingLog, the exact sliding-window log.
	ExactLog Counter = "exact log"
)

// Counters returns the compared methods in table order.
func Counters() []Counter { return []Counter{FixedWindow, TwoWindow, SubWindows, ExactLog} }

// CompareConfig is one counting-rules comparison: the same requests of one client against one
// local limiter (one site, no pipeline), counted by each method. Every zero field takes
// the default written in its comment.
type CompareConfig struct {
	// Scenario is the traffic shape (sites play no part). Default Bursty.
	Scenario Scenario
	// Load is the offered load as a multiple of the limit. Default 5.
	Load float64
	// Limit is requests per Window. Default 100.
	Limit int64
	// Window is the sliding window. Default 10s.
	Window time.Duration
	// Windows and Warmup are the measured and the warm-up windows. Defaults 10 and 1.
	Windows, Warmup int
	// SubBuckets is the sub-window count of SubWindows. Default 60.
	SubBuckets int
	// Seed seeds the traffic.
	Seed uint64
	// Arrivals, when not nil, replaces the generated traffic (times in ms since Start;
	// Site is ignored). It must be sorted by time.
	Arrivals []Arrival
}

// CompareResult is one method's outcome in a comparison.
type CompareResult struct {
	Counter Counter
	// Result holds the statistics, defined as for Run (Config is left zero).
	Result
}

// Compare runs the counting-rules comparison and returns one result per method, in Counters
// order.
func Compare(ctx context.Context, cfg CompareConfig) ([]CompareResult, error) {
	if cfg.Scenario == "" {
		cfg.Scenario = Bursty
	}
	if _, err := ParseScenario(string(cfg.Scenario)); err != nil {
		return nil, err
	}
	if cfg.Load == 0 {
		cfg.Load = 5
	}
	if cfg.Limit == 0 {
		cfg.Limit = 100
	}
	if cfg.Window == 0 {
		cfg.Window = 10 * time.Second
	}
	if cfg.Windows == 0 {
		cfg.Windows = 10
	}
	if cfg.Warmup == 0 {
		cfg.Warmup = 1
	}
	cfg.Warmup = max(cfg.Warmup, 0)
	if cfg.SubBuckets == 0 {
		cfg.SubBuckets = 60
	}
	if cfg.Load <= 0 || cfg.Limit < 1 || cfg.Windows < 1 || cfg.Window < time.Millisecond {
		return nil, errors.New("sim: compare: Load, Limit, Windows and Window must be positive")
	}
	wMs := cfg.Window.Milliseconds()
	warmMs := int64(cfg.Warmup) * wMs
	durMs := warmMs + int64(cfg.Windows)*wMs
	arr := cfg.Arrivals
	if arr == nil {
		seed := seedFor(cfg.Seed, cfg.Scenario, 1, cfg.Load)
		rng := rand.New(rand.NewPCG(seed, seed>>7|1))
		perMs := cfg.Load * float64(cfg.Limit) / float64(wMs)
		arr = Arrivals(rng, cfg.Scenario, 1, durMs, perMs, 0.5*float64(cfg.Limit)/float64(wMs))
	}
	lim := algo.Limit{Requests: cfg.Limit, Window: cfg.Window}
	out := make([]CompareResult, 0, len(Counters()))
	for _, c := range Counters() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var decide func(now time.Time) bool
		switch c {
		case FixedWindow, TwoWindow, ExactLog:
			a := map[Counter]algo.Algorithm{FixedWindow: algo.FixedWindow, TwoWindow: algo.SlidingWindowEstimate, ExactLog: algo.SlidingLog}[c]
			st := algo.New(algo.Options{})
			op := algo.Op{Key: "client", Algorithm: a, Limit: lim, N: 1}
			decide = func(now time.Time) bool { return st.Allow(now, op).Allowed }
		case SubWindows:
			lc := sitecount.NewLocal(sitecount.LocalOptions{SubBuckets: cfg.SubBuckets})
			ops := []sitecount.Op{{Key: "client", Window: cfg.Window, N: 1, Cap: float64(cfg.Limit)}}
			decide = func(now time.Time) bool {
				ok, err := lc.Commit(ctx, now, ops, nil)
				return ok && err == nil
			}
		}
		acc := newAccounting(cfg.Limit, wMs, warmMs)
		i := 0
		endMs := durMs
		if len(arr) > 0 {
			endMs = max(endMs, arr[len(arr)-1].T+1)
		}
		for t := int64(0); t < endMs; t++ {
			for ; i < len(arr) && arr[i].T == t; i++ {
				acc.decide(t, decide(Start().Add(time.Duration(t)*time.Millisecond)))
			}
			acc.tick(t)
		}
		if i != len(arr) {
			return nil, fmt.Errorf("sim: compare: arrivals not sorted or negative at index %d", i)
		}
		var r Result
		acc.result(&r)
		r.Ideal = Oracle(arr, cfg.Limit, wMs, warmMs)
		out = append(out, CompareResult{Counter: c, Result: r})
	}
	return out, nil
}
