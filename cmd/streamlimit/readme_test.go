package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/topics"
)

// TestREADMERulesLoad keeps the examples of the README and of docs/ true: every YAML block
// that starts with "domain:" must load as the enforcer loads it — as rules, or, when it
// lists descriptor entries, as the HTTP descriptor config of --http-config.
func TestREADMERulesLoad(t *testing.T) {
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range append([]string{"../../README.md"}, docs...) {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		blocks := strings.Split(string(b), "```yaml\n")[1:]
		n := 0
		for _, blk := range blocks {
			body := blk[:strings.Index(blk, "```")]
			if !strings.HasPrefix(body, "domain:") {
				continue
			}
			n++
			p := filepath.Join(t.TempDir(), "rules.yaml")
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(body, "entries:") {
				if _, err := loadHTTPConfig(p); err != nil {
					t.Errorf("%s: HTTP config example %d does not load: %v\n%s", filepath.Base(name), n, err, body)
				}
				continue
			}
			if _, err := rules.LoadFile(p); err != nil {
				t.Errorf("%s: rules example %d does not load: %v\n%s", filepath.Base(name), n, err, body)
			}
		}
		if n == 0 && (strings.HasSuffix(name, "README.md") || strings.HasSuffix(name, "rules.md") || strings.HasSuffix(name, "api.md")) {
			t.Errorf("no rules example found in %s", name)
		}
	}
}

// TestREADMEFlagsExist keeps the prose of the README and of docs/ honest about flags: every
// `--flag` they name outside code blocks is a flag of some streamlimit command (docs may
// name other programs' flags as `prog --flag`, which this leaves alone).
func TestREADMEFlagsExist(t *testing.T) {
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) { known["--"+f.Name] = true })
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
	for _, name := range append([]string{"../../README.md"}, docs...) {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.Split(string(b), "```")
		n := 0
		for i := 0; i < len(parts); i += 2 { // outside code blocks
			for _, m := range readmeFlag.FindAllStringSubmatch(parts[i], -1) {
				n++
				if strings.HasSuffix(m[1], "-") { // a family: `--redis-tls-*`
					if !slices.ContainsFunc(slices.Collect(maps.Keys(known)), func(f string) bool { return strings.HasPrefix(f, m[1]) }) {
						t.Errorf("%s names %s*, which no command's flags start with", filepath.Base(name), m[1])
					}
					continue
				}
				if !known[m[1]] {
					t.Errorf("%s names %s, which no command has", filepath.Base(name), m[1])
				}
			}
		}
		if n == 0 && name == "../../README.md" {
			t.Fatal("no flag found in README.md")
		}
	}
}

var readmeFlag = regexp.MustCompile("`(--[a-z][a-z0-9-]*)")

// TestDocsCounterKeys derives docs/records.md's counter-key examples with the enforcer's
// own rule matching and key builder, and checks that the page shows exactly those keys.
func TestDocsCounterKeys(t *testing.T) {
	b, err := os.ReadFile("../../docs/records.md")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.Parse("keys.yaml", []byte(`
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
    descriptors:
      - key: path
        rate_limit: {window: 1500ms, requests_per_unit: 1}
  - key: api_key
    value: partner-*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: account
    rate_limit: {unit: hour, requests_per_unit: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		entries []rules.Entry
		want    string
	}{
		{[]rules.Entry{{Key: "user", Value: "42"}}, "api|user=42#60s"},
		{[]rules.Entry{{Key: "user", Value: "42"}, {Key: "path", Value: "/articles"}}, "api|user=42|path=/articles#1500ms"},
		{[]rules.Entry{{Key: "account", Value: "a|b=c"}}, "api|account=a%7Cb%3Dc#3600s"},
		{[]rules.Entry{{Key: "api_key", Value: "partner-7"}}, "api|api_key=partner-*#60s"},
	} {
		r := cfg.Match("api", c.entries)
		if r == nil {
			t.Fatalf("no rule for %v", c.entries)
		}
		if got := r.Key(c.entries, 0); got != c.want {
			t.Errorf("key of %v = %q, want %q", c.entries, got, c.want)
		}
		if !strings.Contains(string(b), "\n"+c.want+" ") {
			t.Errorf("docs/records.md's counter-key table lacks %q", c.want)
		}
	}
	// A long key, shortened as docs/records.md says: its first bytes, "%~", 32 hex digits of
	// the SHA-256 of the whole key, its '#' and window, 1 024 bytes in all.
	long := []rules.Entry{{Key: "user", Value: strings.Repeat("u", 2000)}}
	whole := "api|user=" + long[0].Value + "#60s"
	sum := sha256.Sum256([]byte(whole))
	suffix := "%~" + hex.EncodeToString(sum[:])[:32] + "#60s"
	want := whole[:1024-len(suffix)] + suffix
	if got := cfg.Match("api", long).Key(long, 0); got != want {
		t.Errorf("long key = %q, want %q", got, want)
	}
	if !strings.Contains(string(b), "then `%~` and the first 32 hex digits of the SHA-256 of the whole key") {
		t.Error("docs/records.md no longer describes long keys as this test checks them")
	}
}

// TestDocsHitIntegers keeps docs/records.md's warning true: a hit whose ts is a float (what
// Python's time.time() * 1000 gives) or uses an exponent is rejected as bad_json, and the
// same hit with integers is accepted.
func TestDocsHitIntegers(t *testing.T) {
	for _, ts := range []string{"1763740000123.456", "1.763740000123e12"} {
		rec := `{"key":"api|user=42#60s","site":"eu-1","ts":` + ts + `,"w":60000,"n":1}`
		if _, err := topics.DecodeHit([]byte(rec)); !errors.Is(err, topics.ErrBadJSON) {
			t.Errorf("%s: %v, want ErrBadJSON", rec, err)
		}
	}
	if _, err := topics.DecodeHit([]byte(`{"key":"api|user=42#60s","site":"eu-1","ts":1763740000123,"w":60000,"n":1}`)); err != nil {
		t.Errorf("integer hit: %v", err)
	}
}
