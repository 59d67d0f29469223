package rls

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestHitsAddendOneRange: a descriptor's own hits_addend (a uint64 in Envoy's protocol)
// is held to the bound of every other front door, rules.MaxHits (2^32 − 1): above it the
// call is InvalidArgument and nothing is counted (before, up to 2^63 − 1 was taken).
func TestHitsAddendOneRange(t *testing.T) {
	f := start(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 4294967295, scope: local}
`, Options{})
	req := func(hits uint64) *rlsv3.RateLimitRequest {
		d := descriptor("user", "a")
		d.HitsAddend = wrapperspb.UInt64(hits)
		return &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
	}
	for _, h := range []uint64{math.MaxUint32 + 1, math.MaxInt64, math.MaxUint64} {
		_, err := f.client.ShouldRateLimit(context.Background(), req(h))
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != "descriptors[0].hits_addend: "+formatUint(h)+" is not in 0..4294967295" {
			t.Errorf("hits_addend %d: %v, want InvalidArgument", h, err)
		}
	}
	if r := f.call(t, req(math.MaxUint32)); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetLimitRemaining() != 0 {
		t.Errorf("hits_addend 2^32 − 1 against a limit of as much: %v", r)
	}
}

func formatUint(v uint64) string {
	if v > math.MaxInt64 {
		return "9223372036854775807" // descriptorHits holds it to an int64 first
	}
	return strconv.FormatUint(v, 10)
}

// rawCodec sends a message's bytes as they are, so that a test can send what a Go client
// would refuse to marshal.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.(*[]byte); ok {
		return *b, nil
	}
	return proto.Marshal(v.(proto.Message))
}
func (rawCodec) Unmarshal(b []byte, v any) error { return proto.Unmarshal(b, v.(proto.Message)) }
func (rawCodec) Name() string                    { return "proto" }

// TestInvalidUTF8OverGRPC: a descriptor value that is not UTF-8 is refused over gRPC,
// before any decision: protobuf's string fields must be UTF-8, and grpc-go answers a
// message that does not unmarshal with Internal (it gives the codec no other code).
// Nothing is counted: "u\ufffd", which encoding/json would have made of it, keeps its
// whole limit.
func TestInvalidUTF8OverGRPC(t *testing.T) {
	f := start(t, testRules, Options{})
	// RateLimitRequest{domain: "api", descriptors: [{entries: [{key: "user", value: "u\xff"}]}]}
	entry := protowire.AppendTag(nil, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, "user")
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendString(entry, "u\xff")
	desc := protowire.AppendTag(nil, 1, protowire.BytesType)
	desc = protowire.AppendBytes(desc, entry)
	msg := protowire.AppendTag(nil, 1, protowire.BytesType)
	msg = protowire.AppendString(msg, "api")
	msg = protowire.AppendTag(msg, 2, protowire.BytesType)
	msg = protowire.AppendBytes(msg, desc)
	var resp rlsv3.RateLimitResponse
	for range 2 {
		err := f.conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &msg, &resp, grpc.ForceCodec(rawCodec{}))
		if st := status.Convert(err); st.Code() != codes.Internal || !strings.Contains(st.Message(), "UTF-8") {
			t.Fatalf("a value that is not UTF-8: %v, want it refused", err)
		}
	}
	r := f.call(t, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "u\ufffd")}})
	if r.GetStatuses()[0].GetLimitRemaining() != 2 {
		t.Fatalf("u\ufffd after two refused calls: %v", r)
	}
}
