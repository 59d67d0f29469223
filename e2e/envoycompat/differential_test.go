package envoycompat

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/rls"
)

// extraRules is a rules file of ours for the requests that envoyproxy/ratelimit's tests do
// not send: costs, quota and shadow mode, replaces, every unit, a limit of 0.
const extraRules = `domain: extra
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: q
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: s
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: u
    rate_limit: {unlimited: true}
  - key: named
    rate_limit: {unit: day, requests_per_unit: 5, name: named_limit}
  - key: replacer
    rate_limit: {unit: hour, requests_per_unit: 100, replaces: [{name: named_limit}]}
  - key: block
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: w
    rate_limit: {unit: week, requests_per_unit: 5}
  - key: m
    rate_limit: {unit: month, requests_per_unit: 5}
  - key: y
    rate_limit: {unit: year, requests_per_unit: 5}
  - key: mid
    value: a*b
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: pre
    value: a*b*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: nest
    value: a*
    descriptors:
      - key: leaf
        rate_limit: {unit: minute, requests_per_unit: 3}
`

// extraScenarios are the requests only TestDifferential sends: their answers are
// whatever envoyproxy/ratelimit answers.
func extraScenarios() []scenario {
	ours := map[string]string{"extra.yaml": extraRules}
	steps := func(r string) []step {
		k := func(name string, q *rlsv3.RateLimitRequest) step { return step{name: name, req: q} }
		hitsOf := func(q *rlsv3.RateLimitRequest, i int, h uint64) *rlsv3.RateLimitRequest {
			q.Descriptors[i].HitsAddend = wrapperspb.UInt64(h)
			return q
		}
		ov := func(q *rlsv3.RateLimitRequest, rpu uint32, unit typev3.RateLimitUnit, mult uint32) *rlsv3.RateLimitRequest {
			q.Descriptors[0].Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
			if mult > 0 {
				q.Descriptors[0].Limit.UnitMultiplier = wrapperspb.UInt32(mult)
			}
			return q
		}
		neg := req("extra", 1, d("k", r+"neg"))
		neg.Descriptors[0].IsNegativeHits = true
		s := []step{
			k("hits_addend 5", req("extra", 5, d("k", r))),
			k("hits_addend 6 goes over", req("extra", 6, d("k", r))),
			k("then 1 is over too", req("extra", 1, d("k", r))),
			k("hits_addend 0 per descriptor reads", hitsOf(req("extra", 1, d("k", r)), 0, 0)),
			k("a read of a fresh key", hitsOf(req("extra", 1, d("k", r+"fresh")), 0, 0)),
			k("costs per descriptor", hitsOf(hitsOf(req("extra", 1, d("k", r+"x"), d("k", r+"y")), 0, 3), 1, 9)),
			k("costs per descriptor, over", hitsOf(hitsOf(req("extra", 1, d("k", r+"x"), d("k", r+"y")), 0, 3), 1, 9)),
			k("a descriptor over, the other counted", req("extra", 1, d("k", r+"x"), d("k", r+"y"))),
			k("quota 1", req("extra", 1, d("q", r))),
			k("quota 2", req("extra", 1, d("q", r))),
			k("quota 3, admitted over", req("extra", 1, d("q", r))),
			k("quota and an over limit", req("extra", 1, d("q", r), d("block", r))),
			k("shadow 1", req("extra", 1, d("s", r))),
			k("shadow 2", req("extra", 1, d("s", r))),
			k("shadow 3, admitted over", req("extra", 1, d("s", r))),
			k("shadow over and another", req("extra", 1, d("s", r), d("k", r+"z"))),
			k("unlimited", req("extra", 1, d("u", r))),
			k("named", req("extra", 1, d("named", r))),
			k("replaced", req("extra", 1, d("named", r), d("replacer", r))),
			k("limit of 0", req("extra", 1, d("block", r))),
			k("week", req("extra", 1, d("w", r))),
			k("month of 30 days", req("extra", 1, d("m", r))),
			k("year of 365 days", req("extra", 1, d("y", r))),
			k("wildcard, nested", req("extra", 1, d("nest", "abc", "leaf", r))),
			k("a '*' inside a value", req("extra", 1, d("mid", "axb"))),
			k("a '*' inside a value, itself", req("extra", 1, d("mid", "a*b"))),
			k("a prefix with a '*'", req("extra", 1, d("pre", "axbz"))),
			k("a prefix with a '*', itself", req("extra", 1, d("pre", "a*bz"))),
			k("wildcard, too deep", req("extra", 1, d("nest", "abc", "leaf", r, "more", "x"))),
			k("no entries", req("extra", 1, d())),
			k("an entry without a key", req("extra", 1, d("", "v"))),
			k("negative hits", neg),
			k("negative hits again", neg),
			k("override with a multiplier", ov(req("extra", 1, d("k", r+"ov")), 3, typev3.RateLimitUnit_MINUTE, 5)),
			k("override, second", ov(req("extra", 3, d("k", r+"ov")), 3, typev3.RateLimitUnit_MINUTE, 5)),
			k("override in an unknown domain", ov(req("nowhere", 1, d("k", r)), 1, typev3.RateLimitUnit_HOUR, 0)),
			k("empty domain", req("", 1, d("k", r))),
			k("no descriptors", req("extra", 1)),
			{name: "json, over", json: ptr(`{"domain":"extra","descriptors":[{"entries":[{"key":"block","value":"j"}]}]}`)},
			{name: "json, quota", json: ptr(`{"domain":"extra","descriptors":[{"entries":[{"key":"q","value":"` + r + `"}]}]}`)},
			{name: "json, empty domain", json: ptr(`{"descriptors":[{"entries":[{"key":"k","value":"j"}]}]}`)},
			{name: "json, unknown field", json: ptr(`{"domain":"extra","nope":1}`)},
		}
		return s
	}
	return []scenario{
		{name: "extra", ours: ours, steps: steps},
		{name: "extra, stop increment when over limit", ours: ours, envoy: rls.EnvoyOptions{StopIncrementWhenOverLimit: true}, steps: steps},
		{name: "extra, response headers and dynamic metadata", ours: ours,
			envoy: rls.EnvoyOptions{ResponseHeaders: true, DynamicMetadata: true, RemainingHeader: "X-Left"}, steps: steps},
		{name: "extra, global quota and shadow mode", ours: ours, envoy: rls.EnvoyOptions{QuotaMode: true, ShadowMode: true, DynamicMetadata: true}, steps: steps},
	}
}

// TestDifferential sends every scenario's requests to envoyproxy/ratelimit, built at
// RatelimitVersion, and to streamlimit with --compat envoy, both on the test's Redis with
// the same settings, and requires the same answers: whole messages for gRPC, status,
// content type and body for /json.
func TestDifferential(t *testing.T) {
	redis := testenv.Redis(t)
	bin := ratelimitBinary(t)
	total, same := 0, 0
	for _, sc := range append(scenarios(), extraScenarios()...) {
		t.Run(sc.name, func(t *testing.T) {
			env := theirEnv(sc.envoy)
			if sc.merge {
				env["MERGE_DOMAIN_CONFIG"] = "true"
			}
			theirs, theirDir := startTheirs(t, bin, theirOptions{theirs: sc.theirs, ours: sc.ours, env: env, redis: redis})
			ourDir := rulesDir(t, sc.theirs, sc.ours)
			ours, _ := startOurs(t, ourOptions{rulesDir: ourDir, compat: rules.CompatEnvoy, merge: sc.merge, envoy: sc.envoy, redis: redis})
			// Both count in fixed windows of the wall clock: start the scenario at the
			// start of a second, and not in the last seconds of a minute, so that its
			// requests fall in the same windows at both.
			alignClock()
			for _, st := range sc.steps(randomHex(4)) {
				if st.advance > 0 {
					time.Sleep(st.advance)
				}
				if st.install != "" {
					rel, name, _ := strings.Cut(st.install, "=")
					for _, dir := range []string{ourDir, theirDir} {
						if err := os.WriteFile(filepath.Join(dir, name), theirFile(t, rel), 0o644); err != nil {
							t.Fatal(err)
						}
					}
					for _, tg := range []target{ours, theirs} {
						testenv.Eventually(t, 20*time.Second, tg.name+" reloading", func() bool {
							r, err := tg.rls.ShouldRateLimit(context.Background(), st.probe)
							return err == nil && r.GetStatuses()[0].GetCurrentLimit() != nil
						})
					}
				}
				total++
				if diff := compareStep(t, st, ours, theirs); diff != "" {
					t.Errorf("%s: %s", st.name, diff)
				} else {
					same++
				}
			}
		})
	}
	t.Logf("the same answer from streamlimit and envoyproxy/ratelimit %s: %d of %d requests", RatelimitVersion, same, total)
	docSays(t, fmt.Sprintf("| %d of %d equal |", same, total))
}

// alignClock waits for the start of the next second, and past the end of the minute when
// it is less than 5 s away.
func alignClock() {
	now := time.Now()
	if rest := now.Truncate(time.Minute).Add(time.Minute).Sub(now); rest < 5*time.Second {
		time.Sleep(rest)
		now = time.Now()
	}
	time.Sleep(now.Truncate(time.Second).Add(time.Second + 10*time.Millisecond).Sub(now))
}

// compareStep sends st to both targets and describes how their answers differ ("" when
// they do not). Durations in whole seconds may differ by one when the two requests were
// answered in different seconds.
func compareStep(t *testing.T, st step, ours, theirs target) string {
	t.Helper()
	if st.json != nil {
		a, b := postJSON(t, ours.jsonURL, *st.json), postJSON(t, theirs.jsonURL, *st.json)
		if a.status != b.status || a.contentType != b.contentType {
			return fmt.Sprintf("/json: streamlimit %d %q %q, envoyproxy/ratelimit %d %q %q", a.status, a.contentType, a.body, b.status, b.contentType, b.body)
		}
		var ra, rb rlsv3.RateLimitResponse
		if protojson.Unmarshal([]byte(a.body), &ra) == nil && protojson.Unmarshal([]byte(b.body), &rb) == nil {
			if !proto.Equal(&ra, &rb) {
				return fmt.Sprintf("/json bodies: streamlimit %v, envoyproxy/ratelimit %v", &ra, &rb)
			}
			return ""
		}
		if a.body != b.body {
			return fmt.Sprintf("/json bodies: streamlimit %q, envoyproxy/ratelimit %q", a.body, b.body)
		}
		return ""
	}
	before := time.Now().Unix()
	ra, errA := ours.rls.ShouldRateLimit(context.Background(), st.req)
	rb, errB := theirs.rls.ShouldRateLimit(context.Background(), st.req)
	straddled := time.Now().Unix() != before
	if errA != nil || errB != nil {
		sa, sb := status.Convert(errA), status.Convert(errB)
		if (errA == nil) != (errB == nil) || sa.Code() != sb.Code() || sa.Message() != sb.Message() {
			return fmt.Sprintf("errors: streamlimit %v, envoyproxy/ratelimit %v", errA, errB)
		}
		return ""
	}
	normalize(ra, rb, straddled)
	if !proto.Equal(ra, rb) {
		return fmt.Sprintf("\n   streamlimit          %v\n   envoyproxy/ratelimit %v", ra, rb)
	}
	return ""
}

// normalize makes a's durations b's where they differ by one second and the requests
// straddled a second, and keeps of the dynamic metadata's "limit" strings (protobuf's
// text format of the request's override) its requests_per_unit and unit: the format's
// spacing varies by binary on purpose, and envoyproxy/ratelimit's messages predate the
// override's unit_multiplier, which it writes as an unknown field.
func normalize(a, b *rlsv3.RateLimitResponse, straddled bool) {
	if straddled {
		for i, sa := range a.GetStatuses() {
			if i >= len(b.GetStatuses()) {
				break
			}
			da, db := sa.GetDurationUntilReset(), b.GetStatuses()[i].GetDurationUntilReset()
			if da != nil && db != nil && abs(da.GetSeconds()-db.GetSeconds()) == 1 {
				da.Seconds = db.GetSeconds()
			}
		}
		for i, ha := range a.GetResponseHeadersToAdd() {
			if i < len(b.GetResponseHeadersToAdd()) {
				hb := b.GetResponseHeadersToAdd()[i]
				var x, y int64
				if _, err := fmt.Sscan(ha.GetValue(), &x); err == nil {
					if _, err := fmt.Sscan(hb.GetValue(), &y); err == nil && abs(x-y) == 1 {
						ha.Value = hb.GetValue()
					}
				}
			}
		}
	}
	for _, r := range []*rlsv3.RateLimitResponse{a, b} {
		for _, dv := range r.GetDynamicMetadata().GetFields()["descriptors"].GetListValue().GetValues() {
			if l := dv.GetStructValue().GetFields()["limit"]; l != nil {
				l.Kind = structpb.NewStringValue(strings.Join(overrideText.FindAllString(l.GetStringValue(), -1), " ")).Kind
			}
		}
	}
}

// overrideText finds the fields of an override's text format that both servers write.
var overrideText = regexp.MustCompile(`(requests_per_unit|unit):\s*[A-Z0-9]+`)

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
