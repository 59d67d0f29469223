// Package sitestore is the site-scope counter store: the six algorithms of package algo,
// with algo.Store's exact semantics and Decisions, kept in a Redis shared by all the
// enforcers of one data center so that they count exactly together. Each request is one
// atomic Lua script call over all of its counters: every op takes its N or none does.
//
// New makes a Store from a Config (a go-redis client, or the addresses to make one); the Limiter uses it as its
// enforcer.SiteStore. NewCounter makes, on a Store, the Redis sitecount.Counter: this
// site's exact count of each global key. Both decide in process (algo.Store,
// sitecount.Local) while Redis fails, times out or the breaker is open, and never return
// Redis's error to the caller. CheckLimit tells a rules loader whether a limit is within
// the store's exact range.
//
// How it shares round trips, its timeout and breaker, what it does while Redis is away,
// its time base, Lua's numbers and hash tags: docs/redis.md.
package sitestore

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/sitestore/breaker"
)

// scriptSrc is the site-scope script without its algorithms (see siteScript).
//
//go:embed script.lua
var scriptSrc string

// Redis says which Redis holds a site's counters, how to reach it and how to use it: what
// a deployment sets. Config adds the parts the process that assembles a Store provides.
type Redis struct {
	// Client is the Redis (single, Sentinel or Cluster) to use; the Store does not close
	// it. Set ContextTimeoutEnabled on it, or Timeout cannot interrupt a call. Default
	// (nil): a client built from Addrs, Username, Password and TLS, closed by Close.
	Client redis.UniversalClient
	// Addrs are the Redis addresses (host:port) when Client is nil; several mean Cluster,
	// unless MasterName is set.
	Addrs []string
	// MasterName, when Client is nil, makes Addrs the addresses of Redis Sentinels, and
	// the client follows the master they name under this name through failovers.
	// Default: none (no Sentinel).
	MasterName string
	// Username is the Redis ACL user when Client is nil. Default: none (the default user).
	Username string
	// Password is the Redis password when Client is nil. Default: none.
	Password string
	// TLS enables TLS with these settings when Client is nil. Default (nil): plain TCP.
	TLS *tls.Config
	// KeyPrefix starts every Redis key. It must not contain '{' or '}'. Default
	// DefaultKeyPrefix.
	KeyPrefix string
	// HashTag maps a counter key to the hash tag of its Redis key (docs/redis.md).
	// Default (nil): DomainTag.
	HashTag func(counterKey string) string
	// Timeout bounds each Redis call, including its wait for a pooled connection. It is a
	// bound for a Redis that hangs, not a latency target: under load a healthy Redis's
	// calls queue behind each other and the enforcer's own goroutines, and a call that
	// times out is decided in process. Default: DefaultTimeout.
	Timeout time.Duration
	// Breaker sets the circuit breaker's error-rate window, thresholds and probing; its
	// Clock and OnStateChange are the Store's. Zero fields take package breaker's
	// defaults.
	Breaker breaker.Options
	// ExpirySlack is added to every key's TTL beyond the time its state takes to become
	// empty, to absorb clock skew between enforcers and Redis. Default: 1 s.
	ExpirySlack time.Duration
	// ReturnHold is how long, after the breaker closes again at the end of an outage or
	// after any call that failed, a decision made in Redis must also fit this process's
	// FallbackShare (the in-process count, its outage hits included): the site's other
	// enforcers come back to Redis one at a time, and until one has written back what it
	// admitted on its share, the room Redis shows includes that share again. Only with
	// FallbackShare below 1. Default DefaultReturnHold; negative: none.
	ReturnHold time.Duration
	// Lanes is how many batches of concurrent requests may be in flight to Redis at once;
	// beyond the first, a lane opens only when a full batch (MaxBatch) waits (batch.go).
	// Default DefaultLanes.
	Lanes int
	// MaxBatch is the most requests one batch carries. Default DefaultMaxBatch.
	MaxBatch int
}

// Config configures a Store.
type Config struct {
	Redis
	// FallbackShare is the part of each site limit this process may use while Redis is
	// unavailable, when every enforcer of the site counts only itself: 1/number of
	// enforcers sharing the Redis, so that together they stay within the limit. Requests
	// and Burst are scaled down (at least 1 each). Default 1.
	FallbackShare float64
	// Fallback decides requests while Redis is unavailable. Default (nil): a new
	// algo.Store with default options.
	Fallback *algo.Store
	// Clock drives the breaker's probe interval (decisions use the time passed to each
	// call). Default (nil): clock.Real{}.
	Clock clock.Clock
	// Logger receives breaker transitions (Info) and failed calls while closed (Debug). Default
	// (nil): slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics (namespace streamlimit, subsystem redis). Default
	// (nil): they are not registered.
	Registerer prometheus.Registerer
}

// DefaultTimeout is Config.Timeout's default: above what a healthy Redis's calls take even
// when a hundred callers queue on two busy cores (docs/redis.md has the measurements), so
// that load alone never sends decisions in process. A Redis that hangs costs each request
// in flight one timeout; the breaker, judging the error rate, then keeps the others away.
const DefaultTimeout = 250 * time.Millisecond

// DefaultReturnHold is Config.ReturnHold's default: longer than the probe interval and
// successful probes the breaker needs to close (a second and three calls by default) and
// the reopening a Redis still working through its backlog can cause, as seen on a loaded
// two-core machine (docs/redis.md).
const DefaultReturnHold = 5 * time.Second

// DefaultKeyPrefix is Config.KeyPrefix's default.
const DefaultKeyPrefix = "sl:"

// DomainTag is the default Config.HashTag: the counter key's domain, i.e. its text before
// the first '|' or '#' (see rules.Rule.AppendKey), or the whole key if it has neither.
func DomainTag(counterKey string) string {
	if i := strings.IndexAny(counterKey, "|#"); i >= 0 {
		return counterKey[:i]
	}
	return counterKey
}

// KeyTag is a Config.HashTag that gives every counter its own tag: the best spread over a
// Cluster, but a multi-op request is then all-or-nothing only per tag.
func KeyTag(counterKey string) string { return counterKey }

// Store decides algo.Ops against counters in Redis. It is safe for simultaneous use by
// multiple goroutines. Create it with New and release it with Close.
type Store struct {
	client    redis.UniversalClient
	ownClient bool
	cluster   bool
	prefix    string
	tag       func(string) string
	timeout   time.Duration
	slackMs   int64
	fallback  *algo.Store
	// fallbackShare is Config.FallbackShare, in (0, 1].
	fallbackShare float64
	breaker       *breaker.Breaker
	clk           clock.Clock
	// returnHold is Config.ReturnHold (0: none); holdUntil the instant, by clk, until
	// which decisions made in Redis must also fit the share (extendHold).
	returnHold time.Duration
	holdUntil  atomic.Int64
	// decided, when set (by tests), sees each AllowAll and Counter.CommitWithSite decision
	// made in Redis or in process, with the time it was counted at: a decision in process
	// after a failed call is made later than the time the request carries (Store.after).
	decided func(at time.Time, allowed, fellBack bool)
	log     *slog.Logger
	script  *redis.Script
	batch   *batcher
	m       *metrics
	// known, pend and outage bound what an outage costs (outage.go); outage numbers the
	// breaker's openings, from 1.
	known   *knownTable
	over    *overTable // counters over their limit (overlimit.go)
	pend    *pending
	outage  atomic.Uint64
	flushMu sync.Mutex
	// recovering, while a call runs recover (under flushMu), is closed when it ends.
	recovering atomic.Pointer[chan struct{}]
	// authFailing is set while calls fail on credentials (logged once, logging.go).
	authFailing atomic.Bool
	// fails counts failed calls, and checked is the count up to which Redis has since been
	// checked for a restart that lost its data and the hits admitted meanwhile written
	// back (outage.go): a Redis can restart within a spell too short to open the breaker.
	fails, checked atomic.Uint64
	// aliveKey is set in Redis at most every aliveRefresh (aliveAt: when, unix ns; 0:
	// never) so that a Redis that lost its data can be told (outage.go).
	aliveKey string
	aliveAt  atomic.Int64
}

// New returns a Store. It does not contact Redis: a Redis that is down at start is
// handled like one that fails later.
func New(cfg Config) (*Store, error) {
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = DefaultKeyPrefix
	}
	if strings.ContainsAny(cfg.KeyPrefix, "{}") {
		return nil, fmt.Errorf("sitestore: key prefix %q contains '{' or '}'", cfg.KeyPrefix)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.ExpirySlack <= 0 {
		cfg.ExpirySlack = time.Second
	}
	if cfg.HashTag == nil {
		cfg.HashTag = DomainTag
	}
	if cfg.Fallback == nil {
		cfg.Fallback = algo.New(algo.Options{})
	}
	if cfg.FallbackShare <= 0 || cfg.FallbackShare > 1 {
		cfg.FallbackShare = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Store{
		client: cfg.Client, prefix: cfg.KeyPrefix, tag: cfg.HashTag, timeout: cfg.Timeout,
		slackMs: int64((cfg.ExpirySlack + time.Millisecond - 1) / time.Millisecond), fallback: cfg.Fallback, fallbackShare: cfg.FallbackShare,
		log: cfg.Logger, script: redis.NewScript(siteScript), known: newKnownTable(), over: newOverTable(), pend: newPending(),
		clk: clock.Or(cfg.Clock),
	}
	s.outage.Store(1)
	s.aliveKey = s.prefix + "{_alive}" + s.pend.prefix
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s.m = m
	if s.client == nil {
		if len(cfg.Addrs) == 0 {
			return nil, errors.New("sitestore: neither Client nor Addrs set")
		}
		s.client = redis.NewUniversalClient(&redis.UniversalOptions{
			Addrs: cfg.Addrs, MasterName: cfg.MasterName, Username: cfg.Username, Password: cfg.Password, TLSConfig: cfg.TLS,
			ContextTimeoutEnabled: true,
		})
		s.ownClient = true
	}
	_, s.cluster = s.client.(*redis.ClusterClient)
	if cfg.Lanes <= 0 {
		cfg.Lanes = DefaultLanes
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	s.batch = &batcher{client: s.client, script: redis.NewScript(batchScript), cluster: s.cluster, timeout: s.timeout,
		lanes: cfg.Lanes, max: cfg.MaxBatch, batches: m.batches}
	bopts := cfg.Breaker
	bopts.Clock = cfg.Clock
	switch {
	case cfg.ReturnHold == 0:
		s.returnHold = DefaultReturnHold
	case cfg.ReturnHold > 0:
		s.returnHold = cfg.ReturnHold
	}
	if s.fallbackShare >= 1 {
		s.returnHold = 0
	}
	bopts.OnStateChange = func(st breaker.State) {
		switch {
		case st == breaker.Open:
			s.outage.Add(1)
			s.holdUntil.Store(0) // decided in process, the outage's way
		case s.returnHold <= 0:
		case st == breaker.HalfOpen:
			// Probes are decided in Redis while the others may still be on their shares.
			s.holdUntil.Store(math.MaxInt64)
		case st == breaker.Closed:
			s.holdUntil.Store(s.clk.Now().Add(s.returnHold).UnixNano())
		}
		m.breakerState.Set(float64(st))
		s.log.Info("sitestore: redis circuit breaker", "state", st.String())
	}
	s.breaker = breaker.New(bopts)
	return s, nil
}

// Close closes the Redis client if New built it.
func (s *Store) Close() error {
	if s.ownClient {
		if err := s.client.Close(); err != nil {
			return fmt.Errorf("sitestore: closing redis client: %w", err)
		}
	}
	return nil
}

// BreakerState returns the circuit breaker's state.
func (s *Store) BreakerState() breaker.State { return s.breaker.State() }

// AllowAll decides all ops at now as one atomic step, like algo.Store.AllowAll: if every op
// fits, each takes its N and allowed is true; if any does not, none takes anything.
// out[i] receives op i's Decision (len(out) must be ≥ len(ops)), identical to what
// algo.Store would return for the same history. fellBack reports that Redis was not used
// (failure, timeout, open breaker, or an op outside the exact range, see docs/redis.md)
// and the decision came from the in-process fallback store.
func (s *Store) AllowAll(ctx context.Context, now time.Time, ops []algo.Op, out []algo.Decision) (allowed, fellBack bool) {
	out = out[:len(ops)]
	if len(ops) == 0 {
		return true, false
	}
	if s.overLimit(now, ops, out) {
		s.m.overLimit.Inc()
		return false, false
	}
	start := s.clk.Now()
	if reason := s.usable(now, ops); reason != "" {
		s.m.fallback.WithLabelValues(reason).Inc()
		ok := s.fallbackAllowAll(now, ops, out, false)
		if s.decided != nil {
			s.decided(decidedAt(now, ops, out), ok, true)
		}
		return ok, true
	}
	held, stamped := false, now
	if start.UnixNano() < s.holdUntil.Load() {
		// Back from an outage (Config.ReturnHold): the share decides first, from this
		// process's share of the last known use, and Redis then decides what it admitted.
		s.seedFallback(now, ops)
		if !s.fallbackAllowAll(now, ops, out, false) {
			s.m.fallback.WithLabelValues(reasonReturnHold).Inc()
			if s.decided != nil {
				s.decided(now, false, true)
			}
			return false, true
		}
		held = true
	}
	if s.cluster && len(ops) > 1 {
		if groups := s.groups(ops); len(groups) > 1 {
			return s.allowGroups(ctx, now, ops, out, groups)
		}
	}
	st, reason := s.call(ctx, now, ops, true)
	switch reason {
	case "":
		ok := s.fill(now, ops, st, out)
		s.noteAll(now, ops, out)
		if s.decided != nil {
			s.decided(decidedAt(now, ops, out), ok, false)
		}
		return ok, false
	case reasonCanceled:
		// Nobody will receive the answer: deny, take nothing, and leave the fallback's
		// counts and metrics to requests that are really decided in process.
		s.m.canceled.Inc()
		for i := range ops {
			out[i] = s.fallbackPeek(now, ops[i])
			out[i].Allowed = false
		}
		return false, false
	}
	s.m.fallback.WithLabelValues(reason).Inc()
	if reason != "breaker_open" {
		s.extendHold()
	}
	now = s.after(now, start)
	if held {
		// The share has admitted and counted the request already: it is kept to be
		// written back like any hit admitted in process during an outage.
		s.pendAll(now, ops)
		if s.decided != nil {
			s.decided(decidedAt(stamped, ops, out), true, true)
		}
		return true, true
	}
	ok := s.fallbackAllowAll(now, ops, out, true)
	if s.decided != nil {
		s.decided(decidedAt(now, ops, out), ok, true)
	}
	return ok, true
}

// after returns now moved on by the time since start (by the Store's clock): a request
// decided in process after its Redis call failed is decided when it is, not when it was
// stamped. A call that timed out was stamped a whole timeout earlier, and the in-process
// windows, which a request stamped before the current window would start over, must not
// see the time go back by that much.
func (s *Store) after(now, start time.Time) time.Time {
	if d := s.clk.Now().Sub(start); d > 0 {
		return now.Add(d)
	}
	return now
}

// extendHold makes decisions in Redis fit the share as well for Config.ReturnHold from
// now: the breaker closed after an outage, or a call failed and its request was decided
// in process (the site's other enforcers, whose calls most likely failed as well, may
// be deciding on their shares still, their hits not yet written back).
func (s *Store) extendHold() {
	if s.returnHold <= 0 {
		return
	}
	until := s.clk.Now().Add(s.returnHold).UnixNano()
	for {
		cur := s.holdUntil.Load()
		if cur >= until || s.holdUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// reasonReturnHold is the fallback reason of a request that the share refused while
// Config.ReturnHold applies: Redis was not asked.
const reasonReturnHold = "return_hold"

// reasonCanceled is run's result when the caller's context ended before Redis answered.
const reasonCanceled = "canceled"

// reasonWritingBack is run's result when another call was writing hits back to Redis: the
// request is decided in process.
const reasonWritingBack = "writing_back"

// fallbackAllowAll decides in process, on this process's FallbackShare of each limit. For
// an outage (Redis unavailable, not an op outside the exact range), the fallback starts
// from this process's share of each counter's last known use, and what it admits is kept
// to be written back (outage.go).
func (s *Store) fallbackAllowAll(now time.Time, ops []algo.Op, out []algo.Decision, outage bool) bool {
	if outage {
		s.seedFallback(now, ops)
	}
	share := s.fallbackShare
	var ok bool
	if share >= 1 {
		ok = s.fallback.AllowAll(now, ops, out)
	} else {
		var buf [8]algo.Op
		scaled := append(buf[:0], ops...)
		for i := range scaled {
			scaled[i].Limit = scaleLimit(scaled[i].Limit, share)
		}
		ok = s.fallback.AllowAll(now, scaled, out)
	}
	if ok && outage {
		s.pendAll(now, ops)
	}
	return ok
}

// scaleLimit returns l with Requests and Burst multiplied by share, rounded down but at
// least 1 where they were positive.
func scaleLimit(l algo.Limit, share float64) algo.Limit {
	scale := func(n int64) int64 {
		if n <= 0 {
			return n
		}
		return max(int64(float64(n)*share), 1)
	}
	l.Requests, l.Burst = scale(l.Requests), scale(l.Burst)
	return l
}

// Peek decides op at now without taking anything, like algo.Store.Peek.
func (s *Store) Peek(ctx context.Context, now time.Time, op algo.Op) (d algo.Decision, fellBack bool) {
	ops := []algo.Op{op}
	start := s.clk.Now()
	if reason := s.usable(now, ops); reason != "" {
		s.m.fallback.WithLabelValues(reason).Inc()
		return s.fallbackPeek(now, op), true
	}
	st, reason := s.call(ctx, now, ops, false)
	if reason == reasonCanceled {
		s.m.canceled.Inc()
		return s.fallbackPeek(now, op), false
	}
	if reason != "" {
		s.m.fallback.WithLabelValues(reason).Inc()
		now = s.after(now, start)
		s.seedFallback(now, ops)
		return s.fallbackPeek(now, op), true
	}
	return decide(&op, now.UnixNano(), st[0], false), false
}

func (s *Store) fallbackPeek(now time.Time, op algo.Op) algo.Decision {
	if s.fallbackShare < 1 {
		op.Limit = scaleLimit(op.Limit, s.fallbackShare)
	}
	return s.fallback.Peek(now, op)
}

// fill computes the Decisions from the states the script reported, reproducing
// algo.Store.AllowAll's rollback: when the request is denied, each op that fit on its own
// is re-decided (as a peek) on its counter's state before the request.
func (s *Store) fill(now time.Time, ops []algo.Op, st []opState, out []algo.Decision) bool {
	t := now.UnixNano()
	all := true
	for i := range ops {
		out[i] = decide(&ops[i], t, st[i], true)
		out[i].Allowed = st[i].allowed
		if !st[i].allowed {
			all = false
		}
	}
	if !all {
		for i := range ops {
			if !st[i].allowed {
				continue
			}
			first := i
			for j := 0; j < i; j++ {
				if ops[j].Key == ops[i].Key {
					first = j
					break
				}
			}
			out[i] = decide(&ops[i], t, st[first], false)
			out[i].Allowed = true
		}
	}
	return all
}

// groups returns the index sets of ops per hash tag, in first-appearance order.
func (s *Store) groups(ops []algo.Op) [][]int {
	return groupByTag(len(ops), func(i int) string { return s.tag(ops[i].Key) })
}

// groupByTag returns the indexes 0..n-1 grouped by tag(i), in first-appearance order: a
// Redis Cluster runs one script per hash slot.
func groupByTag(n int, tag func(i int) string) [][]int {
	var tags []string
	var groups [][]int
outer:
	for i := range n {
		t := tag(i)
		for g, tg := range tags {
			if tg == t {
				groups[g] = append(groups[g], i)
				continue outer
			}
		}
		tags = append(tags, t)
		groups = append(groups, []int{i})
	}
	return groups
}

// allowGroups runs one call per hash-tag group (Cluster only): all-or-nothing per group.
func (s *Store) allowGroups(ctx context.Context, now time.Time, ops []algo.Op, out []algo.Decision, groups [][]int) (bool, bool) {
	all, fell := true, false
	for _, g := range groups {
		gops := make([]algo.Op, len(g))
		gout := make([]algo.Decision, len(g))
		for k, i := range g {
			gops[k] = ops[i]
		}
		ok, fb := s.AllowAll(ctx, now, gops, gout)
		all, fell = all && ok, fell || fb
		for k, i := range g {
			out[i] = gout[k]
		}
	}
	return all, fell
}

// maxExact bounds every quantity the script does arithmetic on (docs/redis.md).
const maxExact = 1 << 52

// CheckLimit reports whether lim with alg is within site scope's exact range (see
// docs/redis.md); outside it, requests are decided in process.
func CheckLimit(alg algo.Algorithm, lim algo.Limit) error {
	if err := lim.Validate(); err != nil {
		return err
	}
	a, c := lim.Allowance(), lim.Capacity()
	sa, ok := siteAlgorithms[alg]
	switch {
	case !ok:
		return fmt.Errorf("%v is not kept in Redis: %s", alg, notInRedis[alg])
	case a > maxExact || c > maxExact:
		return fmt.Errorf("allowance %d or capacity %d is over site scope's 2^52", a, c)
	case sa.check != nil:
		return sa.check(lim)
	}
	return nil
}

// nsWindow is the range check of the algorithms whose Lua does arithmetic on the window
// in nanoseconds: at most 2^52 ns.
func nsWindow(lim algo.Limit) error {
	if int64(lim.Window) > maxExact {
		return fmt.Errorf("window %v is longer than site scope's 2^52 ns (about 52 days) for this algorithm", lim.Window)
	}
	return nil
}

// usable returns "" when every op can be decided exactly in Redis, else a fallback reason.
func (s *Store) usable(now time.Time, ops []algo.Op) string {
	if now.UnixNano() < 0 {
		return "out_of_range"
	}
	for i := range ops {
		op := &ops[i]
		if op.N < 0 || op.N > maxExact || CheckLimit(op.Algorithm, op.Limit) != nil {
			return "out_of_range"
		}
	}
	return ""
}

// call runs the script and returns the per-op states, or a fallback reason.
func (s *Store) call(ctx context.Context, now time.Time, ops []algo.Op, commit bool) ([]opState, string) {
	var st []opState
	reason := s.run(ctx, now, s.siteCall(now, ops, commit), func(res []any) (err error) {
		st, err = parseStates(res, len(ops))
		return err
	})
	return st, reason
}

// parseStates reads the site-scope script's reply for n ops: each op's state.
func parseStates(res []any, n int) ([]opState, error) {
	if len(res) != 1+4*n {
		return nil, fmt.Errorf("script returned %d values for %d ops", len(res), n)
	}
	st := make([]opState, n)
	for i := range st {
		var r [4]int64
		for j := range r {
			v, ok := res[1+4*i+j].(int64)
			if !ok {
				return nil, fmt.Errorf("script returned %T for an integer", res[1+4*i+j])
			}
			r[j] = v
		}
		st[i] = opState{allowed: r[0] == 1, r1: r[1], r2: r[2], r3: r[3]}
	}
	return st, nil
}

// siteCall returns the site-scope request for ops at now as the batch sends it.
func (s *Store) siteCall(now time.Time, ops []algo.Op, commit bool) *call {
	t := now.UnixNano()
	keys := make([]string, 0, 2*len(ops))
	args := make([]any, 0, 6+argsPerOp*len(ops))
	commitArg := "0"
	if commit {
		commitArg = "1"
	}
	args = append(args, t/1e9, t%1e9, strconv.FormatInt(t, 10), s.slackMs, commitArg, len(ops))
	for i := range ops {
		op := &ops[i]
		k := s.redisKey(op.Key)
		keys = append(keys, k, k+":log")
		args = s.appendOpArgs(args, t, op)
	}
	return &call{kind: kindSite, tag: s.tag(ops[0].Key), keys: keys, args: args}
}

// run sends c (in a batch, batch.go) through the circuit breaker with the Store's timeout,
// and hands its reply to parse, whose error counts as a failed call like Redis's own. It returns "" on success,
// else the fallback reason (breaker_open, error, timeout), or reasonCanceled when the
// caller's context ended first (not a failure of Redis: the breaker is not told).
func (s *Store) run(ctx context.Context, now time.Time, c *call, parse func([]any) error) string {
	if err := ctx.Err(); err != nil {
		return reasonCanceled
	}
	ok, probe := s.breaker.Allow()
	if !ok {
		return "breaker_open"
	}
	var err error
	if wb := probe || s.pend.n.Load() > 0; wb || s.fails.Load() != s.checked.Load() {
		// After a failure: Redis may have lost its data, and hits admitted in process go
		// to Redis before it decides anything again.
		err = s.recover(ctx, now, probe)
		if errors.Is(err, errWriteBackBusy) && wb && !probe && s.breaker.State() == breaker.Closed &&
			s.waitWriteBack(ctx) && s.pend.n.Load() == 0 {
			// With the breaker closed, the write back follows failures of a Redis that
			// still answers (a call that timed out on a busy machine): the calls that
			// arrive meanwhile wait for it rather than each be decided in process, and go
			// to Redis once it has written every pending hit.
			err = nil
		}
		if errors.Is(err, errWriteBackBusy) {
			if wb {
				// Another call is writing them back: decide this one in process, and
				// leave the breaker (and a probe's place) as they were.
				s.breaker.Cancel()
				s.m.calls.WithLabelValues(reasonWritingBack).Inc()
				return reasonWritingBack
			}
			// Another call is only checking for a restart: nothing of this process's
			// waits to reach Redis, so this call need not wait for it.
			err = nil
		}
	}
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, s.timeout)
		start := time.Now()
		var reply []any
		reply, err = s.batch.do(cctx, c)
		s.m.duration.Observe(time.Since(start).Seconds())
		cancel()
		if err == nil {
			err = parse(reply)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			// The caller gave up (its client went away): that says nothing about Redis.
			s.m.calls.WithLabelValues(reasonCanceled).Inc()
			s.breaker.Cancel()
			return reasonCanceled
		}
		result := "error"
		if isTimeout(err) {
			result = "timeout"
		}
		s.m.calls.WithLabelValues(result).Inc()
		s.m.errors.Inc()
		s.fails.Add(1)
		if authError(err) {
			s.noteAuthFailure(err)
		} else if s.breaker.State() == breaker.Closed {
			s.log.Debug("sitestore: redis call failed", "err", err)
		}
		s.breaker.Failure()
		return result
	}
	s.m.calls.WithLabelValues("ok").Inc()
	s.keepAlive(ctx, now)
	if s.authFailing.Load() {
		s.authFailing.Store(false)
	}
	s.breaker.Success()
	return ""
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (s *Store) redisKey(counterKey string) string {
	tag := s.tag(counterKey)
	if tag == "" {
		tag = "_" // "{}" would make Redis hash the whole key
	}
	return s.prefix + "{" + tag + "}" + counterKey
}

func ceilMs(ns int64) int64 { return (ns + int64(time.Millisecond) - 1) / int64(time.Millisecond) }

// appendOpArgs appends op's argsPerOp script arguments: algorithm, window, n, allowance,
// capacity, and its algorithm's parameters (siteAlgorithm.args).
func (s *Store) appendOpArgs(args []any, now int64, op *algo.Op) []any {
	args = append(args, int(op.Algorithm), strconv.FormatInt(int64(op.Limit.Window), 10), op.N, op.Limit.Allowance(), op.Limit.Capacity())
	return siteAlgorithms[op.Algorithm].args(args, now, op)
}
