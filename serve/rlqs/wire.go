package rlqs

import (
	"fmt"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// A usage report message is decoded here straight from the wire instead of into
// go-control-plane's RateLimitQuotaUsageReports: that would build a Go map per bucket id
// (its keys and values copied) and a Duration per report, hundreds of allocations per
// message, for bucket ids the server has seen before and needs only to recognize. Here a
// report keeps its bucket id's bytes as they came, and the session finds the bucket by
// them; the map is built only for a bucket id not seen before on the stream. The message
// is the one of envoy/service/rate_limit_quota/v3/rlqs.proto:
//
//	RateLimitQuotaUsageReports: 1 domain (string), 2 bucket_quota_usages (repeated message)
//	BucketQuotaUsage:           1 bucket_id (BucketId), 2 time_elapsed (Duration),
//	                            3 num_requests_allowed (uint64), 4 num_requests_denied (uint64)
//	BucketId:                   1 bucket (map<string, string>: entries of 1 key, 2 value)
//
// Unknown fields are skipped, as protobuf requires. Of time_elapsed only the seconds are
// read: they tell a bucket's first report at its client (0) from a timer's report.

// usage is one bucket's report: its bucket id as bytes of a BucketId message (raw) or as
// a map (bucket, from a decoded message), and its counts. first says that its
// time_elapsed is under a second: Envoy reports a new bucket at once, with 0, and every
// later report a timer's period (whole seconds) after the one before.
type usage struct {
	raw             []byte
	bucket          map[string]string
	allowed, denied uint64
	first           bool
}

// wireReports is a usage report message decoded by decodeReports. Its slices alias buf,
// which it reuses from message to message.
type wireReports struct {
	// decoded says that domain and usages are buf's; the codec only fills buf.
	decoded bool
	buf     []byte
	domain  []byte
	usages  []usage
}

// decodeReports decodes a RateLimitQuotaUsageReports message held in r.buf.
func (r *wireReports) decode() error {
	r.domain, r.usages = nil, r.usages[:0]
	b := r.buf
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("usage reports: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return fmt.Errorf("domain: %w", protowire.ParseError(n))
			}
			r.domain, b = v, b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return fmt.Errorf("bucket_quota_usages: %w", protowire.ParseError(n))
			}
			u, err := decodeUsage(v)
			if err != nil {
				return fmt.Errorf("bucket_quota_usages[%d]: %w", len(r.usages), err)
			}
			r.usages, b = append(r.usages, u), b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("usage reports: field %d: %w", num, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	return nil
}

func decodeUsage(b []byte) (usage, error) {
	var u usage
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return u, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return u, fmt.Errorf("bucket_id: %w", protowire.ParseError(n))
			}
			u.raw, b = v, b[n:]
		case (num == 3 || num == 4) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return u, protowire.ParseError(n)
			}
			if num == 3 {
				u.allowed = v
			} else {
				u.denied = v
			}
			b = b[n:]
		case num == 2 && typ == protowire.BytesType:
			// time_elapsed: whether the bucket was reported before at its client
			// (session.lookup); the server measures periods itself.
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return u, fmt.Errorf("time_elapsed: %w", protowire.ParseError(n))
			}
			u.first, b = durationSeconds(v) == 0, b[n:]
		default: // unknown fields
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return u, protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	if u.raw == nil {
		u.raw = []byte{} // present but empty, told apart from a decoded map
	}
	return u, nil
}

// durationSeconds returns the seconds of a google.protobuf.Duration message (0 when
// unset; a malformed one counts as unset, as time_elapsed is a hint).
func durationSeconds(b []byte) int64 {
	var secs int64
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0
			}
			secs, b = int64(v), b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0
		}
		b = b[n:]
	}
	return secs
}

// decodeBucketID decodes the entries of a BucketId message; a later entry of a key
// replaces an earlier one, as for any protobuf map.
func decodeBucketID(b []byte) (map[string]string, error) {
	m := map[string]string{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType {
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		e, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		var k, v []byte
		for len(e) > 0 {
			num, typ, n := protowire.ConsumeTag(e)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			e = e[n:]
			if (num == 1 || num == 2) && typ == protowire.BytesType {
				s, n := protowire.ConsumeBytes(e)
				if n < 0 {
					return nil, protowire.ParseError(n)
				}
				if num == 1 {
					k = s
				} else {
					v = s
				}
				e = e[n:]
				continue
			}
			n = protowire.ConsumeFieldValue(num, typ, e)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			e = e[n:]
		}
		m[string(k)] = string(v)
	}
	return m, nil
}

// wireResponse is a RateLimitQuotaResponse in wire form.
type wireResponse []byte

// A response is written here too: one bucket action per bucket whose assignment is sent,
//
//	RateLimitQuotaResponse: 1 bucket_action (repeated BucketAction)
//	BucketAction:           1 bucket_id (BucketId), 2 quota_assignment_action, 3 abandon_action
//	QuotaAssignmentAction:  2 assignment_time_to_live (Duration), 3 rate_limit_strategy
//	RateLimitStrategy:      1 blanket_rule (enum), 2 requests_per_time_unit, 3 token_bucket
//	RequestsPerTimeUnit:    1 requests_per_time_unit (uint64), 2 time_unit (enum)
//	TokenBucket:            1 max_tokens (uint32), 2 tokens_per_fill (UInt32Value: 1 value),
//	                        3 fill_interval (Duration)
//	Duration:               1 seconds (int64), 2 nanos (int32)
//
// with the bucket id's bytes as the client sent them.

// encoder writes bucket actions, reusing its buffers for the nested messages.
type encoder struct {
	st, pu, tb, w, qa, ba []byte
}

// appendAssignment appends the bucket action assigning a to the bucket of raw id.
func (e *encoder) appendAssignment(dst, raw []byte, a assignment, ttl time.Duration, unit typev3.RateLimitUnit) []byte {
	e.st = e.st[:0]
	switch a.kind {
	case kindAllow, kindDeny:
		rule := typev3.RateLimitStrategy_ALLOW_ALL
		if a.kind == kindDeny {
			rule = typev3.RateLimitStrategy_DENY_ALL
		}
		e.st = protowire.AppendTag(e.st, 1, protowire.VarintType)
		e.st = protowire.AppendVarint(e.st, uint64(rule))
	case kindPerUnit:
		e.pu = protowire.AppendTag(e.pu[:0], 1, protowire.VarintType)
		e.pu = protowire.AppendVarint(e.pu, uint64(a.burst))
		e.pu = protowire.AppendTag(e.pu, 2, protowire.VarintType)
		e.pu = protowire.AppendVarint(e.pu, uint64(unit))
		e.st = appendMessage(e.st, 2, e.pu)
	case kindTokens:
		e.tb = protowire.AppendTag(e.tb[:0], 1, protowire.VarintType)
		e.tb = protowire.AppendVarint(e.tb, uint64(a.burst))
		e.w = protowire.AppendTag(e.w[:0], 1, protowire.VarintType)
		e.w = protowire.AppendVarint(e.w, uint64(a.fill))
		e.tb = appendMessage(e.tb, 2, e.w)
		e.w = appendDuration(e.w[:0], FillInterval)
		e.tb = appendMessage(e.tb, 3, e.w)
		e.st = appendMessage(e.st, 3, e.tb)
	}
	e.w = appendDuration(e.w[:0], ttl)
	e.qa = appendMessage(e.qa[:0], 2, e.w)
	e.qa = appendMessage(e.qa, 3, e.st)
	e.ba = appendMessage(e.ba[:0], 1, raw)
	e.ba = appendMessage(e.ba, 2, e.qa)
	return appendMessage(dst, 1, e.ba)
}

// appendAbandon appends the bucket action abandoning the bucket of raw id.
func (e *encoder) appendAbandon(dst, raw []byte) []byte {
	e.ba = appendMessage(e.ba[:0], 1, raw)
	e.ba = appendMessage(e.ba, 3, nil)
	return appendMessage(dst, 1, e.ba)
}

func appendMessage(dst []byte, num protowire.Number, m []byte) []byte {
	dst = protowire.AppendTag(dst, num, protowire.BytesType)
	return protowire.AppendBytes(dst, m)
}

// appendDuration appends a google.protobuf.Duration's fields (d ≥ 0).
func appendDuration(dst []byte, d time.Duration) []byte {
	if s := int64(d / time.Second); s != 0 {
		dst = protowire.AppendTag(dst, 1, protowire.VarintType)
		dst = protowire.AppendVarint(dst, uint64(s))
	}
	if n := int64(d % time.Second); n != 0 {
		dst = protowire.AppendTag(dst, 2, protowire.VarintType)
		dst = protowire.AppendVarint(dst, uint64(n))
	}
	return dst
}

// codec is gRPC's protobuf codec, except that it decodes a *wireReports and encodes a
// *wireResponse itself.
type codec struct{ proto encoding.CodecV2 }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if w, ok := v.(*wireResponse); ok {
		return mem.BufferSlice{mem.SliceBuffer(*w)}, nil
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*wireReports)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	r.buf = r.buf[:0]
	for _, d := range data {
		r.buf = append(r.buf, d.ReadOnlyData()...)
	}
	// Decoded by the stream's receive (streamRaw), not here: gRPC turns a codec's error
	// into Internal, and an undecodable report is the client's fault (InvalidArgument).
	r.decoded = false
	return nil
}

func (codec) Name() string { return "proto" }

// ServerOption is the option the grpc.Server that a Server is registered on must be made
// with: the codec that decodes usage reports without go-control-plane's messages (see
// wire.go). Other services on that server (health) are unaffected.
func ServerOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(codec{proto: encoding.GetCodecV2("proto")})
}
