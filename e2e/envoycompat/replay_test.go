package envoycompat

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/server"
)

// replayStart is the replay's clock at its first request: any instant will do, since
// every expected duration is computed from it.
var replayStart = time.Date(2026, 1, 12, 10, 0, 0, 250_000_000, time.UTC)

// tally counts the expectations met, as envoyproxy/ratelimit's tests count them: whole
// answers equal (proto.Equal, or status, content type and body for /json), overall
// codes, per-descriptor codes, and the other checks (a duration shorter than before).
type tally struct {
	whole, wholeN     int
	overall, overallN int
	desc, descN       int
	other, otherN     int
	misses            []string
}

func pct(a, n int) float64 {
	if n == 0 {
		return 100
	}
	return 100 * float64(a) / float64(n)
}

func (t *tally) String() string {
	return fmt.Sprintf("whole answers %d/%d (%.1f%%), overall codes %d/%d (%.1f%%), descriptor codes %d/%d (%.1f%%), other checks %d/%d",
		t.whole, t.wholeN, pct(t.whole, t.wholeN), t.overall, t.overallN, pct(t.overall, t.overallN),
		t.desc, t.descN, pct(t.desc, t.descN), t.other, t.otherN)
}

func (t *tally) codes(want, got *rlsv3.RateLimitResponse) {
	t.overallN++
	if want.GetOverallCode() == got.GetOverallCode() {
		t.overall++
	}
	for i, w := range want.GetStatuses() {
		t.descN++
		if i < len(got.GetStatuses()) && got.GetStatuses()[i].GetCode() == w.GetCode() {
			t.desc++
		}
	}
}

func (t *tally) miss(format string, args ...any) {
	t.misses = append(t.misses, fmt.Sprintf(format, args...))
}

// replay sends every scenario's steps to a streamlimit server of compat on Redis, and
// tallies the answers against the table.
func replay(t *testing.T, compat rules.Compat) *tally {
	redis := testenv.Redis(t)
	var tl tally
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) {
			clk := clock.NewFake(replayStart)
			dir := rulesDir(t, sc.theirs, sc.ours)
			tg, srv := startOurs(t, ourOptions{rulesDir: dir, compat: compat, merge: sc.merge, envoy: sc.envoy, clock: clk, redis: redis})
			var prev *rlsv3.RateLimitResponse
			for _, st := range sc.steps(randomHex(4)) {
				clk.Advance(st.advance)
				if st.install != "" {
					install(t, srv, dir, st.install)
				}
				where := sc.name + ": " + st.name
				if st.json != nil {
					replayJSON(t, &tl, tg, st, where, clk.Now())
					continue
				}
				got, err := tg.rls.ShouldRateLimit(context.Background(), st.req)
				if st.setup {
					if err != nil {
						t.Fatalf("%s: %v", where, err)
					}
					continue
				}
				switch {
				case st.wantErr != 0:
					tl.wholeN++
					if status.Code(err) == st.wantErr {
						tl.whole++
					} else {
						tl.miss("%s: error %v, want code %v", where, err, st.wantErr)
					}
					continue
				case err != nil:
					tl.wholeN++
					tl.miss("%s: error %v", where, err)
					if st.want != nil {
						tl.codes(st.want, nil)
					}
					continue
				}
				if st.anyCode {
					tl.overallN++
					if c := got.GetOverallCode(); c == ok || c == over {
						tl.overall++
					}
					continue
				}
				if st.shorterReset {
					tl.otherN++
					if got.GetStatuses()[0].GetDurationUntilReset().AsDuration() < prev.GetStatuses()[0].GetDurationUntilReset().AsDuration() {
						tl.other++
					} else {
						tl.miss("%s: duration_until_reset %v, not shorter than %v before", where, got.GetStatuses()[0].GetDurationUntilReset(), prev.GetStatuses()[0].GetDurationUntilReset())
					}
				}
				prev = got
				want := proto.Clone(st.want).(*rlsv3.RateLimitResponse)
				fill(want, clk.Now())
				tl.wholeN++
				if proto.Equal(want, got) {
					tl.whole++
				} else {
					tl.miss("%s:\n   want %v\n    got %v", where, want, got)
				}
				tl.codes(want, got)
			}
		})
	}
	return &tl
}

// replayJSON sends one /json step and tallies its answer.
func replayJSON(t *testing.T, tl *tally, tg target, st step, where string, now time.Time) {
	got := postJSON(t, tg.jsonURL, *st.json)
	w := st.wantJSON
	same := got.status == w.status && got.contentType == w.contentType
	var gotBody rlsv3.RateLimitResponse
	if st.wantJSONBody != nil {
		want := proto.Clone(st.wantJSONBody).(*rlsv3.RateLimitResponse)
		fill(want, now)
		if err := protojson.Unmarshal([]byte(got.body), &gotBody); err != nil {
			same = false
		} else {
			same = same && proto.Equal(want, &gotBody)
		}
		tl.codes(want, &gotBody)
	} else {
		same = same && got.body == w.body
	}
	tl.wholeN++
	if same {
		tl.whole++
	} else {
		want := proto.Clone(st.wantJSONBody)
		if want != nil {
			fill(want.(*rlsv3.RateLimitResponse), now)
		}
		tl.miss("%s: /json answered %d %q %q, want %d %q %q %v", where, got.status, got.contentType, got.body, w.status, w.contentType, w.body, want)
	}
}

// install copies their file (rel=name) into the rules directory dir and waits until srv
// has reloaded it.
func install(t *testing.T, srv *server.Server, dir, spec string) {
	t.Helper()
	rel, name, _ := strings.Cut(spec, "=")
	before := reloads(t, srv)
	if err := os.WriteFile(filepath.Join(dir, name), theirFile(t, rel), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the rules reload", func() bool { return reloads(t, srv) > before })
}

var reloadsRE = regexp.MustCompile(`(?m)^streamlimit_enforcer_rules_reloads_total (\d+)`)

// reloads reads the server's count of rules reloads from /metrics.
func reloads(t *testing.T, srv *server.Server) int {
	t.Helper()
	resp, err := http.Get("http://" + srv.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := reloadsRE.FindSubmatch(b)
	if m == nil {
		t.Fatalf("no rules_reloads_total in /metrics")
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// TestReplay replays the expectations of envoyproxy/ratelimit's integration, config,
// service and /json tests against streamlimit with --compat envoy: at least 98% of the answers must
// be equal as whole messages, and every code.
func TestReplay(t *testing.T) {
	tl := replay(t, rules.CompatEnvoy)
	for _, m := range tl.misses {
		t.Log("differs: " + m)
	}
	t.Logf("compat envoy: %v", tl)
	docSays(t, fmt.Sprintf("| %d of %d (%.0f%%) |", tl.whole, tl.wholeN, pct(tl.whole, tl.wholeN)),
		fmt.Sprintf("| %d of %d / %d of %d |", tl.overall, tl.overallN, tl.desc, tl.descN))
	readmeSays(t, fmt.Sprintf("find %d of their %d expected answers", tl.whole, tl.wholeN))
	if tl.whole != tl.wholeN || tl.overall != tl.overallN || tl.desc != tl.descN || tl.other != tl.otherN {
		t.Errorf("compat envoy: %v; want every answer equal, as reached (the target is 98%% of whole answers and every code)", tl)
	}
}

// TestReplayDefaultMode replays the same expectations against streamlimit's own
// semantics, which keep their differences (docs/envoy-compat.md): sliding windows in
// global scope, the RateLimit header fields, all-or-nothing requests. It pins that they
// stay (at most a fifth of the answers equal) and logs the figures.
func TestReplayDefaultMode(t *testing.T) {
	tl := replay(t, rules.CompatNone)
	if testing.Verbose() {
		for _, m := range tl.misses {
			t.Log("differs: " + m)
		}
	}
	t.Logf("compat none: %v", tl)
	docSays(t, fmt.Sprintf("| %d of %d (%.1f%%) |", tl.whole, tl.wholeN, pct(tl.whole, tl.wholeN)),
		fmt.Sprintf("| %d of %d / %d of %d |", tl.overall, tl.overallN, tl.desc, tl.descN))
	if pct(tl.whole, tl.wholeN) > 20 {
		t.Errorf("compat none: %v; streamlimit's own answers now equal envoyproxy/ratelimit's (did the default change?)", tl)
	}
}

// TestTheirConfigFiles loads envoyproxy/ratelimit's configuration test files as the
// enforcer loads rules, in both modes, and checks that each set is accepted or rejected
// as its config tests expect.
func TestTheirConfigFiles(t *testing.T) {
	const cfg = "test/config/"
	sets, met := 0, map[rules.Compat]int{}
	for _, tc := range []struct {
		files  []string
		merge  bool
		accept bool
	}{
		{[]string{cfg + "basic_config.yaml"}, false, true},
		{[]string{cfg + "merge_domain_key1.yaml", cfg + "merge_domain_key2.yaml"}, true, true},
		{[]string{cfg + "shadowmode_config.yaml"}, false, true},
		{[]string{cfg + "wildcard.yaml"}, false, true},
		{[]string{cfg + "share_threshold.yaml"}, false, true},
		{[]string{
			"test/integration/runtime/current/ratelimit/config/another.yaml",
			"test/integration/runtime/current/ratelimit/config/basic.yaml",
			"test/integration/runtime/current/ratelimit/config/share_threshold.yaml",
			"test/integration/runtime/current/ratelimit/reload.yaml",
		}, false, true},
		{[]string{cfg + "empty_domain.yaml"}, false, false},
		{[]string{cfg + "basic_config.yaml", cfg + "duplicate_domain.yaml"}, false, false},
		{[]string{cfg + "empty_key.yaml"}, false, false},
		{[]string{cfg + "duplicate_key.yaml"}, false, false},
		{[]string{cfg + "merge_domain_key1.yaml", cfg + "merge_domain_key1.yaml=again.yaml"}, true, false},
		{[]string{cfg + "bad_limit_unit.yaml"}, false, false},
		{[]string{cfg + "replaces_self.yaml"}, false, false},
		{[]string{cfg + "replaces_empty.yaml"}, false, false},
		{[]string{cfg + "bad_yaml.yaml"}, false, false},
		{[]string{cfg + "misspelled_key.yaml"}, false, false},
		{[]string{cfg + "misspelled_key2.yaml"}, false, false},
		{[]string{cfg + "non_string_key.yaml"}, false, false},
		{[]string{cfg + "non_map_list.yaml"}, false, false},
		{[]string{cfg + "unlimited_with_unit.yaml"}, false, false},
	} {
		sets++
		dir := rulesDir(t, tc.files, nil)
		for _, compat := range []rules.Compat{rules.CompatEnvoy, rules.CompatNone} {
			_, err := rules.LoadWith(dir, rules.LoadOptions{Compat: compat, MergeDomains: tc.merge})
			if (err == nil) == tc.accept {
				met[compat]++
			} else {
				t.Errorf("%v (merge %v, compat %v): error %v, want accepted %v", tc.files, tc.merge, compat, err, tc.accept)
			}
		}
	}
	docSays(t, fmt.Sprintf("| %d of %d | %d of %d |", met[rules.CompatEnvoy], sets, met[rules.CompatNone], sets))
}

// docSays fails t unless docs/envoy-compat.md states each of figures, so that the
// figures it reports are the ones the tests measure; readmeSays is docSays for the README.
func docSays(t *testing.T, figures ...string) { says(t, "docs/envoy-compat.md", figures) }

func readmeSays(t *testing.T, figures ...string) { says(t, "README.md", figures) }

func says(t *testing.T, file string, figures []string) {
	t.Helper()
	doc, err := os.ReadFile(testenv.RepoPath(t, file))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(doc)), " ") // across line breaks
	for _, f := range figures {
		if !strings.Contains(text, f) {
			t.Errorf("%s does not state %q, the figure measured", file, f)
		}
	}
}
