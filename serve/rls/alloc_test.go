//go:build !race

// Allocation counts are meaningless under -race, where sync.Pool drops items on purpose;
// make test runs this file in its first, race-free pass.

package rls

import (
	"context"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestShouldRateLimitAllocs holds a call's allocations where they are: for a request of
// one descriptor of a global rule, the response's messages in one block and the header
// values' string; for three descriptors, two more (the statuses and their pointers).
// Before the messages were allocated together and the header fields rendered into the
// pooled scratch, a one-descriptor call took 14; before rules.ValidateRequest named a
// descriptor's field only for an error, 3 (and 7 for three descriptors).
func TestShouldRateLimitAllocs(t *testing.T) {
	srv := benchServer(t)
	ctx := context.Background()
	one := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "a")}}
	three := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		descriptor("user", "a"), descriptor("user", "b"), descriptor("user", "c"),
	}}
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		max  float64
	}{{"one descriptor", one, 2}, {"three descriptors", three, 4}} {
		call := func() {
			resp, err := srv.ShouldRateLimit(ctx, tc.req)
			if err != nil || len(resp.GetStatuses()) != len(tc.req.Descriptors) || len(resp.GetResponseHeadersToAdd()) == 0 {
				t.Fatalf("%v %v", resp, err)
			}
		}
		call() // warm: the keys' handles, the scratch and its buffers
		if a := testing.AllocsPerRun(200, call); a > tc.max {
			t.Errorf("%s: %v allocs per call, want at most %v", tc.name, a, tc.max)
		}
	}
}
