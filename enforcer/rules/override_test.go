package rules

import (
	"testing"
	"time"
)

// TestOverrideLimitAndKey: an override takes the matched rule's scope, algorithm and hard
// flag and nothing else, and its key escapes like a rule's and never equals one.
func TestOverrideLimitAndKey(t *testing.T) {
	c, err := Parse("r.yaml", []byte(`
domain: api
descriptors:
  - key: user
    rate_limit: {requests_per_unit: 9, unit: minute, scope: site, algorithm: token_bucket, burst: 90, soft_percent: 10, hard: false}
`))
	if err != nil {
		t.Fatal(err)
	}
	entries := []Entry{{Key: "user", Value: "a|b"}}
	r := c.Match("api", entries)
	l := Override("api", r, entries, 3, time.Minute)
	if l.Scope != Site || l.Algorithm != r.Limits[0].Algorithm || l.Burst != 0 || l.SoftPercent != 0 || l.Requests != 3 || l.Unit != "minute" || l.Name != "api.user-override-60s" {
		t.Fatalf("override limit %+v", l)
	}
	key := string(AppendOverrideKey(nil, "api", entries, l))
	if key != "api|user=a%7Cb#60s|override" || key == r.Key(entries, 0) {
		t.Fatalf("override key %q (rule's %q)", key, r.Key(entries, 0))
	}
	if d := Override("api", nil, []Entry{{Key: "k"}, {Key: "j"}}, 1, 1500*time.Millisecond); d.Scope != DefaultScope || d.Algorithm != DefaultAlgorithm || d.Unit != "" || d.Name != "api.k.j-override-1500ms" {
		t.Fatalf("override without a rule %+v", d)
	}
	if !c.HasDomain("api") || c.HasDomain("web") || (*Config)(nil).HasDomain("api") {
		t.Fatal("HasDomain")
	}
}

// A pool's counter key never equals the key of a rule whose descriptor names the pool, nor
// an override's of that descriptor: each would otherwise share the other's count.
func TestPoolKeyApartFromRuleKeys(t *testing.T) {
	c, err := Parse("pool.yaml", []byte(`
domain: api
pools:
  - name: all
    rate_limit: {requests_per_unit: 1000, unit: minute}
descriptors:
  - key: pool
    rate_limit: {requests_per_unit: 5, unit: minute}
  - key: user
    rate_limit: {requests_per_unit: 100, unit: minute, pool: all}
`))
	if err != nil {
		t.Fatal(err)
	}
	pools := c.Pools("api")
	if len(pools) != 1 {
		t.Fatalf("pools: %v", pools)
	}
	entries := e("pool", "all")
	r := c.Match("api", entries)
	if r == nil {
		t.Fatal("pool=all matches no rule")
	}
	ruleKey := r.Key(entries, 0)
	overrideKey := string(AppendOverrideKey(nil, "api", entries, &r.Limits[0]))
	if pools[0].Key == ruleKey || pools[0].Key == overrideKey {
		t.Errorf("pool key %q shared with the rule (%q) or the override (%q)", pools[0].Key, ruleKey, overrideKey)
	}
	if want := "api|pool=all#60s|pool"; pools[0].Key != want {
		t.Errorf("pool key %q, want %q", pools[0].Key, want)
	}
}
