package envoyfilter

import (
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

var (
	t0  = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	id  = map[string]string{"user": "42"}
	set = Settings{ReportingInterval: time.Second}
)

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

func tokens(max, fill uint32, every time.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: max, TokensPerFill: wrapperspb.UInt32(fill), FillInterval: durationpb.New(every)}}}
}

func assign(st *typev3.RateLimitStrategy, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse {
	return &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{{
		BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: st}}}}}
}

// admitted decides n requests at now and returns how many were admitted.
func admitted(f *Filter, now time.Time, n int) int {
	k := 0
	for range n {
		if ok, _ := f.Decide(now, id, set); ok {
			k++
		}
	}
	return k
}

// TestNewBucket: a new bucket's first request is decided by no_assignment_behavior and
// reported at once, alone, with that one request; the next ones are not reported until
// the timer's report, which carries their counts and the whole seconds since.
func TestNewBucket(t *testing.T) {
	f := New(Options{Domain: "api"})
	ok, initial := f.Decide(t0, id, set)
	if !ok || initial == nil || initial.GetDomain() != "api" || len(initial.GetBucketQuotaUsages()) != 1 ||
		initial.GetBucketQuotaUsages()[0].GetNumRequestsAllowed() != 1 || initial.GetBucketQuotaUsages()[0].GetTimeElapsed().AsDuration() != 0 {
		t.Fatalf("first request: admitted %v, report %v", ok, initial)
	}
	if f.Interval() != ReportInterval || set.ReportingInterval == ReportInterval {
		t.Errorf("timer interval %v with a reporting_interval of %v, want Envoy's fixed %v", f.Interval(), set.ReportingInterval, ReportInterval)
	}
	if _, again := f.Decide(t0, id, set); again != nil {
		t.Error("a cached bucket's request was reported at once")
	}
	r := f.Reports(t0.Add(1900 * time.Millisecond))
	u := r.GetBucketQuotaUsages()[0]
	if u.GetNumRequestsAllowed() != 1 || u.GetTimeElapsed().AsDuration() != time.Second {
		t.Errorf("periodic report %v: want 1 allowed since the initial report, 1 whole second", u)
	}
	if u := f.Reports(t0.Add(2 * time.Second)).GetBucketQuotaUsages()[0]; u.GetNumRequestsAllowed() != 0 {
		t.Errorf("counts not reset by the report: %v", u)
	}

	deny := Settings{ReportingInterval: time.Second, NoAssignment: blanket(typev3.RateLimitStrategy_DENY_ALL)}
	g := New(Options{Domain: "api"})
	if ok, r := g.Decide(t0, id, deny); ok || r.GetBucketQuotaUsages()[0].GetNumRequestsDenied() != 1 {
		t.Errorf("DENY_ALL: first request admitted %v, report %v", ok, r)
	}
}

// TestTokenBucket: a token bucket refills continuously at tokens_per_fill over
// fill_interval's whole seconds; one equal to the one held keeps its tokens, another
// starts full when the old had at least a token's worth of the new size left, else empty.
func TestTokenBucket(t *testing.T) {
	f := New(Options{Domain: "api"})
	f.Decide(t0, id, set)
	f.Apply(t0, assign(tokens(3, 60, time.Minute), 10*time.Second)) // 1 per second
	if n := admitted(f, t0, 5); n != 3 {
		t.Fatalf("full bucket of 3 admitted %d of 5", n)
	}
	if n := admitted(f, t0.Add(1500*time.Millisecond), 5); n != 1 {
		t.Errorf("1.5 s later admitted %d, want 1 (1.5 tokens)", n)
	}
	// The same bucket again: its tokens (half a token) stay.
	f.Apply(t0.Add(1500*time.Millisecond), assign(tokens(3, 60, time.Minute), 10*time.Second))
	if n := admitted(f, t0.Add(1900*time.Millisecond), 5); n != 0 {
		t.Errorf("the same bucket re-assigned admitted %d at 0.9 token, want 0 (not refilled)", n)
	}
	// Another bucket while 0.9 of 3 tokens are left: 0.9/3 × 3 rounds down to 0, so empty.
	f.Apply(t0.Add(1900*time.Millisecond), assign(tokens(3, 120, time.Minute), 10*time.Second))
	if n := admitted(f, t0.Add(1900*time.Millisecond), 5); n != 0 {
		t.Errorf("new bucket from 0.9 token admitted %d, want 0 (starts empty)", n)
	}
	// Another bucket while 1.8 of 3 are left (2 per second for 0.9 s): full, 10 tokens.
	f.Apply(t0.Add(2800*time.Millisecond), assign(tokens(10, 60, time.Minute), 10*time.Second))
	if n := admitted(f, t0.Add(2800*time.Millisecond), 20); n != 10 {
		t.Errorf("new bucket from 1.8 of 3 tokens admitted %d, want 10 (starts full)", n)
	}
	// fill_interval below a second: its whole seconds are 0, the rate infinite.
	f.Apply(t0.Add(3*time.Second), assign(tokens(1, 1, 500*time.Millisecond), 10*time.Second))
	if n := admitted(f, t0.Add(3*time.Second), 50); n != 50 {
		t.Errorf("a sub-second fill_interval admitted %d of 50, want all", n)
	}
}

// TestRequestsPerTimeUnitSkipped: Envoy skips a requests_per_time_unit action whole; the
// model enforces it only when told to.
func TestRequestsPerTimeUnitSkipped(t *testing.T) {
	rptu := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{
		RequestsPerTimeUnit: 2, TimeUnit: typev3.RateLimitUnit_SECOND}}}
	f := New(Options{Domain: "api"})
	f.Decide(t0, id, set)
	f.Apply(t0, assign(blanket(typev3.RateLimitStrategy_DENY_ALL), 5*time.Second))
	f.Apply(t0.Add(time.Second), assign(rptu, 5*time.Second))
	if st, _ := f.Strategy(t0.Add(time.Second), id); st.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL || st.GetRequestsPerTimeUnit() != nil {
		t.Errorf("after requests_per_time_unit: %v, want the previous DENY_ALL", st)
	}
	if st, _ := f.Strategy(t0.Add(5*time.Second), id); st != nil {
		t.Errorf("at 5 s: %v, want the default (the skipped action did not renew the TTL)", st)
	}
	g := New(Options{Domain: "api", EnforceRequestsPerTimeUnit: true})
	g.Decide(t0, id, set)
	g.Apply(t0, assign(rptu, 5*time.Second))
	if n := admitted(g, t0.Add(100*time.Millisecond), 5); n != 2 {
		t.Errorf("enforced: admitted %d of 5 in a second, want 2", n)
	}
	if n := admitted(g, t0.Add(1100*time.Millisecond), 5); n != 2 {
		t.Errorf("enforced, next second: admitted %d of 5, want 2", n)
	}
}

// TestExpiry: an assignment expires after its TTL's whole seconds into the expired
// fallback for its timeout, then into the default; without a fallback, straight into the
// default; an unset TTL expires at once.
func TestExpiry(t *testing.T) {
	s := Settings{ReportingInterval: time.Second, Expired: blanket(typev3.RateLimitStrategy_DENY_ALL), ExpiredTimeout: 3 * time.Second}
	f := New(Options{Domain: "api"})
	f.Decide(t0, id, s)
	f.Apply(t0, assign(tokens(5, 60, time.Minute), 2900*time.Millisecond)) // 2 whole seconds
	for _, tc := range []struct {
		at   time.Duration
		want string
	}{{1999 * time.Millisecond, "tokens"}, {2 * time.Second, "deny"}, {4999 * time.Millisecond, "deny"}, {5 * time.Second, "default"}} {
		st, _ := f.Strategy(t0.Add(tc.at), id)
		got := "default"
		switch {
		case st.GetTokenBucket() != nil:
			got = "tokens"
		case st != nil:
			got = "deny"
		}
		if got != tc.want {
			t.Errorf("at %v: %s, want %s", tc.at, got, tc.want)
		}
	}
	g := New(Options{Domain: "api"})
	g.Decide(t0, id, set)
	g.Apply(t0, assign(tokens(5, 60, time.Minute), 0))
	if st, _ := g.Strategy(t0, id); st != nil {
		t.Errorf("an assignment without TTL is in force: %v", st)
	}
}

// TestAbandon: abandon erases the bucket; its next request makes it anew and reports it
// at once; an action for a bucket not cached is skipped.
func TestAbandon(t *testing.T) {
	f := New(Options{Domain: "api"})
	f.Decide(t0, id, set)
	f.Apply(t0, &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{{BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}}})
	if f.Buckets() != 0 {
		t.Fatal("abandoned bucket still cached")
	}
	f.Apply(t0, assign(blanket(typev3.RateLimitStrategy_DENY_ALL), time.Minute))
	if f.Buckets() != 0 {
		t.Error("an assignment made a bucket the filter had not reported")
	}
	if _, r := f.Decide(t0, id, set); r == nil {
		t.Error("no immediate report after the abandon")
	}
}

// TestPrefillNeedsUptime: under the revision of Envoy's token bucket, a new bucket that
// would start full starts empty while the host has been up no longer than max_tokens ÷
// fill rate, and full after; the release read fills it either way. The report timer
// stays Envoy's 5 s whatever the revision.
func TestPrefillNeedsUptime(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		want int
	}{
		{"release", Options{Domain: "api"}, 10},
		{"revision, host just up", Options{Domain: "api", PrefillNeedsUptime: true, Boot: t0.Add(-5 * time.Second)}, 0},
		{"revision, host up an hour", Options{Domain: "api", PrefillNeedsUptime: true, Boot: t0.Add(-time.Hour)}, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := New(tc.opts)
			f.Decide(t0, id, set)
			f.Apply(t0, assign(tokens(10, 1, time.Second), 10*time.Second)) // 10 s to fill: a first bucket
			at := t0.Add(time.Millisecond)
			if got := admitted(f, at, 20); got != tc.want {
				t.Errorf("a new bucket of 10 tokens admitted %d at once, want %d", got, tc.want)
			}
			if f.Interval() != ReportInterval {
				t.Errorf("timer %v, want %v", f.Interval(), ReportInterval)
			}
		})
	}
}

// TestExpiredCounts: an assignment whose TTL runs out is counted once, a renewed one not.
func TestExpiredCounts(t *testing.T) {
	f := New(Options{Domain: "api"})
	f.Decide(t0, id, set)
	f.Apply(t0, assign(tokens(10, 1, time.Second), 2*time.Second))
	f.Apply(t0.Add(time.Second), assign(tokens(10, 1, time.Second), 2*time.Second))
	f.Decide(t0.Add(2500*time.Millisecond), id, set)
	if n := f.Expired(); n != 0 {
		t.Errorf("%d expired before the renewed TTL, want 0", n)
	}
	f.Decide(t0.Add(3*time.Second), id, set)
	f.Decide(t0.Add(4*time.Second), id, set)
	if n := f.Expired(); n != 1 {
		t.Errorf("%d expired, want 1", n)
	}
}
