// Package envoyfilter is a model of Envoy's HTTP rate_limit_quota filter in Go, on
// go-control-plane's generated Rate Limit Quota Service API: what one Envoy does with its
// buckets, its reports and the assignments an RLQS server sends it. streamlimit's tests
// drive its RLQS server with it, since no Envoy binary can run in them. Filter is the
// filter's state without I/O or timers (every call takes the time), so that a simulation
// can run it on a virtual clock; Conn runs it over a real gRPC stream with the filter's
// timers and reconnects.
//
// The model's function-by-function account of Envoy's filter, with the commits it was
// read at, is Filter's documentation; how streamlimit's RLQS server and Envoy work
// together is docs/rlqs.md.
package envoyfilter

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	ratelimitquotav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Settings are the parts of a bucket's RateLimitQuotaBucketSettings (the matched
// on_match action) that decide and report.
type Settings struct {
	// ReportingInterval is the bucket settings' reporting_interval.
	ReportingInterval time.Duration
	// NoAssignment is no_assignment_behavior's fallback_rate_limit; nil: ALLOW_ALL.
	NoAssignment *typev3.RateLimitStrategy
	// Expired is expired_assignment_behavior's fallback_rate_limit; nil: none, an expired
	// assignment reverts to NoAssignment.
	Expired *typev3.RateLimitStrategy
	// ExpiredTimeout is expired_assignment_behavior_timeout: how long Expired applies.
	ExpiredTimeout time.Duration
}

// SettingsFrom reads Settings from the filter's bucket settings, with an error for what
// Envoy's filter rejects (no reporting_interval) or would crash on (a token bucket as
// no_assignment_behavior).
func SettingsFrom(bs *ratelimitquotav3.RateLimitQuotaBucketSettings) (Settings, error) {
	if err := bs.ValidateAll(); err != nil {
		return Settings{}, fmt.Errorf("bucket settings: %w", err)
	}
	s := Settings{ReportingInterval: bs.GetReportingInterval().AsDuration()}
	if na := bs.GetNoAssignmentBehavior().GetFallbackRateLimit(); na != nil {
		if na.GetTokenBucket() != nil {
			return Settings{}, errors.New("bucket settings: no_assignment_behavior with a token bucket: Envoy's filter has no token bucket behind a default action")
		}
		s.NoAssignment = na
	}
	if ea := bs.GetExpiredAssignmentBehavior(); ea != nil {
		s.Expired = ea.GetFallbackRateLimit()
		// Envoy reads the timeout's whole seconds.
		s.ExpiredTimeout = time.Duration(ea.GetExpiredAssignmentBehaviorTimeout().GetSeconds()) * time.Second
	}
	return s, nil
}

// Options configures a Filter.
type Options struct {
	// Domain is the filter's domain, sent in every report.
	Domain string
	// Interval is the report timer's interval. Default ReportInterval, whatever the
	// buckets' reporting_interval says, as in Envoy; another value is for runs that ask
	// what a filter reporting more often would do.
	Interval time.Duration
	// Boot is when the host started, for PrefillNeedsUptime.
	Boot time.Time
	// PrefillNeedsUptime models a revision of Envoy's token bucket
	// (source/common/common/token_bucket_impl.cc, AtomicTokenBucketImpl's constructor)
	// that fills a new bucket at its start only when max_tokens ÷ fill rate is shorter
	// than the host's uptime (its monotonic clock, here the time since Boot), and starts
	// it empty otherwise. A Boot in the future makes every new bucket start empty, the
	// worst case. Default false: the release read, which fills by the count passed.
	PrefillNeedsUptime bool
	// EnforceRequestsPerTimeUnit enforces requests_per_time_unit assignments as fixed
	// windows; Envoy's filter skips them (see Filter). Default false.
	EnforceRequestsPerTimeUnit bool
}

// Filter is one Envoy's rate_limit_quota filter state: its bucket cache. It is safe for
// simultaneous use by multiple goroutines.
//
// The model follows envoyproxy/envoy's source/extensions/filters/http/rate_limit_quota/ as read at
// filter.cc 1736899111be41f7567a2c4a16af886291db8151, global_client_impl.cc
// c33e7f824b9946853a80e839d6e80ef2a09f3bb4 and filter_persistence.cc
// 93e15bfadb68f6b98ebe422d6f73205c3d532970, and source/common/common/token_bucket_impl.cc
// (AtomicTokenBucketImpl), function by function:
//
//   - A request of a bucket not yet cached (filter.cc, recordBucketUsage) is decided by the
//     bucket settings' no_assignment_behavior: denied only by a blanket DENY_ALL, admitted
//     otherwise (noAssignmentBehaviorShouldAllow), and the bucket is created with that one
//     request counted and reported at once, alone in its message (global_client_impl.cc,
//     createBucketImpl: "Send initial usage report for this new bucket"). The first bucket
//     ever created starts the stream and the report timer.
//   - A cached bucket's request (filter.cc, shouldAllowRequest) follows the bucket's action,
//     else its default action (no_assignment_behavior's fallback_rate_limit, ALLOW_ALL when
//     unset): ALLOW_ALL admits, DENY_ALL denies, a token bucket admits when it holds a
//     whole token and takes it; requests_per_time_unit admits everything ("not yet
//     supported by RLQS"), and so does a missing strategy.
//   - Every report interval (one timer for all buckets: startSendReportsTimerImpl,
//     onSendReportsTimer) every bucket is reported, with the requests allowed and denied
//     since its last report and time_elapsed in whole seconds (getUsageFromBucket), and its
//     counters reset — before the stream is (re)started, so that the usage of a tick whose
//     stream cannot start is lost ("Dropping the collected usage reports"). Envoy's
//     interval is fixed at 5 s at the commit read (filter_persistence.cc: "Currently this is
//     not supported and all usage is reported on a hardcoded interval"): ReportInterval,
//     unless Options.Interval asks for another.
//   - A response (onQuotaResponseImpl) is applied action by action: without a bucket id, or
//     for a bucket not cached, skipped; abandon erases the bucket (its next request makes
//     it anew, reported at once); a quota assignment replaces the bucket's action and
//     starts its expiration timer at assignment_time_to_live's whole seconds
//     (startActionExpirationTimer: an unset TTL expires at once), except a
//     requests_per_time_unit or unset strategy, which is skipped whole. A token bucket
//     equal to the one held (max_tokens, tokens_per_fill and fill_interval's nanoseconds:
//     protoTokenBucketsEq) keeps its tokens; another is made anew
//     (createTokenBucketFromAction) at tokens_per_fill per fill_interval's whole seconds,
//     and starts full when the old bucket's fraction of its max_tokens times the new
//     max_tokens, rounded down, is at least one (that count is passed where
//     AtomicTokenBucketImpl's constructor takes init_fill), empty otherwise, and full when
//     there was none.
//   - When an assignment expires (onActionExpirationTimer) the bucket goes to
//     expired_assignment_behavior's fallback_rate_limit for
//     expired_assignment_behavior_timeout's whole seconds (startFallbackExpirationTimer),
//     then to its default action (onFallbackExpirationTimer); without that fallback
//     (reuse_last_assignment is not implemented there either), straight to its default.
//   - The token bucket refills continuously: it holds min(max_tokens, (now − t) × rate)
//     where t moves forward by 1/rate for each token taken (AtomicTokenBucketImpl).
//   - A stream the server closes (onRemoteClose) is started again at the next report tick;
//     buckets keep deciding on their actions until these expire.
//
// Where Envoy would crash (a token bucket as no_assignment_behavior: its default action
// has no token bucket behind it), SettingsFrom refuses the settings instead.
// Options.EnforceRequestsPerTimeUnit makes the model enforce requests_per_time_unit as the
// API describes it (a fixed window of that many requests per unit, from the assignment),
// for clients other than Envoy.
type Filter struct {
	mu      sync.Mutex
	opts    Options
	buckets map[string]*bucket
	started bool
	expired int // assignments that expired (their TTL ran out before a new one came)
}

// ReportInterval is the interval of Envoy's report timer: fixed at 5 s, whatever the
// buckets' reporting_interval says (Envoy: source/extensions/filters/http/
// rate_limit_quota/filter_persistence.cc, "all usage is reported on a hardcoded
// interval"; global_client_impl.cc, startSendReportsTimerImpl).
const ReportInterval = 5 * time.Second

// Expired returns how many assignments expired before another replaced them.
func (f *Filter) Expired() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.expired
}

// New returns a Filter with no bucket.
func New(opts Options) *Filter {
	return &Filter{opts: opts, buckets: map[string]*bucket{}}
}

// bucket is one cached bucket (CachedBucket).
type bucket struct {
	id         *rlqsv3.BucketId
	settings   Settings
	allowed    uint64
	denied     uint64
	lastReport time.Time
	// action is the assignment (or the expired fallback) in force; nil: the default.
	action *typev3.RateLimitStrategy
	tb     *tokenBucket // behind a token bucket action
	// expires is when action expires (zero: it does not); inFallback says that action is
	// the expired fallback, which expires at expires too.
	expires    time.Time
	inFallback bool
	// window and inWindow: the fixed window of an enforced requests_per_time_unit.
	window   time.Time
	inWindow uint64
}

// Interval returns the report timer's interval: Options.Interval, else ReportInterval.
func (f *Filter) Interval() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.opts.Interval > 0 {
		return f.opts.Interval
	}
	return ReportInterval
}

// Started reports whether a bucket was ever created (Envoy starts its stream and report
// timer then).
func (f *Filter) Started() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started
}

// Decide decides a request of bucket id at now, as the filter's decodeHeaders does once
// the matchers gave the bucket and its settings. For a new bucket it also returns the
// report to send at once.
func (f *Filter) Decide(now time.Time, id map[string]string, s Settings) (allowed bool, initial *rlqsv3.RateLimitQuotaUsageReports) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := canonical(id)
	b := f.buckets[key]
	if b == nil {
		allowed = !isBlanket(s.NoAssignment, typev3.RateLimitStrategy_DENY_ALL)
		b = &bucket{id: &rlqsv3.BucketId{Bucket: clone(id)}, settings: s, lastReport: now}
		if allowed {
			b.allowed = 1
		} else {
			b.denied = 1
		}
		f.buckets[key] = b
		f.started = true
		return allowed, &rlqsv3.RateLimitQuotaUsageReports{Domain: f.opts.Domain,
			BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{b.usage(now)}}
	}
	b.expire(now, &f.opts, &f.expired)
	allowed = f.allow(b, now)
	if allowed {
		b.allowed++
	} else {
		b.denied++
	}
	return allowed, nil
}

// allow is shouldAllowRequest.
func (f *Filter) allow(b *bucket, now time.Time) bool {
	st := b.action
	if st == nil {
		st = b.settings.NoAssignment
	}
	switch s := st.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return s.BlanketRule != typev3.RateLimitStrategy_DENY_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		return b.tb.consume(now)
	case *typev3.RateLimitStrategy_RequestsPerTimeUnit_:
		if !f.opts.EnforceRequestsPerTimeUnit {
			return true
		}
		unit := unitDuration(s.RequestsPerTimeUnit.GetTimeUnit())
		for unit > 0 && !now.Before(b.window.Add(unit)) {
			b.window, b.inWindow = b.window.Add(unit*(now.Sub(b.window)/unit)), 0
		}
		if b.inWindow >= s.RequestsPerTimeUnit.GetRequestsPerTimeUnit() {
			return false
		}
		b.inWindow++
		return true
	}
	return true
}

// Reports builds the periodic report of every bucket at now and resets their counters, as
// the report timer does. It returns nil before the first bucket.
func (f *Filter) Reports(now time.Time) *rlqsv3.RateLimitQuotaUsageReports {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.started {
		return nil
	}
	r := &rlqsv3.RateLimitQuotaUsageReports{Domain: f.opts.Domain}
	for _, b := range f.buckets {
		b.expire(now, &f.opts, &f.expired)
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, b.usage(now))
	}
	return r
}

// usage is getUsageFromBucket: the counts since the last report, reset, and the time
// since it in whole seconds.
func (b *bucket) usage(now time.Time) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	u := &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: b.id, NumRequestsAllowed: b.allowed, NumRequestsDenied: b.denied,
		TimeElapsed: &durationpb.Duration{Seconds: int64(now.Sub(b.lastReport) / time.Second)}}
	b.allowed, b.denied, b.lastReport = 0, 0, now
	return u
}

// Apply applies a response received at now, as onQuotaResponseImpl does.
func (f *Filter) Apply(now time.Time, resp *rlqsv3.RateLimitQuotaResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range resp.GetBucketAction() {
		if len(a.GetBucketId().GetBucket()) == 0 {
			continue
		}
		key := canonical(a.GetBucketId().GetBucket())
		b := f.buckets[key]
		if b == nil {
			continue
		}
		b.expire(now, &f.opts, &f.expired)
		if a.GetAbandonAction() != nil {
			delete(f.buckets, key)
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		if qa == nil {
			continue
		}
		st := qa.GetRateLimitStrategy()
		switch s := st.GetStrategy().(type) {
		case *typev3.RateLimitStrategy_BlanketRule_:
			b.tb = nil
		case *typev3.RateLimitStrategy_TokenBucket:
			if old := b.action.GetTokenBucket(); old == nil || !tokenBucketsEqual(s.TokenBucket, old) {
				b.tb = newTokenBucket(s.TokenBucket, now, b.tb, &f.opts)
			}
		case *typev3.RateLimitStrategy_RequestsPerTimeUnit_:
			if !f.opts.EnforceRequestsPerTimeUnit {
				continue // "not yet supported in RLQS": the action is skipped
			}
			b.tb, b.window, b.inWindow = nil, now, 0
		default:
			continue
		}
		b.action = proto.Clone(st).(*typev3.RateLimitStrategy)
		b.inFallback = false
		// The TTL's whole seconds; an unset TTL is 0 s and expires at once.
		b.expires = now.Add(time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second)
	}
}

// expire applies what the expiration timers would have done by now.
func (b *bucket) expire(now time.Time, o *Options, expired *int) {
	for b.action != nil && !b.expires.IsZero() && !now.Before(b.expires) {
		at := b.expires
		if !b.inFallback {
			*expired++
		}
		if b.inFallback || b.settings.Expired == nil {
			b.action, b.tb, b.expires, b.inFallback = nil, nil, time.Time{}, false
			return
		}
		fb := b.settings.Expired
		if t := fb.GetTokenBucket(); t != nil {
			if old := b.action.GetTokenBucket(); old == nil || !tokenBucketsEqual(t, old) {
				b.tb = newTokenBucket(t, at, b.tb, o)
			}
		} else {
			b.tb = nil
		}
		b.action, b.inFallback = fb, true
		b.expires = at.Add(b.settings.ExpiredTimeout)
	}
}

// Strategy returns the strategy bucket id decides by at now (its action, else its
// default), and whether the bucket is cached.
func (f *Filter) Strategy(now time.Time, id map[string]string) (*typev3.RateLimitStrategy, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.buckets[canonical(id)]
	if b == nil {
		return nil, false
	}
	b.expire(now, &f.opts, &f.expired)
	if b.action != nil {
		return b.action, true
	}
	return b.settings.NoAssignment, true
}

// Buckets returns the number of cached buckets.
func (f *Filter) Buckets() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.buckets)
}

// tokenBucket is AtomicTokenBucketImpl: it holds min(max, (now − t0) × rate) tokens.
type tokenBucket struct {
	max, rate float64
	t0        time.Time
}

// newTokenBucket is createTokenBucketFromAction: rate tokens_per_fill over fill_interval's
// whole seconds (infinite below a second), full when old is nil or old's fraction of its
// max times the new max, rounded down, is at least one — and, under
// Options.PrefillNeedsUptime, only when max ÷ rate is shorter than the host's uptime.
func newTokenBucket(tb *typev3.TokenBucket, now time.Time, old *tokenBucket, o *Options) *tokenBucket {
	secs := tb.GetFillInterval().AsDuration() / time.Second
	rate := math.Inf(1)
	if secs > 0 {
		rate = float64(tb.GetTokensPerFill().GetValue()) / float64(secs)
	}
	rate = max(rate, 1e-9) // AtomicTokenBucketImpl's minimum fill rate
	b := &tokenBucket{max: float64(tb.GetMaxTokens()), rate: rate, t0: now}
	initial := b.max
	if old != nil && old.max > 0 {
		initial = math.Floor(b.max * (old.remaining(now) / old.max))
	}
	fill := initial >= 1
	if fill && o.PrefillNeedsUptime && b.max/rate >= now.Sub(o.Boot).Seconds() {
		fill = false
	}
	if fill && !math.IsInf(rate, 1) {
		b.t0 = now.Add(-time.Duration(b.max / rate * float64(time.Second)))
	}
	return b
}

func (tb *tokenBucket) remaining(now time.Time) float64 {
	if math.IsInf(tb.rate, 1) {
		return tb.max
	}
	return min(tb.max, now.Sub(tb.t0).Seconds()*tb.rate)
}

// consume takes one token if a whole one is there.
func (tb *tokenBucket) consume(now time.Time) bool {
	if tb == nil {
		return true
	}
	total := tb.remaining(now)
	if total < 1 {
		return false
	}
	if !math.IsInf(tb.rate, 1) {
		tb.t0 = now.Add(-time.Duration((total - 1) / tb.rate * float64(time.Second)))
	}
	return true
}

// tokenBucketsEqual is protoTokenBucketsEq: max_tokens, tokens_per_fill and fill_interval's
// nanoseconds (not its seconds).
func tokenBucketsEqual(a, b *typev3.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() && a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}

func isBlanket(s *typev3.RateLimitStrategy, r typev3.RateLimitStrategy_BlanketRule) bool {
	b, ok := s.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_)
	return ok && b.BlanketRule == r
}

func unitDuration(u typev3.RateLimitUnit) time.Duration {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return time.Second
	case typev3.RateLimitUnit_MINUTE:
		return time.Minute
	case typev3.RateLimitUnit_HOUR:
		return time.Hour
	case typev3.RateLimitUnit_DAY:
		return 24 * time.Hour
	case typev3.RateLimitUnit_MONTH:
		return 30 * 24 * time.Hour
	case typev3.RateLimitUnit_YEAR:
		return 365 * 24 * time.Hour
	}
	return 0
}

// canonical is a bucket id as a map key (Envoy hashes the BucketId message).
func canonical(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%q=%q;", k, id[k])
	}
	return b.String()
}

func clone(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
