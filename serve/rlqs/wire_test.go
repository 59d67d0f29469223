package rlqs

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestDecodeReportsMatchesProto decodes random report messages, written by the protobuf
// library, and compares every field with the library's own decoding.
func TestDecodeReportsMatchesProto(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		m := &rlqsv3.RateLimitQuotaUsageReports{}
		if rng.IntN(4) > 0 {
			m.Domain = fmt.Sprintf("d%d", rng.IntN(10))
		}
		for range rng.IntN(5) {
			u := &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{NumRequestsAllowed: rng.Uint64N(1 << 40), NumRequestsDenied: rng.Uint64N(3)}
			if rng.IntN(5) > 0 {
				u.BucketId = &rlqsv3.BucketId{Bucket: map[string]string{}}
				for k := range rng.IntN(4) {
					u.BucketId.Bucket[fmt.Sprintf("k%d", k)] = fmt.Sprintf("v=%d|%d", rng.IntN(100), k)
				}
			}
			switch rng.IntN(3) {
			case 0:
				u.TimeElapsed = durationpb.New(time.Duration(rng.Int64N(int64(time.Hour))))
			case 1:
				u.TimeElapsed = durationpb.New(time.Duration(rng.Int64N(int64(time.Second))))
			}
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, u)
		}
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		r := wireReports{buf: b}
		if err := r.decode(); err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if string(r.domain) != m.GetDomain() || len(r.usages) != len(m.GetBucketQuotaUsages()) {
			t.Fatalf("trial %d: domain %q, %d usages; want %q, %d", trial, r.domain, len(r.usages), m.GetDomain(), len(m.GetBucketQuotaUsages()))
		}
		for i, u := range m.GetBucketQuotaUsages() {
			got := r.usages[i]
			if got.allowed != u.GetNumRequestsAllowed() || got.denied != u.GetNumRequestsDenied() {
				t.Fatalf("trial %d usage %d: counts %d/%d, want %d/%d", trial, i, got.allowed, got.denied, u.GetNumRequestsAllowed(), u.GetNumRequestsDenied())
			}
			if want := u.TimeElapsed != nil && u.GetTimeElapsed().GetSeconds() == 0; got.first != want {
				t.Fatalf("trial %d usage %d: first %v with time_elapsed %v", trial, i, got.first, u.GetTimeElapsed())
			}
			id, err := decodeBucketID(got.raw)
			if err != nil {
				t.Fatal(err)
			}
			if canonical(id) != canonical(u.GetBucketId().GetBucket()) {
				t.Fatalf("trial %d usage %d: bucket %v, want %v", trial, i, id, u.GetBucketId().GetBucket())
			}
		}
	}
	// Damaged messages are errors, not panics.
	b, _ := proto.Marshal(&rlqsv3.RateLimitQuotaUsageReports{Domain: "api", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"user": "42"}}, NumRequestsAllowed: 3}}})
	for n := range len(b) {
		r := wireReports{buf: b[:n]}
		if err := r.decode(); err == nil {
			for _, u := range r.usages {
				_, _ = decodeBucketID(u.raw)
			}
		}
	}
}

// TestAppendActionMatchesProto writes every kind of bucket action and compares it, decoded
// by the protobuf library, with the message built from go-control-plane's types.
func TestAppendActionMatchesProto(t *testing.T) {
	id := &rlqsv3.BucketId{Bucket: map[string]string{"user": "42", "name": "x"}}
	raw, _ := proto.Marshal(id)
	ttl := 10 * time.Second
	strategy := func(st *typev3.RateLimitStrategy) *rlqsv3.RateLimitQuotaResponse_BucketAction {
		return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: id, BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: st}}}
	}
	var e encoder
	for _, tc := range []struct {
		a    assignment
		want *rlqsv3.RateLimitQuotaResponse_BucketAction
	}{
		{assignment{kind: kindAllow}, strategy(&typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}})},
		{assignment{kind: kindDeny}, strategy(&typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}})},
		{assignment{kind: kindTokens, burst: 37, fill: 1234}, strategy(&typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens: 37, TokensPerFill: wrapperspb.UInt32(1234), FillInterval: durationpb.New(FillInterval)}}})},
		{assignment{kind: kindPerUnit, burst: 9}, strategy(&typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{
			RequestsPerTimeUnit: 9, TimeUnit: typev3.RateLimitUnit_SECOND}}})},
	} {
		b := e.appendAssignment(nil, raw, tc.a, ttl, typev3.RateLimitUnit_SECOND)
		b = e.appendAbandon(b, raw)
		var got rlqsv3.RateLimitQuotaResponse
		if err := proto.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		want := &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{tc.want,
			{BucketId: id, BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}}}
		if !proto.Equal(&got, want) {
			t.Errorf("%+v:\n got %v\nwant %v", tc.a, &got, want)
		}
		if err := got.ValidateAll(); err != nil {
			t.Errorf("%+v: %v", tc.a, err)
		}
	}
}
