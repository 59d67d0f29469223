package rules

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A domain's Compat comes from its file, else from LoadOptions.Compat, and sets the
// defaults of its limits: a limit of a CompatEnvoy domain that names no scope and no
// algorithm is a site fixed window, as envoyproxy/ratelimit counts it.
func TestCompatSetsLimitDefaults(t *testing.T) {
	const plain = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
	for _, tc := range []struct {
		name  string
		file  string
		opt   Compat
		want  Compat
		scope Scope
		alg   algo.Algorithm
	}{
		{"default", plain, CompatNone, CompatNone, Global, algo.SlidingWindow},
		{"flag", plain, CompatEnvoy, CompatEnvoy, Site, algo.FixedWindow},
		{"file", strings.Replace(plain, "domain: d\n", "domain: d\ncompat: envoy\n", 1), CompatNone, CompatEnvoy, Site, algo.FixedWindow},
		{"file opts out", strings.Replace(plain, "domain: d\n", "domain: d\ncompat: none\n", 1), CompatEnvoy, CompatNone, Global, algo.SlidingWindow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseWith("d.yaml", []byte(tc.file), LoadOptions{Compat: tc.opt})
			if err != nil {
				t.Fatal(err)
			}
			if got, ok := c.Compat("d"); !ok || got != tc.want {
				t.Fatalf("Compat = %v, %v; want %v", got, ok, tc.want)
			}
			l := c.Match("d", []Entry{{Key: "k", Value: "v"}}).Limits[0]
			if l.Scope != tc.scope || l.Algorithm != tc.alg {
				t.Fatalf("limit is %v %v, want %v %v", l.Scope, l.Algorithm, tc.scope, tc.alg)
			}
		})
	}
	if _, ok := (&Config{}).Compat("nope"); ok {
		t.Fatal("Compat of an unknown domain reported as configured")
	}
}

// With MergeDomains, files of one domain are put together, as envoyproxy/ratelimit's
// MERGE_DOMAIN_CONFIG does; a descriptor two of them define is an error at the later
// one, and a compat: that one file states holds for the others.
func TestMergeDomains(t *testing.T) {
	files := map[string]string{
		"a.yaml": "domain: d\ncompat: envoy\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
		"b.yaml": "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 20}\n",
	}
	dir := writeFiles(t, files)
	if _, err := LoadWith(dir, LoadOptions{}); err == nil || !strings.Contains(err.Error(), `b.yaml:1:9: domain: duplicate domain "d"`) {
		t.Fatalf("without MergeDomains: %v, want the duplicate domain at b.yaml", err)
	}
	c, err := LoadWith(dir, LoadOptions{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	a, b := c.Match("d", []Entry{{Key: "a"}}), c.Match("d", []Entry{{Key: "b"}})
	if a == nil || b == nil || a.Limits[0].Requests != 10 || b.Limits[0].Requests != 20 {
		t.Fatalf("merged rules: a %+v, b %+v", a, b)
	}
	if b.File != filepath.Join(dir, "b.yaml") || b.Limits[0].Scope != Site || b.Limits[0].Algorithm != algo.FixedWindow {
		t.Fatalf("b: from %s, %v %v; want from b.yaml, a site fixed window (the domain's compat: envoy)", b.File, b.Limits[0].Scope, b.Limits[0].Algorithm)
	}

	files["c.yaml"] = "domain: d\ndescriptors:\n  - key: x\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	dir = writeFiles(t, files)
	if _, err := LoadWith(dir, LoadOptions{MergeDomains: true}); err == nil || !strings.Contains(err.Error(), "c.yaml:4:10: descriptors[1].key: duplicate descriptor a (no value)") {
		t.Fatalf("a descriptor in two merged files: %v, want the duplicate at c.yaml:4", err)
	}

	delete(files, "c.yaml")
	files["b.yaml"] = strings.Replace(files["b.yaml"], "domain: d\n", "domain: d\ncompat: none\n", 1)
	dir = writeFiles(t, files)
	if _, err := LoadWith(dir, LoadOptions{MergeDomains: true}); err == nil || !strings.Contains(err.Error(), "b.yaml:2:9: compat: none, where another file of the domain says envoy") {
		t.Fatalf("merged files that disagree on compat: %v", err)
	}
}

// A Reloader loads with its LoadOptions, the initial load and every reload alike.
func TestReloaderLoadOptions(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
		"b.yaml": "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
	})
	if _, err := NewReloader(dir, ReloaderOptions{}); err == nil {
		t.Fatal("two files of one domain loaded without MergeDomains")
	}
	r, err := NewReloader(dir, ReloaderOptions{Load: LoadOptions{MergeDomains: true, Compat: CompatEnvoy}})
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := r.Current().Compat("d"); c != CompatEnvoy {
		t.Fatalf("Compat = %v", c)
	}
	if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("domain: d\ndescriptors:\n  - key: c\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The first Check sees the change, the second finds it settled and loads it.
	if ok, err := r.Check(); ok || err != nil {
		t.Fatalf("a change loaded before it settled: %v, %v", ok, err)
	}
	if ok, err := r.Check(); !ok || err != nil || r.Current().Match("d", []Entry{{Key: "c"}}) == nil {
		t.Fatalf("reload of a third file of the domain: %v, %v", ok, err)
	}
}

// In a CompatEnvoy domain only a trailing '*' makes a wildcard, a prefix in which any
// other '*' stands for itself, as envoyproxy/ratelimit matches values; elsewhere every
// '*' matches any run of characters.
func TestCompatWildcards(t *testing.T) {
	const file = "domain: d\ndescriptors:\n  - key: mid\n    value: a*b\n    rate_limit: {unit: minute, requests_per_unit: 1}\n" +
		"  - key: pre\n    value: a*b*\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	for _, tc := range []struct {
		compat   Compat
		key, val string
		match    bool
	}{
		{CompatNone, "mid", "axb", true},
		{CompatNone, "mid", "a*b", true},
		{CompatNone, "pre", "axbyz", true},
		{CompatEnvoy, "mid", "axb", false},
		{CompatEnvoy, "mid", "a*b", true},
		{CompatEnvoy, "pre", "axbyz", false},
		{CompatEnvoy, "pre", "a*byz", true},
		{CompatEnvoy, "pre", "a*b", true},
	} {
		c, err := ParseWith("d.yaml", []byte(file), LoadOptions{Compat: tc.compat})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Match("d", []Entry{{Key: tc.key, Value: tc.val}}) != nil; got != tc.match {
			t.Errorf("compat %v: %s=%s matched %v, want %v", tc.compat, tc.key, tc.val, got, tc.match)
		}
	}
}

// The wildcard expectations envoyproxy/ratelimit's configuration tests hold, on a file of
// the same shape: in a CompatEnvoy domain a value ending in '*' matches every value with
// its prefix, at the top level and nested alike, all such values reach the one rule, a
// value without '*' matches only itself, and a '*' inside a value is no wildcard.
func TestCompatWildcardExpectations(t *testing.T) {
	const file = `domain: w
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noVal
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 20}
`
	c, err := ParseWith("w.yaml", []byte(file), LoadOptions{Compat: CompatEnvoy})
	if err != nil {
		t.Fatal(err)
	}
	match := func(kv ...string) *Rule {
		var es []Entry
		for i := 0; i+1 < len(kv); i += 2 {
			es = append(es, Entry{Key: kv[i], Value: kv[i+1]})
		}
		return c.Match("w", es)
	}
	same := func(what string, a, b *Rule) {
		t.Helper()
		if a == nil || a != b {
			t.Errorf("%s: rules %v and %v, want one rule", what, a, b)
		}
	}
	same("no value", match("noVal", "foo1"), match("noVal", "foo2"))
	same("wildcard", match("wild", "foo1"), match("wild", "foo2"))
	same("wildcard, empty rest", match("wild", "foo"), match("wild", "foo1"))
	if r := match("nestedWild", "val1", "wild", "goo2"); r == nil || r == match("wild", "foo1") {
		t.Errorf("nested wildcard: rule %v, want the nested one", r)
	}
	for _, kv := range [][]string{
		{"wild", "bar"},                      // not the prefix
		{"wild", "fo"},                       // shorter than the prefix
		{"noWild", "foo1"},                   // no '*': the value alone
		{"midWild", "barab"},                 // '*' inside a value is itself
		{"nestedWild", "val1", "wild", "fo"}, // nested, not the prefix
		{"nestedWild", "val2", "wild", "goo"},
	} {
		if r := match(kv...); r != nil {
			t.Errorf("%v matched %v, want nothing", kv, r)
		}
	}
	if match("midWild", "bar*b") == nil || match("noWild", "foo") == nil {
		t.Error("a value does not match itself")
	}
}

// At one level an exact value comes first, then the wildcards in the order the file gives
// them (the first that matches wins, a longer prefix later in the file notwithstanding),
// then the key alone, as envoyproxy/ratelimit looks them up; the same in both compat
// modes.
func TestWildcardPrecedence(t *testing.T) {
	const file = `domain: p
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k
    value: ab*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: k
    value: abc*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: k
    value: abcd
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: k
    value: "*"
    rate_limit: {unit: minute, requests_per_unit: 5}
`
	for _, compat := range []Compat{CompatNone, CompatEnvoy} {
		c, err := ParseWith("p.yaml", []byte(file), LoadOptions{Compat: compat})
		if err != nil {
			t.Fatal(err)
		}
		for v, want := range map[string]int64{"abcd": 4, "abcde": 2, "abc": 2, "ab": 2, "a": 5, "": 5, "zz": 5} {
			r := c.Match("p", []Entry{{Key: "k", Value: v}})
			if r == nil || r.Limits[0].Requests != want {
				t.Errorf("compat %v: k=%q matched %v, want the limit of %d", compat, v, r, want)
			}
		}
	}
}

// share_threshold on a wildcard makes every value it matches one counter, for the rule at
// that level and for the rules nested below it; without it each value counts apart. A
// share_threshold on a value that is no wildcard (in a CompatEnvoy domain: one whose '*'
// is not at its end) is an error at its line.
func TestShareThresholdNested(t *testing.T) {
	const file = `domain: s
descriptors:
  - key: path
    value: "files/*"
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 10}
  - key: path
    value: "docs/*"
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 10}
`
	for _, compat := range []Compat{CompatNone, CompatEnvoy} {
		c, err := ParseWith("s.yaml", []byte(file), LoadOptions{Compat: compat})
		if err != nil {
			t.Fatal(err)
		}
		key := func(path, user string) string {
			es := []Entry{{Key: "path", Value: path}, {Key: "user", Value: user}}
			r := c.Match("s", es)
			if r == nil {
				t.Fatalf("compat %v: %v matches nothing", compat, es)
			}
			return r.Key(es, 0)
		}
		if a, b := key("files/a", "1"), key("files/b", "1"); a != b || a != "s|path=files/*|user=1#3600s" {
			t.Errorf("compat %v: shared wildcard keys %q, %q", compat, a, b)
		}
		if key("files/a", "1") == key("files/a", "2") {
			t.Errorf("compat %v: two users share a counter", compat)
		}
		if key("docs/a", "1") == key("docs/b", "1") {
			t.Errorf("compat %v: values of a wildcard without share_threshold share a counter", compat)
		}
	}

	const bad = "domain: s\ndescriptors:\n  - key: path\n    value: \"a*b\"\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
	if _, err := ParseWith("bad.yaml", []byte(bad), LoadOptions{Compat: CompatEnvoy}); err == nil || !strings.Contains(err.Error(), "bad.yaml:5:") {
		t.Errorf("share_threshold on a value whose '*' is inside it: %v", err)
	}
	if _, err := ParseWith("ok.yaml", []byte(bad), LoadOptions{Compat: CompatNone}); err != nil {
		t.Errorf("share_threshold on a*b in a native domain: %v", err)
	}
}
