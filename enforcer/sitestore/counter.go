package sitestore

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/window"
)

//go:embed counter.lua
var counterSrc string

// CounterOptions configures a Counter.
type CounterOptions struct {
	// SubBuckets is the number of sub-buckets per window. It must equal the aggregator's
	// (and the fallback's), or this site's exact count and the snapshot's count of this
	// site are different measures. Default: 60.
	SubBuckets int
	// FallbackShare is the part of each cap this process may fill while Redis is
	// unavailable and it counts only itself: 1/number of enforcers sharing the Redis.
	// Default 1.
	FallbackShare float64
	// Fallback counts while Redis is unavailable. Its SubBuckets should equal SubBuckets.
	// Default (nil): sitecount.NewLocal with SubBuckets and default MaxKeys.
	Fallback *sitecount.Local
}

// Counter is the Redis sitecount.Counter: the exact sliding-window count of each global
// counter key for a site that is a whole data center, shared by all of its enforcers
// through the Store's Redis (docs/architecture.md, invariant 3). It keeps package window's ring of
// sub-buckets per key, so for the same sequence of calls it gives the same counts and the
// same Commit answers as sitecount.Local (see below for the one difference), and
// counts by the aggregator's rule, except for an op with Hard set, whose oldest sub-bucket
// counts whole until it has left the window (window.Ring.CountHard), as sitecount.Local
// counts it: this site then never admits more than the cap in any window.
//
// Each counter key is one Redis hash, KeyPrefix + "g{" + HashTag(key) + "}" + key, with the
// window in field "w", the ring's newest bucket index in "h", and one field per non-empty
// bucket (its absolute index, unix ms / bucket width) holding its count. A Commit trims the
// buckets that fall out of the ring and sets the key's TTL to window + bucket width +
// Config.ExpirySlack: by then the count is zero, so expiry loses nothing. Counts is one
// read-only script call for all ops; Commit is one atomic script call that checks every op
// and adds all of them, or none. On a Redis Cluster with ops of several hash tags, there is
// one call per tag, each all-or-nothing on its own (docs/redis.md, hash tags).
//
// Counter uses the Store's client, timeout, circuit breaker and metrics. It never returns
// an error: when Redis fails, times out or the breaker is open, the call is answered by
// the in-process fallback counter and counted in
// streamlimit_redis_counter_fallback_total{op,reason}. The fallback starts from this
// process's share of the site's last count Redis reported, and its commits are written
// back to Redis before Redis answers again (outage.go).
//
// Differences from sitecount.Local: keys expire by their TTL in Redis's clock
// rather than being evicted when idle, so a caller whose clock runs far behind Redis's
// (beyond the slack) may find a key gone whose count it would still see as non-zero; a
// denied Commit reports the counts of all ops, where sitecount.Local stops at the first op
// that does not fit; and the interpolated count (whole + oldest × fraction, computed in
// Lua) may differ in the last bit where the Go compiler fuses that multiply-add (e.g. on
// arm64), which can flip a Commit only when count + N equals Cap to the last bit.
//
// A Counter is safe for simultaneous use by multiple goroutines. It holds no per-key
// state in process (apart from the fallback's, bounded by its MaxKeys).
type Counter struct {
	s        *Store
	sub      int
	fallback *sitecount.Local
	share    float64 // CounterOptions.FallbackShare
	script   *redis.Script
}

var (
	_ sitecount.Counter          = (*Counter)(nil)
	_ sitecount.FallbackReporter = (*Counter)(nil)
)

// NewCounter returns a Counter on s's Redis. It does not contact Redis.
func NewCounter(s *Store, opts CounterOptions) *Counter {
	if opts.SubBuckets <= 0 {
		opts.SubBuckets = 60
	}
	if opts.Fallback == nil {
		opts.Fallback = sitecount.NewLocal(sitecount.LocalOptions{SubBuckets: opts.SubBuckets})
	}
	if opts.FallbackShare <= 0 || opts.FallbackShare > 1 {
		opts.FallbackShare = 1
	}
	return &Counter{s: s, sub: opts.SubBuckets, fallback: opts.Fallback, share: opts.FallbackShare, script: redis.NewScript(counterSrc)}
}

// Fallback returns the in-process counter that answers while Redis is unavailable.
func (c *Counter) Fallback() *sitecount.Local { return c.fallback }

// RedisKey returns the Redis key of the hash that holds counter key's buckets.
func (c *Counter) RedisKey(key string) string {
	tag := c.s.tag(key)
	if tag == "" {
		tag = "_" // "{}" would make Redis hash the whole key
	}
	return c.s.prefix + "g{" + tag + "}" + key
}

// Counts implements sitecount.Counter: out[i] (len(out) ≥ len(ops)) receives the
// site's count of ops[i].Key at now over ops[i].Window, or 0 when the key's ring was made
// for another window. It always returns nil.
func (c *Counter) Counts(ctx context.Context, now time.Time, ops []sitecount.Op, out []float64) error {
	if len(ops) == 0 {
		return nil
	}
	if c.s.cluster && len(ops) > 1 {
		if groups := c.groups(ops); len(groups) > 1 {
			for _, g := range groups {
				gops := make([]sitecount.Op, len(g))
				gout := make([]float64, len(g))
				for k, i := range g {
					gops[k] = ops[i]
				}
				_ = c.Counts(ctx, now, gops, gout)
				for k, i := range g {
					out[i] = gout[k]
				}
			}
			return nil
		}
	}
	keys, args := c.args(now, ops, false)
	start := c.s.clk.Now()
	if reason := c.call(ctx, now, c.s.tag(ops[0].Key), keys, args, out, nil); reason != "" {
		if reason == reasonCanceled {
			c.s.m.canceled.Inc()
		} else {
			c.s.m.counterFB.WithLabelValues("counts", reason).Inc()
			now = c.s.after(now, start)
			c.seedCounter(ctx, now, ops)
		}
		return c.fallback.Counts(ctx, now, ops, out)
	}
	c.noteCounts(now, ops, out, false)
	return nil
}

// call runs the script (in a batch; tag is the ops' hash tag) and stores the counts it reports in out (if not nil) and whether
// it committed in ok (if not nil). It returns "" or a fallback reason.
func (c *Counter) call(ctx context.Context, now time.Time, tag string, keys []string, args []any, out []float64, ok *bool) string {
	return c.s.run(ctx, now, &call{kind: kindCounter, tag: tag, keys: keys, args: args}, func(res []any) error {
		fits, err := parseCounts(res, len(keys), out)
		if ok != nil {
			*ok = fits
		}
		return err
	})
}

// parseCounts reads the counter script's reply for n ops: the counts into out (if not
// nil), and whether a commit fitted.
func parseCounts(res []any, n int, out []float64) (bool, error) {
	if len(res) != 1+n {
		return false, fmt.Errorf("counter script returned %d values for %d ops", len(res), n)
	}
	if out != nil {
		for i, x := range res[1:] {
			r, ok := x.(string)
			if !ok {
				return false, fmt.Errorf("counter script returned %T for a count", x)
			}
			v, err := strconv.ParseFloat(r, 64)
			if err != nil {
				return false, fmt.Errorf("counter script returned count %q: %w", r, err)
			}
			out[i] = v
		}
	}
	return res[0] == "1", nil
}

// Commit implements sitecount.Counter: if, for every i, the count of ops[i] at now plus
// the N of the earlier ops of the request on the same key plus ops[i].N is at most
// ops[i].Cap (a NaN or +Inf cap always fits), it adds each N to now's bucket of its key
// and reports true; otherwise it adds nothing and reports false. When counts is not nil
// (len ≥ len(ops)), counts[i] receives the count of ops[i] at now before the request, for
// every i whatever the outcome. The error is always nil.
func (c *Counter) Commit(ctx context.Context, now time.Time, ops []sitecount.Op, counts []float64) (bool, error) {
	ok, _, err := c.CommitReport(ctx, now, ops, counts)
	return ok, err
}

// CommitReport is Commit that also reports whether the answer came from the in-process
// fallback instead of Redis, so that a caller can mark such a decision as a fallback.
func (c *Counter) CommitReport(ctx context.Context, now time.Time, ops []sitecount.Op, counts []float64) (ok, fellBack bool, err error) {
	if len(ops) == 0 {
		return true, false, nil
	}
	if c.s.cluster && len(ops) > 1 {
		if groups := c.groups(ops); len(groups) > 1 {
			all := true
			for _, g := range groups {
				gops := make([]sitecount.Op, len(g))
				gcounts := make([]float64, len(g))
				for k, i := range g {
					gops[k] = ops[i]
				}
				if all {
					var fb bool
					all, fb, _ = c.CommitReport(ctx, now, gops, gcounts)
					fellBack = fellBack || fb
				} else {
					_ = c.Counts(ctx, now, gops, gcounts)
				}
				if counts != nil {
					for k, i := range g {
						counts[i] = gcounts[k]
					}
				}
			}
			return all, fellBack, nil
		}
	}
	if counts == nil {
		counts = make([]float64, len(ops)) // the last known counts need them
	}
	keys, args := c.args(now, ops, true)
	start := c.s.clk.Now()
	if reason := c.call(ctx, now, c.s.tag(ops[0].Key), keys, args, counts, &ok); reason != "" {
		if reason == reasonCanceled {
			// Nobody will receive the answer: commit nothing anywhere.
			c.s.m.canceled.Inc()
			_ = c.fallback.Counts(ctx, now, ops, counts)
			return false, false, nil
		}
		c.s.m.counterFB.WithLabelValues("commit", reason).Inc()
		now = c.s.after(now, start)
		c.seedCounter(ctx, now, ops)
		ok, err = c.fallbackCommit(ctx, now, ops, counts)
		if ok {
			c.pendCounts(now, ops)
		}
		return ok, true, err
	}
	c.noteCounts(now, ops, counts, ok)
	return ok, false, nil
}

// fallbackCommit commits in process, each cap scaled to this process's FallbackShare.
func (c *Counter) fallbackCommit(ctx context.Context, now time.Time, ops []sitecount.Op, counts []float64) (bool, error) {
	if c.share >= 1 {
		return c.fallback.Commit(ctx, now, ops, counts)
	}
	var buf [8]sitecount.Op
	scaled := append(buf[:0], ops...)
	for i := range scaled {
		scaled[i].Cap *= c.share
	}
	return c.fallback.Commit(ctx, now, scaled, counts)
}

const counterArgsPerOp = 10

// args builds the script's keys and arguments (see counter.lua). All the window arithmetic
// is done here, with package window's own functions, so that the script only adds and
// compares.
func (c *Counter) args(now time.Time, ops []sitecount.Op, commit bool) ([]string, []any) {
	ms := now.UnixMilli()
	keys := make([]string, len(ops))
	args := make([]any, 0, 2+counterArgsPerOp*len(ops))
	mode := "0"
	if commit {
		mode = "1"
	}
	args = append(args, mode, len(ops))
	for i := range ops {
		op := &ops[i]
		keys[i] = c.RedisKey(op.Key)
		spec := window.NewSpec(op.Window, c.sub, 0)
		i0, frac := spec.Oldest(ms)
		if op.Hard {
			frac = 1 // window.Ring.CountHard: the oldest bucket counts whole until it has left
		}
		args = append(args, op.Window.Milliseconds(), spec.Window, spec.Slots, spec.Bucket(ms), i0, frac,
			addAmount(op.N), float64(op.N), capArg(op.Cap), spec.Window+spec.Width+c.s.slackMs)
	}
	return keys, args
}

// addAmount clamps n to [−2³²−1, 2³²], where window.Ring.Add's uint32 arithmetic gives the
// same bucket value as for n itself (saturation, or wrap-around below zero).
func addAmount(n int64) int64 {
	const lim = 1 << 32
	return max(min(n, lim), -lim-1)
}

// capArg renders the cap for the script; infinities and NaN, which Lua cannot parse, as
// the outcome they give in sitecount.Local's comparison cur+N > cap.
func capArg(c float64) any {
	switch {
	case math.IsNaN(c) || math.IsInf(c, 1):
		return "inf"
	case math.IsInf(c, -1):
		return "-inf"
	}
	return c
}

// groups returns the index sets of ops per hash tag, in first-appearance order.
func (c *Counter) groups(ops []sitecount.Op) [][]int {
	return groupByTag(len(ops), func(i int) string { return c.s.tag(ops[i].Key) })
}
