package rls

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// DefaultMaxJSONBytes bounds the body of a /json request.
const DefaultMaxJSONBytes = 64 << 10

// JSONHandler returns the handler of envoyproxy/ratelimit's HTTP endpoint /json, for
// clients that cannot speak gRPC: the body is a RateLimitRequest and the answer a
// RateLimitResponse, both in protobuf's canonical JSON mapping (camelCase field names,
// enums by name, durations as "1.5s"), decided exactly as ShouldRateLimit decides. The
// status is 200 when the overall code is OK, 429 when it is OVER_LIMIT, 400 for a body
// that is not a valid request (the reason in a text/plain body) and 413 for one larger
// than DefaultMaxJSONBytes. The response also carries the response_headers_to_add as HTTP
// header fields, so that a client needs no JSON to read Retry-After.
//
// A request to a domain in rules.CompatEnvoy (and any body that is not a request, with
// Options.Compat so) is answered as envoyproxy/ratelimit's /json answers: every refusal
// is 400 with the body "Bad Request", and the response's header fields are only in its
// JSON.
func (s *Server) JSONHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		envoy := s.opts.Compat == rules.CompatEnvoy
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, DefaultMaxJSONBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				http.Error(w, "request body larger than "+strconv.Itoa(DefaultMaxJSONBytes)+" bytes", http.StatusRequestEntityTooLarge)
				return
			}
			jsonError(w, envoy, "reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			s.metrics.invalid.Inc()
			jsonError(w, envoy, "malformed RateLimitRequest JSON: "+err.Error(), http.StatusBadRequest)
			return
		}
		envoy = s.compat(s.rules(), req.GetDomain()) == rules.CompatEnvoy
		resp, err := s.ShouldRateLimit(r.Context(), &req)
		if err != nil {
			st := status.Convert(err)
			code := http.StatusBadRequest
			if st.Code() == codes.Canceled || st.Code() == codes.DeadlineExceeded {
				// The caller went away or gave up: nobody reads the answer.
				code = http.StatusServiceUnavailable
			}
			jsonError(w, envoy, st.Message(), code)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, "encoding the response failed", http.StatusInternalServerError)
			return
		}
		h := w.Header()
		if !envoy {
			for _, f := range resp.GetResponseHeadersToAdd() {
				h.Set(f.GetKey(), f.GetValue())
			}
			h.Set("Cache-Control", "no-store")
		}
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(out)))
		switch resp.GetOverallCode() {
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			w.WriteHeader(http.StatusTooManyRequests)
		case rlsv3.RateLimitResponse_OK:
			w.WriteHeader(http.StatusOK)
		default:
			w.WriteHeader(http.StatusInternalServerError)
		}
		if _, err := w.Write(out); err != nil {
			s.opts.Logger.LogAttrs(r.Context(), slog.LevelDebug, "writing /json response", slog.Any("err", err))
		}
	})
}

// jsonError answers a /json request that gets no decision: with reason, or, as
// envoyproxy/ratelimit answers every such request (envoy), with the status text alone.
func jsonError(w http.ResponseWriter, envoy bool, reason string, code int) {
	if envoy {
		reason = http.StatusText(code)
	}
	http.Error(w, reason, code)
}
