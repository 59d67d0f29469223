// Package rls serves an enforcer.Engine as Envoy's rate limit service: the gRPC method
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, with the official
// go-control-plane messages, so that Envoy's ratelimit filters (HTTP, network, Thrift) and
// any other RLS client can use streamlimit in place of envoyproxy/ratelimit.
//
// NewServer makes a Server from a Limiter and Options; Register adds it to a grpc.Server.
// A domain in rules.CompatEnvoy (or one no rules file configures, with Options.Compat
// so) is answered as envoyproxy/ratelimit answers it.
//
// How requests are decided (costs, a descriptor's own limit, refunds), what a response
// holds, compat: envoy and the metrics: docs/rls.md; every difference from
// envoyproxy/ratelimit: docs/envoy-compat.md.
package rls
