package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// envoyExamples are envoyproxy/ratelimit's README examples, kept with the rules package.
const envoyExamples = "../../enforcer/rules/testdata/envoy"

func TestRulesCheckEnvoyExamples(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(envoyExamples, "*.yaml"))
	if err != nil || len(files) < 10 {
		t.Fatalf("envoy examples: %v, %v", files, err)
	}
	for _, f := range files {
		out, errOut, err := runSplit(t, "rules", "check", f)
		if err != nil || errOut != "" {
			t.Errorf("%s: %v %s", f, err, errOut)
			continue
		}
		if !strings.Contains(out, "ok: ") || !strings.Contains(out, f+":") {
			t.Errorf("%s: output lists no limit:\n%s", f, out)
		}
	}
	// The README's main example, every descriptor and flag, as a table.
	out, _, err := runSplit(t, "rules", "check", filepath.Join(envoyExamples, "example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "rules_envoy_example", out)
}

func TestRulesCheckDirectory(t *testing.T) {
	dir := filepath.Join("testdata", "rules", "good")
	out, _, err := runSplit(t, "rules", "check", dir)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "rules_good", out)

	out, _, err = runSplit(t, "rules", "check", "--json", dir)
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rows) != 8 {
		t.Fatalf("%d rows, want 8:\n%s", len(rows), out)
	}
	// Every limit as the enforcer loads it: window in ms, defaults filled in.
	want := map[string]any{"domain": "api", "descriptor": "action=login/ip", "requests": 10.0, "window_ms": 3600000.0,
		"algorithm": "sliding_window", "scope": "global", "soft_percent": 10.0, "line": 19.0}
	got := rows[2]
	// The soft band: 10 per hour with soft_percent 10 admits an 11th, marked soft.
	if band, _ := got["soft_band"].([]any); len(band) != 2 || band[0] != 11.0 || band[1] != 11.0 {
		t.Errorf("row 2 soft_band = %v, want [11 11]", got["soft_band"])
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("row 2 %s = %v, want %v (row %v)", k, got[k], v, got)
		}
	}
	if rows[4]["unreachable"] != nil || rows[5]["unreachable"] != true {
		t.Errorf("the wildcard /vipx* after /vip* should be unreachable, and only it: %v %v", rows[4], rows[5])
	}
	if rows[6]["unlimited"] != true || rows[7]["scope"] != "site" {
		t.Errorf("internal.yml rows: %v %v", rows[6], rows[7])
	}
}

func TestRulesCheckBroken(t *testing.T) {
	broken := filepath.Join("testdata", "rules", "broken")
	tmp := t.TempDir()
	syntax := filepath.Join(tmp, "syntax.yaml")
	if err := os.WriteFile(syntax, []byte("domain: d\ndescriptors:\n  - key: [unclosed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		want []string
	}{
		{broken, []string{
			"2 errors:",
			broken + `/bad.yaml:5:13: descriptors[0].rate_limit.unit: unknown unit "minutes"`,
			broken + `/bad.yaml:8:65: descriptors[1].rate_limit.algorithm: leaky_bucket is not available in global scope`,
		}},
		{filepath.Join(broken, "bad.yaml"), []string{broken + "/bad.yaml:5:13: "}},
		{filepath.Join("testdata", "rules", "dupdomain"), []string{`dupdomain/b.yaml:1:9: domain: duplicate domain "other" (also in testdata/rules/dupdomain/a.yaml)`}},
		{syntax, []string{syntax + ":3:3: did not find expected ',' or ']'"}},
		{filepath.Join(tmp, "missing.yaml"), []string{"missing.yaml: ", "no such file"}},
	} {
		out, _, err := runSplit(t, "rules", "check", tc.path)
		if err == nil {
			t.Errorf("%s: accepted:\n%s", tc.path, out)
			continue
		}
		if out != "" {
			t.Errorf("%s: printed a listing on error:\n%s", tc.path, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error\n%v\nwant it to contain %q", tc.path, err, w)
			}
		}
	}
}

// rules check lists pools, their priorities, and each limit's pool, elastic range,
// priority and hard flag.
func TestRulesCheckPools(t *testing.T) {
	out, _, err := runSplit(t, "rules", "check", filepath.Join("testdata", "rules", "pools"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"pool=all, elastic to 300 below 50% of the pool, priority=paid",
		"pool=all, priority=free",
		"pool all",
		"paid fills 100%, free fills 90%, batch fills 80%",
		"ok: 3 limits in 1 domain",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

// rules check lists a calendar-aligned limit as the fixed window it is, flagged.
func TestRulesCheckAlign(t *testing.T) {
	p := filepath.Join(t.TempDir(), "rules.yaml")
	src := "domain: api\ndescriptors:\n  - key: plan\n    rate_limit: {requests_per_unit: 100, unit: month, scope: site, align: calendar}\n"
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runSplit(t, "rules", "check", p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"fixed_window", "site", "align calendar"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

// rules check loads as the enforcer does with the same --compat and --merge-domains: a
// domain split over two files, whose limits are envoyproxy/ratelimit's site fixed windows.
func TestRulesCheckCompatAndMerge(t *testing.T) {
	dir := t.TempDir()
	for name, y := range map[string]string{
		"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
		"b.yaml": "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := runSplit(t, "rules", "check", dir); err == nil || !strings.Contains(err.Error(), `duplicate domain "d"`) {
		t.Fatalf("without --merge-domains: %v", err)
	}
	out, _, err := runSplit(t, "rules", "check", "--json", "--compat", "envoy", "--merge-domains", dir)
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rows) != 2 {
		t.Fatalf("%d rows, want a and b:\n%s", len(rows), out)
	}
	for _, r := range rows {
		if r["scope"] != "site" || r["algorithm"] != "fixed_window" {
			t.Errorf("%v: want envoyproxy/ratelimit's site fixed window", r)
		}
	}
	if _, _, err := runSplit(t, "rules", "check", "--compat", "ratelimit", dir); err == nil || !strings.Contains(err.Error(), `unknown compat "ratelimit"`) {
		t.Errorf("--compat ratelimit: %v", err)
	}
}
