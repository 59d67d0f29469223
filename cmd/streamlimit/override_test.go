package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	slrules "github.com/streamlimit/streamlimit/enforcer/rules"
)

// TestEnforcerLimitOverridesFlag runs `streamlimit enforcer` and asks its gRPC service,
// with a real client, about a descriptor whose own limit (3/min) is above its rule's
// (1/min): by default the override decides and the second call passes; with
// --limit-overrides ignore the rule does and the second call is denied.
func TestEnforcerLimitOverridesFlag(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1, scope: local}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		flags  []string
		second rlsv3.RateLimitResponse_Code
	}{
		{nil, rlsv3.RateLimitResponse_OK},
		{[]string{"--limit-overrides", "ignore"}, rlsv3.RateLimitResponse_OVER_LIMIT},
	} {
		// Each enforcer runs until the test ends, on ports of its own.
		grpcAddr := serve(t, append([]string{"enforcer", "--no-kafka", "--site", "eu", "--rules", rules,
			"--http-listen", anyPort, "--grpc-listen", anyPort, "--log-level", "warn"}, c.flags...)...).addr(t, "grpc")
		conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		client := rlsv3.NewRateLimitServiceClient(conn)
		req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "1"}},
			Limit:   &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MINUTE},
		}}}
		var codes []rlsv3.RateLimitResponse_Code
		for len(codes) < 2 {
			cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := client.ShouldRateLimit(cctx, req, grpc.WaitForReady(true))
			ccancel()
			if err != nil {
				t.Fatalf("%v: ShouldRateLimit: %v", c.flags, err)
			}
			codes = append(codes, resp.GetOverallCode())
		}
		if codes[0] != rlsv3.RateLimitResponse_OK || codes[1] != c.second {
			t.Errorf("%v: codes %v, want OK then %v", c.flags, codes, c.second)
		}
		conn.Close()
	}
}

// TestDocsOverrideKey checks docs/api.md's example of an override's counter key against
// the key the enforcer builds.
func TestDocsOverrideKey(t *testing.T) {
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	entries := []slrules.Entry{{Key: "user", Value: "42"}}
	key := string(slrules.AppendOverrideKey(nil, "api", entries, slrules.Override("api", nil, entries, 5, time.Minute)))
	if key != "api|user=42#60s|override" || !strings.Contains(string(b), "`"+key+"`") {
		t.Fatalf("override key %q is not docs/api.md's", key)
	}
}
