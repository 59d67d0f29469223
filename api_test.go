package streamlimit_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/apisurface"
)

// TestExportedNames holds the package's exported surface to this list: a Limiter made by
// New from a Config, and what a service calls on it. A new exported name is a choice made
// here, with the package documentation, not a side effect.
func TestExportedNames(t *testing.T) {
	want := []string{
		"Config", "Limiter", "New",
		"Limiter.Allow", "Limiter.Close", "Limiter.Decide", "Limiter.Engine", "Limiter.Middleware",
		"Limiter.Producer", "Limiter.Ready", "Limiter.Run", "Limiter.Snapshot", "Limiter.WaitReady",
	}
	got, err := apisurface.Exported(".")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("exported names:\n got %d %v\nwant %d %v", len(got), got, len(want), want)
	}
}

// Rules made in code (Config.RuleSet) decide as a file's would, and a Config with both a
// path and a rule set, or neither, is refused.
func TestRuleSetFromCode(t *testing.T) {
	lim, rs := inCode(t)
	ctx := context.Background()
	var got []bool
	for range 3 {
		got = append(got, lim.Allow(ctx, "api", "user", "42"))
	}
	if want := []bool{true, true, false}; !slices.Equal(got, want) {
		t.Errorf("user 42 at 2 a minute, three requests: %v, want %v", got, want)
	}
	for _, cfg := range []streamlimit.Config{
		{Site: "eu-1"},
		{Site: "eu-1", Rules: "rules.yaml", RuleSet: rs},
	} {
		if _, err := streamlimit.New(cfg); err == nil || !strings.Contains(err.Error(), "one of Config.Rules") {
			t.Errorf("New with Rules %q and RuleSet %v: %v, want an error naming both", cfg.Rules, cfg.RuleSet != nil, err)
		}
	}
}

// Allow with a key and no value is a caller's mistake: it panics instead of deciding a
// descriptor without its last key.
func TestAllowOddArgumentsPanics(t *testing.T) {
	lim, _ := inCode(t)
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "odd number") {
			t.Errorf("Allow(ctx, api, user): recovered %v, want a panic about an odd number of arguments", r)
		}
	}()
	//lint:ignore SA5012 the odd argument is the mistake under test
	lim.Allow(context.Background(), "api", "user")
}

// inCode returns a Limiter on rules made in code (user two a minute in domain api), closed
// when t ends, and the rules.
func inCode(t *testing.T) (*streamlimit.Limiter, *rules.Config) {
	t.Helper()
	rs, err := rules.Parse("in code", []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := streamlimit.New(streamlimit.Config{Site: "eu-1", RuleSet: rs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close(context.Background()) })
	return lim, rs
}
