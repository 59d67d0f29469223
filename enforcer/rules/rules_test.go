package rules

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

func e(kv ...string) []Entry {
	var es []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, Entry{kv[i], kv[i+1]})
	}
	return es
}

func mustLoad(t *testing.T, path string) *Config {
	t.Helper()
	c, err := Load(path)
	if err != nil {
		t.Fatalf("Load(%s): %v", path, err)
	}
	return c
}

// want describes the expected match: "" for none, else "requests/window" of each limit,
// plus flags.
func describeMatch(r *Rule) string {
	if r == nil {
		return ""
	}
	if r.Unlimited {
		return "unlimited"
	}
	var parts []string
	for _, l := range r.Limits {
		parts = append(parts, strings.TrimSpace(
			strings.Join([]string{strconv.FormatInt(l.Requests, 10) + "/" + l.WindowTag(), l.Algorithm.String(), l.Scope.String()}, " ")))
	}
	s := strings.Join(parts, " + ")
	if r.ShadowMode {
		s += " shadow"
	}
	return s
}

// The examples of envoyproxy/ratelimit's README (and its example.yaml), loaded unchanged
// from one directory, match as that README says.
func TestEnvoyExamples(t *testing.T) {
	c := mustLoad(t, "testdata/envoy")
	if got := len(c.Domains()); got != 12 {
		t.Fatalf("%d domains, want 12: %v", got, c.Domains())
	}
	const sw = " sliding_window global"
	for _, tc := range []struct {
		domain string
		desc   []Entry
		want   string
	}{
		// Example 1: the database users and default each get 500/s; others nothing.
		{"mongo_cps", e("database", "users"), "500/1s" + sw},
		{"mongo_cps", e("database", "default"), "500/1s" + sw},
		{"mongo_cps", e("database", "orders"), ""},
		// Example 2: nested descriptors; to_number without value is per number.
		{"messaging", e("message_type", "marketing", "to_number", "2061111111"), "5/86400s" + sw},
		{"messaging", e("to_number", "2061111111"), "100/86400s" + sw},
		{"messaging", e("message_type", "marketing"), ""}, // a placeholder, no limit
		{"messaging", e("message_type", "transactional", "to_number", "2061111111"), ""},
		// Example 3: key+value wins over key alone.
		{"edge_proxy_per_ip", e("remote_address", "50.0.0.1"), "10/1s" + sw},
		{"edge_proxy_per_ip", e("remote_address", "50.0.0.5"), "0/1s" + sw},
		// Example 4: a request deeper than the configuration matches nothing.
		{"example4", e("key", "value", "subkey", "subvalue"), ""},
		{"example4", e("key", "value"), "300/1s" + sw},
		// Example 5: unlimited.
		{"internal", e("ldap", "anything"), "unlimited"},
		{"internal", e("azure", "x"), "100/60s" + sw},
		// Example 6: shadow mode for user-a only.
		{"example6", e("service", "auth-service", "user", "user-a"), "10/1s" + sw + " shadow"},
		{"example6", e("service", "auth-service", "user", "user-b"), "20/1s" + sw},
		{"example6", e("service", "auth-service", "user", "user-c"), ""},
		// Example 8: detailed_metric does not change matching.
		{"example8", e("key1", "unspecified_value"), "10/60s" + sw},
		{"example8", e("key1", "value1"), "20/60s" + sw},
		// Example 9: trailing wildcard.
		{"example9", e("key1", "value1"), "20/60s" + sw},
		{"example9", e("key1", "valueXYZ"), "20/60s" + sw},
		{"example9", e("key1", "other"), ""},
		// Example 10 (wildcard in the middle of a path).
		{"example10_wildcard", e("user", "alice", "action", "readfile", "resource", "documents"), "100/60s" + sw},
		{"example10_wildcard", e("user", "alice", "action", "write", "resource", "documents"), ""},
		// example.yaml: key without value at level 2, its specific values, unlimited, a
		// limit on a placeholder that also has children.
		{"rl", e("foo", "foo"), "2/60s" + sw},
		{"rl", e("foo", "foo", "bar", "bar"), "3/60s" + sw},
		{"rl", e("foo", "foo", "bar", "banned"), "0/60s" + sw},
		{"rl", e("foo", "foo", "baz", "shady"), "3/60s" + sw + " shadow"},
		{"rl", e("foo", "foo", "baz", "baz"), "1/1s" + sw},
		{"rl", e("foo", "foo", "bay", "x"), "unlimited"},
		{"rl", e("service", "service_1"), "1/60s" + sw},
		{"unknown", e("a", "b"), ""},
	} {
		got := describeMatch(c.Match(tc.domain, tc.desc))
		if got != tc.want {
			t.Errorf("Match(%s, %v) = %q, want %q", tc.domain, tc.desc, got, tc.want)
		}
	}
	if r := c.Match("example6", e("service", "auth-service", "user", "user-a")); r.ID != "example6.service.user_user-a" || r.Line != 5 {
		t.Errorf("rule ID/line = %q/%d", r.ID, r.Line)
	}
	if r := c.Match("rl", e("service", "service_1")); !r.QuotaMode {
		t.Error("quota_mode lost")
	}
	if r := c.Match("example8", e("key1", "x")); !r.DetailedMetric {
		t.Error("detailed_metric lost")
	}
}

// Example 2's counters: the value-less to_number gives one counter per number.
func TestCounterKeys(t *testing.T) {
	c := mustLoad(t, "testdata/envoy")
	d := e("message_type", "marketing", "to_number", "2061111111")
	r := c.Match("messaging", d)
	if got := r.Key(d, 0); got != "messaging|message_type=marketing|to_number=2061111111#86400s" {
		t.Errorf("key = %q", got)
	}
	d2 := e("message_type", "marketing", "to_number", "2062222222")
	if r.Key(d, 0) == c.Match("messaging", d2).Key(d2, 0) {
		t.Error("two numbers share a counter")
	}
	// Example 11: share_threshold makes all files/* one counter; without it, one per file.
	a, b := e("files", "files/a.pdf"), e("files", "files/b.csv")
	if ka, kb := c.Match("example11", a).Key(a, 0), c.Match("example11", b).Key(b, 0); ka != kb || ka != "example11|files=files/*#3600s" {
		t.Errorf("shared keys %q, %q", ka, kb)
	}
	a, b = e("files_no_share", "files_no_share/a.pdf"), e("files_no_share", "files_no_share/b.csv")
	if ka, kb := c.Match("example11", a).Key(a, 0), c.Match("example11", b).Key(b, 0); ka == kb {
		t.Errorf("isolated keys are equal: %q", ka)
	}
	// Escaping keeps crafted values from forging another descriptor's key.
	c2 := mustLoad(t, "testdata/single/ours.yaml")
	evil := e("user", "42|path=/articles", "path", "/articles")
	plain := e("user", "42", "path", "/articles")
	r = c2.Match("api", plain)
	if kEvil, kPlain := r.Key(evil, 0), r.Key(plain, 0); kEvil == kPlain || kEvil != "api|user=42%7Cpath%3D/articles|path=/articles#1s" {
		t.Errorf("escaped key %q (plain %q)", kEvil, kPlain)
	}
	buf := make([]byte, 0, 128)
	if n := testing.AllocsPerRun(100, func() { buf = r.AppendKey(buf[:0], plain, 0) }); n != 0 {
		t.Errorf("AppendKey allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { c2.Match("api", plain) }); n != 0 {
		t.Errorf("Match allocates %v times", n)
	}
}

func TestWildcards(t *testing.T) {
	c := mustLoad(t, "testdata/single/example9b.yaml")
	for v, want := range map[string]bool{"/api/123/action": true, "/api/user-id/action": true, "/api/123/other": false, "/api//action": true, "/api/action": false} {
		if got := c.Match("example9", e("path", v)) != nil; got != want {
			t.Errorf("/api/*/action vs %q: %v", v, got)
		}
	}
	c = mustLoad(t, "testdata/single/example9c.yaml")
	for v, want := range map[string]bool{"/api/v1/resource/123/action": true, "/api/v2/resource/456/action": true, "/api/v1/other/123/action": false} {
		if got := c.Match("example9", e("route", v)) != nil; got != want {
			t.Errorf("multi wildcard vs %q: %v", v, got)
		}
	}
	// The nested form of example 4 matches the two-entry request.
	c = mustLoad(t, "testdata/single/example4b.yaml")
	if c.Match("example4", e("key", "value", "subkey", "subvalue")) == nil {
		t.Error("example 4 nested form does not match")
	}
}

// Example 7: with both descriptors matched, the named limit is replaced.
func TestReplaces(t *testing.T) {
	c := mustLoad(t, "testdata/envoy")
	r1 := c.Match("example7", e("key_1", "value_1", "user", "bkthomps"))
	r2 := c.Match("example7", e("key_2", "value_2", "user", "bkthomps"))
	if r1 == nil || r2 == nil || r1.Limits[0].Name != "specific_limit" {
		t.Fatalf("rules %v %v", r1, r2)
	}
	act := Active([]*Rule{r1, r2}, nil)
	if act[0] != 0 || act[1] != 1 {
		t.Errorf("both matched: active %b %b, want the 5/s limit replaced", act[0], act[1])
	}
	if act := Active([]*Rule{r1, nil}, nil); act[0] != 1 {
		t.Errorf("alone: active %b, want in force", act[0])
	}
	// example.yaml: an unlimited rule's replaces count too; here category=account replaces
	// bkthomps and fake_name.
	acc := c.Match("rl", e("category", "account"))
	bk := c.Match("rl", e("foo", "foo", "bar", "bkthomps"))
	if act := Active([]*Rule{acc, bk}, nil); act[0] != 1 || act[1] != 0 {
		t.Errorf("rl: active %b %b", act[0], act[1])
	}
}

func TestExtensions(t *testing.T) {
	c := mustLoad(t, "testdata/single/ours.yaml")
	for _, tc := range []struct {
		desc []Entry
		want string
	}{
		{e("action", "tweet", "user", "7"), "300/10800s sliding_window global"},
		{e("action", "login", "ip", "10.0.0.1"), "3/60s sliding_window global + 10/3600s sliding_window global"},
		{e("device", "d1"), "5/604800s sliding_log site"},
		{e("user", "42", "path", "/articles"), "2/1s token_bucket local"},
		{e("user", "42", "path", "/upload"), "10/60s leaky_bucket local"},
		{e("user", "42", "path", "/search"), "100/604800s fixed_window site"},
		{e("user", "42", "path", "/feed"), "50/129600s gcra local"},
	} {
		if got := describeMatch(c.Match("api", tc.desc)); got != tc.want {
			t.Errorf("Match(%v) = %q, want %q", tc.desc, got, tc.want)
		}
	}
	r := c.Match("api", e("action", "login", "ip", "10.0.0.1"))
	if l := r.Limits[1]; l.SoftPercent != 10 || l.Algo().Allowance() != 11 || l.Unit != "" || l.Line != 21 {
		t.Errorf("second limit %+v", l)
	}
	if r.Limits[0].Name != "login_minute" || r.Key(e("action", "login", "ip", "10.0.0.1"), 1) != "api|action=login|ip=10.0.0.1#3600s" {
		t.Errorf("login rule %+v", r.Limits[0])
	}
	tb := c.Match("api", e("user", "42", "path", "/articles")).Limits[0]
	if tb.Burst != 4 || tb.Algo().Capacity() != 4 {
		t.Errorf("burst %+v", tb)
	}
	vip := c.Match("api", e("user", "42", "path", "/vip"))
	if act := Active([]*Rule{r, vip}, nil); act[0] != 0b10 || act[1] != 1 {
		t.Errorf("vip replaces login_minute only: %b %b", act[0], act[1])
	}
}

func TestParseWindow(t *testing.T) {
	for s, want := range map[string]time.Duration{"3h": 3 * time.Hour, "7d": 7 * 24 * time.Hour, "2w": 14 * 24 * time.Hour,
		"1d12h": 36 * time.Hour, "1.5d": 36 * time.Hour, "90s": 90 * time.Second, "250ms": 250 * time.Millisecond} {
		if got, err := ParseWindow(s); err != nil || got != want {
			t.Errorf("ParseWindow(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "0s", "-5m", "3", "h", "3 hours", "7x"} {
		if _, err := ParseWindow(s); err == nil {
			t.Errorf("ParseWindow(%q) succeeded", s)
		}
	}
}

// Every broken file is rejected with its file:line:column, field and reason.
func TestBrokenFiles(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minutes\n      requests_per_unit: 5\n",
			`unit.yaml:5:13: descriptors[0].rate_limit.unit: unknown unit "minutes" (want second, minute, hour, day, week, month, year)`},
		{"nodomain", "descriptors:\n  - key: k\n", `nodomain.yaml:1:1: domain: missing`},
		{"empty", "", `empty.yaml: domain: missing (the file is empty)`},
		{"unknownfield", "domain: d\ndescriptors:\n  - key: k\n    rate_limt:\n      unit: second\n",
			`unknownfield.yaml:4:5: descriptors[0].rate_limt: unknown field (want one of key, value, rate_limit, rate_limits, descriptors, shadow_mode, quota_mode, detailed_metric, value_to_metric, share_threshold, metadata, priority)`},
		{"negative", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			`negative.yaml:4:51: descriptors[0].rate_limit.requests_per_unit: -1 < 0`},
		{"zerowindow", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {window: 0s, requests_per_unit: 1}\n",
			`zerowindow.yaml:4:26: descriptors[0].rate_limit.window: window "0s" must be positive`},
		{"conflict", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      window: 2h\n      requests_per_unit: 1\n",
			`conflict.yaml:6:15: descriptors[0].rate_limit.window: 2h0m0s contradicts unit hour (1h0m0s); set one of them`},
		{"algorithm", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky, scope: local}\n",
			`algorithm.yaml:4:65: descriptors[0].rate_limit.algorithm: unknown algorithm "leaky" (want sliding_window, token_bucket, leaky_bucket, fixed_window, sliding_log, gcra, sliding_window_estimate)`},
		{"scope", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, scope: planet}\n",
			`scope.yaml:4:61: descriptors[0].rate_limit.scope: unknown scope "planet" (want local, site, global)`},
		{"globalalgo", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky_bucket}\n",
			`globalalgo.yaml:4:65: descriptors[0].rate_limit.algorithm: leaky_bucket is not available in global scope (global limits use sliding_window, token_bucket or gcra; set scope: local or site)`},
		{"globalestimate", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: sliding_window_estimate}\n",
			`globalestimate.yaml:4:65: descriptors[0].rate_limit.algorithm: sliding_window_estimate is not available in global scope (global limits use sliding_window, token_bucket or gcra; set scope: local or site)`},
		{"dupdesc", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
			`dupdesc.yaml:7:12: descriptors[1].key: duplicate descriptor k=v at this level`},
		{"dupfield", "domain: d\ndomain: e\n", `dupfield.yaml:2:1: domain: duplicate field`},
		{"nokey", "domain: d\ndescriptors:\n  - value: v\n", `nokey.yaml:3:5: descriptors[0].key: missing or empty (every descriptor needs a key)`},
		{"norpu", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n",
			`norpu.yaml:5:7: descriptors[0].rate_limit.requests_per_unit: missing (write 0 to reject every request)`},
		{"nounit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 3\n",
			`nounit.yaml:5:7: descriptors[0].rate_limit.unit: missing (set unit or window)`},
		{"unlimitedunit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n",
			`unlimitedunit.yaml:6:13: descriptors[0].rate_limit.unit: should not be set when unlimited`},
		{"burst", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}\n",
			`burst.yaml:4:61: descriptors[0].rate_limit.burst: applies only to token_bucket, leaky_bucket and gcra, not sliding_window`},
		{"samewindow", "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: minute, requests_per_unit: 3}\n      - {window: 60s, requests_per_unit: 10}\n",
			`samewindow.yaml:6:9: descriptors[0].rate_limits[1].window: same window 1m0s as descriptors[0].rate_limits[0]: the two limits would share one counter`},
		{"nested", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
			`nested.yaml:6:28: descriptors[0].descriptors[0].rate_limit.unit: unknown unit "fortnight" (want second, minute, hour, day, week, month, year)`},
		{"syntax", "domain: d\ndescriptors:\n  - key: [unclosed\n", `syntax.yaml:3:3: did not find expected ',' or ']'`},
		// The parser names the line where the enclosing block began (2 here); the error
		// is on the line that breaks the indentation.
		{"indent", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n     unit: minute\n      requests_per_unit: 5\n",
			`indent.yaml:6:7: mapping values are not allowed in this context`},
		{"dedent", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 5\n     unit: minute\n",
			`dedent.yaml:6:6: did not find expected key`},
		{"unclosedflow", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute,\n      requests_per_unit: 5\n  - key: j\n",
			`unclosedflow.yaml:4:5: did not find expected ',' or '}'`},
		{"unclosedquote", "domain: d\ndescriptors:\n  - key: k\n    value: \"v\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
			`unclosedquote.yaml:4:5: found unexpected end of stream`},
		{"type", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes please\n", `type.yaml:4:18: descriptors[0].shadow_mode: want true or false, got "yes please"`},
		{"globalover32", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
			`globalover32.yaml:4:51: descriptors[0].rate_limit.requests_per_unit: 4294967296 is above 4294967295, the most a global count holds (use scope: local or site)`},
		{"globalsoft32", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4000000000, soft_percent: 10}\n",
			`globalsoft32.yaml:4:51: descriptors[0].rate_limit.requests_per_unit: 4000000000 raised by soft_percent 10 is above 4294967295, the most a global count holds`},
		{"alignglobal", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, align: calendar}\n",
			`alignglobal.yaml:4:61: descriptors[0].rate_limit.align: calendar windows are not available in global scope, whose counts slide over sub-buckets across sites (set scope: local or site)`},
		{"alignscope", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 5\n      scope: global\n      align: calendar\n",
			`alignscope.yaml:7:14: descriptors[0].rate_limit.align: calendar windows are not available in global scope, whose counts slide over sub-buckets across sites (set scope: local or site)`},
		{"alignalgo", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, scope: site, align: calendar, algorithm: token_bucket}\n",
			`alignalgo.yaml:4:95: descriptors[0].rate_limit.algorithm: token_bucket does not combine with align: calendar, which counts by fixed windows (omit algorithm or write fixed_window)`},
		{"alignword", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, scope: local, align: clock}\n",
			`alignword.yaml:4:75: descriptors[0].rate_limit.align: unknown alignment "clock" (want calendar)`},
		{"both", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: [{unit: hour, requests_per_unit: 9}]\n",
			`both.yaml:5:18: descriptors[0].rate_limits: use either rate_limit or rate_limits, not both`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name+".yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := LoadFile(path)
			if err == nil {
				t.Fatalf("loaded: %v", c.Domains())
			}
			var re *Error
			if !errors.As(err, &re) {
				t.Fatalf("error %T %v is not a *rules.Error", err, err)
			}
			if got := strings.TrimPrefix(re.Error(), dir+string(filepath.Separator)); got != tc.want {
				t.Errorf("error\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestLoadDir(t *testing.T) {
	c := mustLoad(t, "testdata/twodomains")
	doms := c.Domains()
	if len(doms) != 2 || c.Match("alpha", e("user", "1")) == nil || c.Match("beta", e("user", "1")).Limits[0].Window != time.Hour {
		t.Fatalf("domains %v", doms)
	}
	if c.Match("ignored", e("user", "1")) != nil {
		t.Error("a dot file was loaded")
	}
	// Duplicate domains across files.
	dir := t.TempDir()
	for _, name := range []string{"a.yaml", "b.yaml"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("domain: same\ndescriptors: []\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err := LoadDir(dir)
	var re *Error
	if !errors.As(err, &re) || re.Line != 1 || !strings.HasSuffix(re.File, "b.yaml") || !strings.Contains(re.Reason, `duplicate domain "same" (also in `) {
		t.Fatalf("duplicate domains: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Fatal("loaded a missing file")
	}
}

// syncBuffer is a log or output read while it is written.
type syncBuffer = testenv.SyncBuffer

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, what, cond)
}

// Hot reload: a good edit takes effect, a broken edit is logged with file:line and leaves
// the last good rules in force, and fixing it takes effect again.
func TestReloader(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write := func(s string) {
		t.Helper()
		// Written aside and renamed into place, as deployment tools do: the reloader must
		// never see a half-written file here (one it would rightly reject as broken).
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	limitOf := func(c *Config) int64 {
		r := c.Match("api", e("user", "1"))
		if r == nil {
			return -1
		}
		return r.Limits[0].Requests
	}
	write("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	var logs syncBuffer
	var reloaded sync.WaitGroup
	reloaded.Add(2)
	r, err := NewReloader(path, ReloaderOptions{
		Interval: 10 * time.Millisecond,
		Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
		OnReload: func(*Config) { reloaded.Done() },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	if limitOf(r.Current()) != 5 {
		t.Fatal("initial rules not in force")
	}

	write("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 7}\n")
	eventually(t, "the edit to 7", func() bool { return limitOf(r.Current()) == 7 })

	write("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minutes, requests_per_unit: 9}\n")
	eventually(t, "the broken edit to be rejected", func() bool { return r.Stats().Failures == 1 })
	if limitOf(r.Current()) != 7 {
		t.Fatal("a broken edit replaced the rules")
	}
	var re *Error
	if st := r.Stats(); !errors.As(st.LastError, &re) || re.Line != 4 || re.Field != "descriptors[0].rate_limit.unit" {
		t.Fatalf("last error %v", st.LastError)
	}
	eventually(t, "the rejection to be logged", func() bool {
		return strings.Contains(logs.String(), `rules.yaml:4:24: descriptors[0].rate_limit.unit: unknown unit \"minutes\"`)
	})

	write("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 9}\n")
	eventually(t, "the fix to 9", func() bool { return limitOf(r.Current()) == 9 })
	reloaded.Wait()
	if st := r.Stats(); st.Reloads != 2 || st.Failures != 1 || st.LastError != nil {
		t.Fatalf("stats %+v", st)
	}

	// A broken file at start is an error.
	write("domain: api\ndescriptors: 5\n")
	if _, err := NewReloader(path, ReloaderOptions{}); err == nil {
		t.Fatal("NewReloader accepted a broken file")
	}
}

func TestAlgoLimitValid(t *testing.T) {
	c := mustLoad(t, "testdata/single/ours.yaml")
	for _, desc := range [][]Entry{e("action", "tweet", "user", "1"), e("user", "1", "path", "/feed")} {
		for _, l := range c.Match("api", desc).Limits {
			if err := l.Algo().Validate(); err != nil {
				t.Errorf("%+v: %v", l, err)
			}
			if l.Algorithm == algo.GCRA && l.Algo().Capacity() != 10 {
				t.Errorf("gcra capacity %d", l.Algo().Capacity())
			}
		}
	}
}

func BenchmarkMatchAppendKey(b *testing.B) {
	c, err := Load("testdata/single/ours.yaml")
	if err != nil {
		b.Fatal(err)
	}
	desc := e("action", "login", "ip", "10.0.0.1")
	buf := make([]byte, 0, 128)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r := c.Match("api", desc)
		for j := range r.Limits {
			buf = r.AppendKey(buf[:0], desc, j)
		}
	}
}

// TestCounterKeyIsValidUTF8: a request value with bytes that are not UTF-8 (any HTTP
// header can carry them) gives a valid UTF-8 counter key, distinct from the literal
// percent sequence.
func TestCounterKeyIsValidUTF8(t *testing.T) {
	r := &Rule{Domain: "api", Levels: []Level{{Key: "user"}}, Limits: []Limit{{tag: "60s"}}}
	bad := r.Key([]Entry{{Key: "user", Value: "a\xcab\xffé"}}, 0)
	if !utf8.ValidString(bad) || bad != "api|user=a%CAb%FFé#60s" {
		t.Fatalf("key %q", bad)
	}
	if lit := r.Key([]Entry{{Key: "user", Value: "a%CAb%FFé"}}, 0); lit == bad {
		t.Fatalf("literal %q collides with the encoded bytes", lit)
	}
}

// TestParseNamesItsSource: Parse loads like LoadFile and names the given source in errors.
func TestParseNamesItsSource(t *testing.T) {
	c, err := Parse("embedded.yaml", []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"))
	if err != nil || c.Match("api", []Entry{{Key: "user", Value: "1"}}) == nil {
		t.Fatalf("Parse: %v", err)
	}
	_, err = Parse("embedded.yaml", []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minutes, requests_per_unit: 3}\n"))
	var re *Error
	if !errors.As(err, &re) || re.File != "embedded.yaml" || re.Line != 4 {
		t.Fatalf("Parse error %v, want one at embedded.yaml:4", err)
	}
}

// TestEnvoyKeysAnywhere loads a file as envoyproxy/ratelimit's validator accepts it: that
// validator checks key names, not their position, so a name on a descriptor, a
// detailed_metric inside rate_limit or a key in a replaces item load (and mean nothing
// there). A key it does not know is still rejected, wherever it stands.
func TestEnvoyKeysAnywhere(t *testing.T) {
	c, err := Parse("envoy.yaml", []byte(`
domain: anywhere
descriptors:
  - key: user
    name: per-user-descriptor
    rate_limit:
      name: per_user
      unit: minute
      requests_per_unit: 5
      detailed_metric: true
    descriptors:
      - key: path
        unit: second
        rate_limit:
          unit: second
          requests_per_unit: 2
          replaces: [{name: per_user, key: ignored}]
`))
	if err != nil {
		t.Fatalf("a file envoyproxy/ratelimit accepts does not load: %v", err)
	}
	if got := describeMatch(c.Match("anywhere", e("user", "1"))); got != "5/60s sliding_window global" {
		t.Errorf("user: %q", got)
	}
	if got := describeMatch(c.Match("anywhere", e("user", "1", "path", "/a"))); got != "2/1s sliding_window global" {
		t.Errorf("user/path: %q", got)
	}
	for name, yaml := range map[string]string{
		"descriptor": "domain: d\ndescriptors:\n  - key: k\n    nmae: x\n",
		"rate_limit": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, limit: 3}\n",
		"root":       "domain: d\nratelimits: []\n",
	} {
		if _, err := Parse(name+".yaml", []byte(yaml)); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("%s: %v, want an unknown field error", name, err)
		}
	}
}

// align: calendar loads as a fixed window (local or site scope) whose windows are the
// calendar's: months and years by the calendar, shorter units and durations as multiples
// of themselves since the epoch.
func TestAlignCalendar(t *testing.T) {
	src := `domain: api
descriptors:
  - key: plan
    rate_limit: {requests_per_unit: 1000, unit: MONTH, scope: site, align: calendar}
  - key: user
    rate_limits:
      - {requests_per_unit: 10, unit: minute, scope: local, align: calendar, algorithm: fixed_window}
      - {requests_per_unit: 9000, unit: year, scope: local, align: calendar}
      - {requests_per_unit: 300, window: 3h, scope: local, align: calendar}
`
	c, err := Parse("align.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	plan := c.Match("api", e("plan", "pro")).Limits[0]
	if !plan.Calendar || plan.Algorithm != algo.FixedWindowOn(algo.Month) || plan.Algorithm.String() != "fixed_window" || plan.Scope != Site {
		t.Errorf("plan: %+v", plan)
	}
	ls := c.Match("api", e("user", "7")).Limits
	for i, want := range []algo.Calendar{algo.Epoch, algo.Year, algo.Epoch} {
		if l := ls[i]; !l.Calendar || l.Algorithm != algo.FixedWindowOn(want) || l.Algorithm.Calendar() != want {
			t.Errorf("limit %d: calendar %v, algorithm %v on %v; want fixed_window on %v", i, l.Calendar, l.Algorithm, l.Algorithm.Calendar(), want)
		}
	}
	if ls[2].Line != 9 || ls[2].Window != 3*time.Hour {
		t.Errorf("3h limit: line %d window %v", ls[2].Line, ls[2].Window)
	}
}

// TestLongCounterKeysShortened: a key longer than the records allow is shortened to
// exactly topics.MaxKeyLen bytes of valid UTF-8, keeping its domain, its first entries and
// its window; different values keep different keys, the same value the same key, and no
// value, however crafted, makes a short key equal to a shortened one. Keys up to the bound
// are as before, and shortening does not allocate.
func TestLongCounterKeysShortened(t *testing.T) {
	r := &Rule{Domain: "api", Levels: []Level{{Key: "user"}}, Limits: []Limit{{tag: "60s"}}}
	key := func(v string) string { return r.Key([]Entry{{Key: "user", Value: v}}, 0) }
	fits := strings.Repeat("x", topics.MaxKeyLen-len("api|user=#60s"))
	if got := key(fits); got != "api|user="+fits+"#60s" {
		t.Fatalf("a key of exactly %d bytes changed: %q", topics.MaxKeyLen, got)
	}
	seen := map[string]string{}
	for _, v := range []string{
		fits + "y", fits + "z", "y" + fits, strings.Repeat("é", 700), strings.Repeat("é", 700) + "x",
		strings.Repeat("a|b", 400), strings.Repeat("\xff", 400), strings.Repeat("ab€", 5000),
	} {
		k := key(v)
		if len(k) != topics.MaxKeyLen && len(k) != topics.MaxKeyLen-1 && len(k) != topics.MaxKeyLen-2 {
			t.Errorf("value of %d bytes: key of %d bytes", len(v), len(k))
		}
		if !utf8.ValidString(k) || !strings.HasPrefix(k, "api|user=") || !strings.HasSuffix(k, "#60s") || !strings.Contains(k, longKeyMark) {
			t.Errorf("value of %d bytes: key %q", len(v), k)
		}
		if h := (topics.Hit{Key: k, Site: "eu", BucketStart: 1, Window: 60000, Count: 1}); h.Validate() != nil {
			t.Errorf("shortened key not a valid hit key: %v", h.Validate())
		}
		if prev, ok := seen[k]; ok {
			t.Errorf("values of %d and %d bytes share a key", len(prev), len(v))
		}
		seen[k] = v
		if key(v) != k {
			t.Errorf("the same value gave two keys")
		}
	}
	// The mark never stands in a key that was not shortened: a client's "%~" is escaped.
	if k := key("a%~" + strings.Repeat("0", 2*longKeyDigest)); strings.Contains(k, longKeyMark) {
		t.Fatalf("a value forged the mark of a shortened key: %q", k)
	}
	long := []Entry{{Key: "user", Value: strings.Repeat("x", 3000)}}
	buf := make([]byte, 0, 4096)
	if n := testing.AllocsPerRun(100, func() { buf = r.AppendKey(buf[:0], long, 0) }); n != 0 {
		t.Errorf("AppendKey of a long key allocates %v times", n)
	}
	// The key of an override is bounded the same way and keeps its mark.
	ok := string(AppendOverrideKey(nil, "api", long, &r.Limits[0]))
	if len(ok) > topics.MaxKeyLen || !strings.HasSuffix(ok, "#60s"+overrideMark) || ok == r.Key(long, 0) {
		t.Fatalf("override key of %d bytes %q", len(ok), ok[len(ok)-60:])
	}
}
