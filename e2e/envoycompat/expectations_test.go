package envoycompat

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/streamlimit/streamlimit/serve/rls"
)

// A scenario is one server configuration (rules files and settings) and the requests
// sent to it in order, each with the answer envoyproxy/ratelimit's tests expect of it.
// The table is ours: it restates what its tests assert, request by request.
type scenario struct {
	name string
	// from names the test of envoyproxy/ratelimit whose expectations the steps restate.
	from string
	// theirs are rules files of its module source; ours are rules files of this package.
	theirs []string
	ours   map[string]string
	merge  bool
	envoy  rls.EnvoyOptions
	// steps builds the requests; r is a random string of the run, for values their tests
	// draw at random.
	steps func(r string) []step
}

// A step is one request and the answer expected.
type step struct {
	name string
	req  *rlsv3.RateLimitRequest // a gRPC request; nil for a /json one
	json *string                 // the body of a /json request
	// want is the whole answer expected (durations filled in by fill); nil with anyCode.
	want *rlsv3.RateLimitResponse
	// wantErr is the gRPC code of an error answer expected (want is nil then).
	wantErr codes.Code
	// wantJSON is the /json answer expected: status, content type, and the body as a
	// RateLimitResponse (wantJSONBody) or as text (wantText).
	wantJSON     *jsonAnswer
	wantJSONBody *rlsv3.RateLimitResponse
	// anyCode: their test accepts OK or OVER_LIMIT here; only the codes are compared.
	anyCode bool
	// advance moves the replay's clock before the request.
	advance time.Duration
	// shorterReset: the first status's duration_until_reset must be shorter than at the
	// step before (their test checks only that).
	shorterReset bool
	// install copies their file (rel=name) into the rules directory before the request
	// and waits for the server to reload it; probe is a request that takes nothing from
	// the steps' limits and is limited once the file is loaded, by which
	// TestDifferential sees that envoyproxy/ratelimit has reloaded.
	install string
	probe   *rlsv3.RateLimitRequest
	// setup: the request only brings the counts where their test's stubbed cache puts
	// them; the replay sends it without tallying its answer (TestDifferential compares
	// it too).
	setup bool
}

// Units and their length in seconds, as envoyproxy/ratelimit's counters divide time.
const (
	second = rlsv3.RateLimitResponse_RateLimit_SECOND
	minute = rlsv3.RateLimitResponse_RateLimit_MINUTE
	hour   = rlsv3.RateLimitResponse_RateLimit_HOUR
	day    = rlsv3.RateLimitResponse_RateLimit_DAY
	month  = rlsv3.RateLimitResponse_RateLimit_MONTH
	year   = rlsv3.RateLimitResponse_RateLimit_YEAR
)

var unitSeconds = map[rlsv3.RateLimitResponse_RateLimit_Unit]int64{
	second: 1, minute: 60, hour: 3600, day: 86400,
	rlsv3.RateLimitResponse_RateLimit_WEEK: 7 * 86400, month: 30 * 86400, year: 365 * 86400,
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// unfilled marks a duration_until_reset that fill computes.
const unfilled = -1

func req(domain string, hits uint32, descs ...[]string) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
	for _, kv := range descs {
		d := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	return r
}

func d(kv ...string) []string { return kv }

// limited is the status of a descriptor with a limit in force.
func limited(code rlsv3.RateLimitResponse_Code, rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, remaining uint32) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{
		Code: code, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: unit},
		LimitRemaining: remaining, DurationUntilReset: &durationpb.Duration{Seconds: unfilled},
	}
}

// quotaOK is the status of a descriptor over its limit in quota mode: OK, and without a
// duration_until_reset.
func quotaOK(rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: ok, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: unit}}
}

func named(st *rlsv3.RateLimitResponse_DescriptorStatus, name string) *rlsv3.RateLimitResponse_DescriptorStatus {
	st.CurrentLimit.Name = name
	return st
}

// free is the status of a descriptor that no limit applies to; unlimited of one whose
// rule is unlimited.
func free() *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: ok}
}

func unlimited() *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: ok, LimitRemaining: math.MaxUint32}
}

func resp(code rlsv3.RateLimitResponse_Code, sts ...*rlsv3.RateLimitResponse_DescriptorStatus) *rlsv3.RateLimitResponse {
	return &rlsv3.RateLimitResponse{OverallCode: code, Statuses: sts}
}

// fill sets the durations that want leaves to fill: the seconds from now to the end of
// the unit's current window, windows being multiples of the unit since the Unix epoch;
// and a header field of value unfilledHeader to the first limited status's.
func fill(want *rlsv3.RateLimitResponse, now time.Time) {
	reset := ""
	for _, st := range want.GetStatuses() {
		if st.GetDurationUntilReset().GetSeconds() == unfilled {
			n := unitSeconds[st.GetCurrentLimit().GetUnit()]
			st.DurationUntilReset.Seconds = n - now.Unix()%n
		}
		if reset == "" && st.GetCurrentLimit() != nil {
			reset = strconv.FormatInt(st.GetDurationUntilReset().GetSeconds(), 10)
		}
	}
	for _, h := range want.GetResponseHeadersToAdd() {
		if h.GetValue() == unfilledHeader {
			h.Value = reset
		}
	}
}

// unfilledHeader marks a reset header field that fill computes.
const unfilledHeader = "?"

// ptr returns a pointer to s.
func ptr(s string) *string { return &s }

// scenarios are the expectations of envoyproxy/ratelimit's tests.
func scenarios() []scenario {
	integration := func(stop bool) func(r string) []step {
		return func(r string) []step {
			var s []step
			s = append(s,
				step{name: "unknown domain", req: req("foo", 1, d("hello", "world")), want: resp(ok, free())},
				step{name: "key1", req: req("basic", 1, d("key1", "foo")), want: resp(ok, limited(ok, 50, second, 49))},
			)
			for i := range 25 {
				code, rem := ok, uint32(20-(i+1))
				if i >= 20 {
					code, rem = over, 0
				}
				s = append(s, step{name: fmt.Sprintf("key2 #%d", i+1), req: req("another", 1, d("key2", r+"a")),
					want: resp(code, limited(code, 20, minute, rem))})
			}
			for i := range 15 {
				code, rem1, rem2 := ok, uint32(20-(i+1)), uint32(10-(i+1))
				if i >= 10 {
					code, rem2 = over, 0
					if stop {
						rem1 = 10
					}
				}
				s = append(s, step{name: fmt.Sprintf("key2 and key3 #%d", i+1), req: req("another", 1, d("key2", r+"b"), d("key3", r+"b")),
					want: resp(code, limited(ok, 20, minute, rem1), limited(code, 10, hour, rem2))})
			}
			s = append(s,
				step{name: "key4 first", req: req("another", 1, d("key4", "durTest"+r)), want: resp(ok, limited(ok, 20, day, 19))},
				step{name: "key4 two seconds later", req: req("another", 1, d("key4", "durTest"+r)), advance: 2 * time.Second, shorterReset: true,
					want: resp(ok, limited(ok, 20, day, 18))},
			)
			return s
		}
	}
	runtime := []string{
		"test/integration/runtime/current/ratelimit/config/another.yaml",
		"test/integration/runtime/current/ratelimit/config/basic.yaml",
		"test/integration/runtime/current/ratelimit/config/share_threshold.yaml",
	}
	basic := []string{"test/config/basic_config.yaml"}
	override := func(rpu uint32, unit typev3.RateLimitUnit, kv ...string) *rlsv3.RateLimitRequest {
		q := req("test-domain", 1, kv)
		q.Descriptors[0].Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
		return q
	}
	return []scenario{
		{name: "integration", from: "test/integration testBasicBaseConfig", theirs: runtime, steps: integration(false)},
		{name: "integration, stop increment when over limit", from: "test/integration testBasicBaseConfig (StopCacheKeyIncrementWhenOverlimit)",
			theirs: runtime, envoy: rls.EnvoyOptions{StopIncrementWhenOverLimit: true}, steps: integration(true)},
		{name: "integration, reload", from: "test/integration testConfigReload", theirs: runtime, steps: func(r string) []step {
			return []step{
				{name: "before the reload", req: req("reload", 1, d("block", "foo")), want: resp(ok, free())},
				{name: "after the reload", install: "test/integration/runtime/current/ratelimit/reload.yaml=reload.yaml",
					probe: req("reload", 1, d("one_per_minute", "probe"+r)),
					req:   req("reload", 1, d("key1", "foo")), want: resp(ok, limited(ok, 50, second, 49))},
			}
		}},
		{name: "integration, share_threshold", from: "test/integration testShareThreshold", theirs: runtime, steps: func(r string) []step {
			var s []step
			for i := range 10 {
				s = append(s, step{name: fmt.Sprintf("files/a.pdf #%d", i+1), req: req("share-threshold-test", 1, d("files", "files/a.pdf"+r)), anyCode: true})
			}
			s = append(s, step{name: "files/b.csv shares the threshold", req: req("share-threshold-test", 1, d("files", "files/b.csv"+r)),
				want: resp(over, limited(over, 10, hour, 0))})
			for i := range 10 {
				s = append(s, step{name: fmt.Sprintf("files_no_share #%d", i+1), req: req("share-threshold-test", 1, d("files_no_share", fmt.Sprintf("files_no_share/%s-%d", r, i))),
					want: resp(ok, limited(ok, 10, hour, 9))})
			}
			return s
		}},
		{name: "config, basic", from: "test/config TestBasicConfig", theirs: basic, steps: func(string) []step {
			return []step{
				{name: "unknown domain, no entries", req: req("foo_domain", 1, d()), want: resp(ok, free())},
				{name: "no entries", req: req("test-domain", 1, d()), want: resp(ok, free())},
				{name: "key1=something", req: req("test-domain", 1, d("key1", "something")), want: resp(ok, free())},
				{name: "key1=value1", req: req("test-domain", 1, d("key1", "value1")), want: resp(ok, free())},
				{name: "key2=value2, deeper", req: req("test-domain", 1, d("key2", "value2", "subkey", "subvalue")), want: resp(ok, free())},
				{name: "key5=value5, subkey5 unmatched", req: req("test-domain", 1, d("key5", "value5", "subkey5", "subvalue")), want: resp(ok, free())},
				{name: "subkey1 default", req: req("test-domain", 1, d("key1", "value1", "subkey1", "something")), want: resp(ok, limited(ok, 5, second, 4))},
				{name: "subkey1=subvalue1", req: req("test-domain", 1, d("key1", "value1", "subkey1", "subvalue1")), want: resp(ok, limited(ok, 10, second, 9))},
				{name: "key2 default", req: req("test-domain", 1, d("key2", "something")), want: resp(ok, limited(ok, 20, minute, 19))},
				{name: "key2=value2", req: req("test-domain", 1, d("key2", "value2")), want: resp(ok, limited(ok, 30, minute, 29))},
				{name: "key2=value3 whitelisted", req: req("test-domain", 1, d("key2", "value3")), want: resp(ok, free())},
				{name: "key3", req: req("test-domain", 1, d("key3", "foo")), want: resp(ok, limited(ok, 1, hour, 0))},
				{name: "key4 named", req: req("test-domain", 1, d("key4", "foo")), want: resp(ok, named(limited(ok, 1, day, 0), "key4_rate_limit"))},
				{name: "key6 unlimited", req: req("test-domain", 1, d("key6", "foo")), want: resp(ok, unlimited())},
				{name: "key7 detailed", req: req("test-domain", 1, d("key7", "unspecified_value")), want: resp(ok, limited(ok, 70, minute, 69))},
				{name: "key7 another value", req: req("test-domain", 1, d("key7", "another_value")), want: resp(ok, limited(ok, 70, minute, 69))},
			}
		}},
		{name: "config, domain merge", from: "test/config TestDomainMerge", merge: true,
			theirs: []string{"test/config/merge_domain_key1.yaml", "test/config/merge_domain_key2.yaml"}, steps: func(string) []step {
				return []step{
					{name: "unknown domain", req: req("foo_domain", 1, d()), want: resp(ok, free())},
					{name: "no entries", req: req("test-domain", 1, d()), want: resp(ok, free())},
					{name: "key1 from the first file", req: req("test-domain", 1, d("key1", "value1")), want: resp(ok, limited(ok, 10, minute, 9))},
					{name: "key2 from the second file", req: req("test-domain", 1, d("key2", "value2")), want: resp(ok, limited(ok, 20, minute, 19))},
				}
			}},
		{name: "config, limit override", from: "test/config TestConfigLimitOverride", theirs: basic, steps: func(string) []step {
			unknown := override(10, typev3.RateLimitUnit_DAY)
			unknown.Domain = "foo_domain"
			return []step{
				{name: "unknown domain", req: unknown, want: resp(ok, free())},
				{name: "10 per day", req: override(10, typev3.RateLimitUnit_DAY, "key1", "value1", "subkey1", "something"), want: resp(ok, limited(ok, 10, day, 9))},
				{name: "42 per hour", req: override(42, typev3.RateLimitUnit_HOUR, "key1", "value1", "subkey1", "something"), want: resp(ok, limited(ok, 42, hour, 41))},
				{name: "another value", req: override(42, typev3.RateLimitUnit_HOUR, "key1", "value1", "subkey1", "something_else"), want: resp(ok, limited(ok, 42, hour, 41))},
			}
		}},
		{name: "config, shadow mode", from: "test/config TestShadowModeConfig", theirs: []string{"test/config/shadowmode_config.yaml"}, steps: func(string) []step {
			s := []step{
				{name: "subkey1 default, not in shadow mode", req: req("test-domain", 1, d("key1", "value1", "subkey1", "something")), want: resp(ok, limited(ok, 5, second, 4))},
				{name: "subvalue1 in shadow mode", req: req("test-domain", 1, d("key1", "value1", "subkey1", "subvalue1")), want: resp(ok, limited(ok, 10, second, 9))},
				{name: "key2 in shadow mode", req: req("test-domain", 1, d("key2", "something")), want: resp(ok, limited(ok, 20, minute, 19))},
				{name: "key2=value2 not in shadow mode", req: req("test-domain", 1, d("key2", "value2")), want: resp(ok, limited(ok, 30, minute, 29))},
			}
			// Over the limit: shadow mode answers OK, the other rule OVER_LIMIT.
			for i := 2; i <= 11; i++ {
				w := resp(ok, limited(ok, 10, second, uint32(max(10-i, 0))))
				s = append(s, step{name: "subvalue1 #" + strconv.Itoa(i), req: req("test-domain", 1, d("key1", "value1", "subkey1", "subvalue1")), want: w})
			}
			for i := 2; i <= 6; i++ {
				code, rem := ok, uint32(5-i)
				if i > 5 {
					code, rem = over, 0
				}
				s = append(s, step{name: "subkey1 default #" + strconv.Itoa(i), req: req("test-domain", 1, d("key1", "value1", "subkey1", "something")), want: resp(code, limited(code, 5, second, rem))})
			}
			return s
		}},
		{name: "config, wildcard", from: "test/config TestWildcardConfig", theirs: []string{"test/config/wildcard.yaml"}, steps: func(string) []step {
			return []step{
				{name: "noVal foo1", req: req("test-domain", 1, d("noVal", "foo1")), want: resp(ok, limited(ok, 20, minute, 19))},
				{name: "noVal foo2", req: req("test-domain", 1, d("noVal", "foo2")), want: resp(ok, limited(ok, 20, minute, 19))},
				{name: "wild foo1", req: req("test-domain", 1, d("wild", "foo1")), want: resp(ok, limited(ok, 20, minute, 19))},
				{name: "wild foo2", req: req("test-domain", 1, d("wild", "foo2")), want: resp(ok, limited(ok, 20, minute, 19))},
				{name: "nested wild", req: req("test-domain", 1, d("nestedWild", "val1", "wild", "goo2")), want: resp(ok, limited(ok, 20, minute, 19))},
				{name: "wild bar", req: req("test-domain", 1, d("wild", "bar")), want: resp(ok, free())},
				{name: "noWild foo1", req: req("test-domain", 1, d("noWild", "foo1")), want: resp(ok, free())},
				{name: "midWildcard", req: req("test-domain", 1, d("midWildcard", "barab")), want: resp(ok, free())},
			}
		}},
		{name: "config, share_threshold", from: "test/config TestShareThreshold", theirs: []string{"test/config/share_threshold.yaml"}, steps: func(string) []step {
			one := func(name string, rpu, rem uint32, kv ...string) step {
				return step{name: name, req: req("test-domain", 1, kv), want: resp(ok, limited(ok, rpu, minute, rem))}
			}
			return []step{
				one("files/a.pdf", 100, 99, "files", "files/a.pdf"),
				one("files/b.csv shares it", 100, 98, "files", "files/b.csv"),
				one("files/c.txt shares it", 100, 97, "files", "files/c.txt"),
				one("route with value_to_metric", 60, 59, "route", "api/v1", "method", "GET"),
				one("service with detailed_metric", 80, 79, "service", "svc/user", "endpoint", "get"),
				one("nested", 200, 199, "nested", "parent", "files", "nested/file1.txt"),
				one("two wildcards", 300, 299, "files", "top/file1.txt", "files", "nested/file1.txt"),
				one("parent shares, child does not", 120, 119, "path", "path/foo", "file", "file/doc1", "type", "pdf"),
				one("both share", 150, 149, "user", "user/alice", "resource", "res/file1", "action", "read"),
				one("explicit value first", 50, 49, "file", "test1"),
				one("test2", 100, 99, "file", "test2"),
				one("test23 shares it", 100, 98, "file", "test23"),
				one("test123 shares it", 100, 97, "file", "test123"),
			}
		}},
		{name: "json", from: "test/server TestJsonHandler", theirs: basic, steps: func(string) []step {
			bad := &jsonAnswer{status: http.StatusBadRequest, contentType: "text/plain; charset=utf-8", body: "Bad Request\n"}
			okJSON := &jsonAnswer{status: http.StatusOK, contentType: "application/json"}
			overJSON := &jsonAnswer{status: http.StatusTooManyRequests, contentType: "application/json"}
			limitedBody := `{"domain":"test-domain","descriptors":[{"entries":[{"key":"key3","value":"json"}]}]}`
			return []step{
				{name: "no body", json: ptr(""), wantJSON: bad},
				{name: "not JSON", json: ptr("}"), wantJSON: bad},
				{name: "the service refuses it", json: ptr(`{"domain": "foo"}`), wantJSON: bad},
				{name: "OK", json: ptr(`{"domain":"foo","descriptors":[{"entries":[{"key":"hello","value":"world"}]}]}`), wantJSON: okJSON, wantJSONBody: resp(ok, free())},
				{name: "limited, OK", json: ptr(limitedBody), wantJSON: okJSON, wantJSONBody: resp(ok, limited(ok, 1, hour, 0))},
				{name: "OVER_LIMIT", json: ptr(limitedBody), wantJSON: overJSON, wantJSONBody: resp(over, limited(over, 1, hour, 0))},
			}
		}},
		// test/service: their service on a stubbed cache. The rules restate its stubbed
		// configuration, and setup requests bring the counts where its stub puts them.
		{name: "service, global shadow mode", from: "test/service TestServiceGlobalShadowMode", ours: serviceFiles,
			envoy: rls.EnvoyOptions{ShadowMode: true}, steps: func(r string) []step {
				return []step{
					{name: "setup", setup: true, req: req("different-domain", 10, d("foo", r+"1")), want: resp(ok, limited(ok, 10, minute, 0))},
					{name: "over the limit, answered OK", req: req("different-domain", 1, d("foo", r+"1"), d("hello", "world")), want: resp(ok, limited(over, 10, minute, 0), free())},
				}
			}},
		{name: "service, mixed rule shadow mode", from: "test/service TestMixedRuleShadowMode", ours: serviceFiles, steps: func(r string) []step {
			return []step{
				{name: "setup", setup: true, req: req("different-domain", 10, d("shadow", r+"2"), d("bar", r+"2")), want: resp(ok, limited(ok, 10, minute, 0), limited(ok, 10, minute, 0))},
				{name: "both over, the shadow rule OK", req: req("different-domain", 1, d("shadow", r+"2"), d("bar", r+"2")), want: resp(over, limited(ok, 10, minute, 0), limited(over, 10, minute, 0))},
			}
		}},
		{name: "service, custom header fields", from: "test/service TestServiceWithCustomRatelimitHeaders", ours: serviceFiles,
			envoy: rls.EnvoyOptions{ResponseHeaders: true, LimitHeader: "A-Ratelimit-Limit", RemainingHeader: "A-Ratelimit-Remaining", ResetHeader: "A-Ratelimit-Reset"}, steps: func(r string) []step {
				w := resp(over, limited(over, 10, minute, 0), free())
				w.ResponseHeadersToAdd = []*corev3.HeaderValue{{Key: "A-Ratelimit-Limit", Value: "10"}, {Key: "A-Ratelimit-Remaining", Value: "0"}, {Key: "A-Ratelimit-Reset", Value: unfilledHeader}}
				return []step{
					{name: "setup", setup: true, req: req("different-domain", 10, d("foo", r+"3"))},
					{name: "over the limit, with the fields", req: req("different-domain", 1, d("foo", r+"3"), d("hello", "world")), want: w},
				}
			}},
		{name: "service, default header fields", from: "test/service TestServiceWithDefaultRatelimitHeaders", ours: serviceFiles,
			envoy: rls.EnvoyOptions{ResponseHeaders: true}, steps: func(r string) []step {
				w := resp(over, limited(over, 10, minute, 0), free())
				w.ResponseHeadersToAdd = []*corev3.HeaderValue{{Key: "RateLimit-Limit", Value: "10"}, {Key: "RateLimit-Remaining", Value: "0"}, {Key: "RateLimit-Reset", Value: unfilledHeader}}
				return []step{
					{name: "setup", setup: true, req: req("different-domain", 10, d("foo", r+"4"))},
					{name: "over the limit, with the fields", req: req("different-domain", 1, d("foo", r+"4"), d("hello", "world")), want: w},
				}
			}},
		{name: "service, empty requests", from: "test/service TestEmptyDomain, TestEmptyDescriptors", ours: serviceFiles, steps: func(string) []step {
			return []step{
				{name: "empty domain", req: req("", 1, d("hello", "world")), wantErr: codes.Unknown},
				{name: "no descriptors", req: req("domain", 1), wantErr: codes.Unknown},
			}
		}},
		{name: "service, unlimited", from: "test/service TestUnlimited", ours: serviceFiles, steps: func(r string) []step {
			return []step{
				{name: "limited, none, unlimited", req: req("some-domain", 1, d("foo", r+"5"), d("hello", "world"), d("baz", "qux")), want: resp(ok, limited(ok, 10, minute, 9), free(), unlimited())},
			}
		}},
		{name: "service, global quota mode", from: "test/service TestServiceGlobalQuotaMode", ours: serviceFiles,
			envoy: rls.EnvoyOptions{QuotaMode: true}, steps: func(r string) []step {
				return []step{
					{name: "setup", setup: true, req: req("quota-domain", 10, d("foo", r+"6"), d("hello", r+"6"))},
					{name: "both over, answered OK", req: req("quota-domain", 1, d("foo", r+"6"), d("hello", r+"6")), want: resp(ok, quotaOK(10, minute), quotaOK(5, minute))},
				}
			}},
		{name: "service, per-descriptor quota mode", from: "test/service TestServicePerDescriptorQuotaMode", ours: serviceFiles, steps: func(r string) []step {
			return []step{
				{name: "setup", setup: true, req: req("quota-domain", 5, d("regular", r+"7"), d("quota", r+"7"))},
				{name: "both over, the quota one OK", req: req("quota-domain", 1, d("regular", r+"7"), d("quota", r+"7")), want: resp(over, limited(over, 5, minute, 0), quotaOK(3, minute))},
			}
		}},
		{name: "service, quota mode only", from: "test/service TestServiceQuotaModeOnly", ours: serviceFiles, steps: func(r string) []step {
			return []step{
				{name: "setup", setup: true, req: req("quota-domain", 5, d("quota1", r+"8"), d("quota2", r+"8"))},
				{name: "both over, both OK", req: req("quota-domain", 1, d("quota1", r+"8"), d("quota2", r+"8")), want: resp(ok, quotaOK(5, minute), quotaOK(3, minute))},
			}
		}},
	}
}

// serviceFiles restate the configurations that envoyproxy/ratelimit's service tests
// stub: limits of 10 a minute in different-domain (one in shadow mode), one beside an
// unlimited rule in some-domain, and quota-domain's limits, three in quota mode.
var serviceFiles = map[string]string{
	"different.yaml": `domain: different-domain
descriptors:
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: bar
    rate_limit: {unit: minute, requests_per_unit: 10}
`,
	"some.yaml": `domain: some-domain
descriptors:
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: baz
    value: qux
    rate_limit: {unlimited: true}
`,
	"quota.yaml": `domain: quota-domain
descriptors:
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: hello
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: quota1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
`,
}
