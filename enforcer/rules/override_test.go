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
