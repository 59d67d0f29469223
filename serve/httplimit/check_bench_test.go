package httplimit

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

// benchCheckBody is the body both check benchmarks post: one descriptor of a rule that
// admits everything.
const benchCheckBody = `{"domain":"api","descriptors":[{"entries":[{"key":"bench","value":"x"}]}],"hits_addend":1}`

// runCheckBench serves one request to h each iteration through a harness that costs
// nothing itself: the request and its body reader are reused (the body is rewound), and
// the ResponseWriter keeps nothing, so that the figure is the handler's own.
func runCheckBench(b *testing.B, h http.Handler) {
	body := bytes.NewReader([]byte(benchCheckBody))
	r := httptest.NewRequest("POST", "/v1/check", nil)
	r.Body = io.NopCloser(body)
	w := &codeWriter{benchWriter: benchWriter{h: make(http.Header, 8)}}
	b.ReportAllocs()
	for b.Loop() {
		body.Reset([]byte(benchCheckBody))
		clear(w.h)
		h.ServeHTTP(w, r)
	}
	if w.code != http.StatusOK {
		b.Fatalf("status %d", w.code)
	}
}

// codeWriter is a benchWriter that remembers the status, so that a benchmark can check
// that it timed admissions, not errors.
type codeWriter struct {
	benchWriter
	code int
}

func (w *codeWriter) WriteHeader(code int) { w.code = code }

// BenchmarkCheckHandler times POST /v1/check: decoding, deciding, encoding, headers.
func BenchmarkCheckHandler(b *testing.B) {
	l, _ := newLimiter(b)
	runCheckBench(b, NewCheckHandler(l, CheckOptions{}))
}

// BenchmarkCheckNull is BenchmarkCheckHandler's baseline: a handler that reads the same
// body and answers 200 with a fixed JSON body of the check answer's size, through the
// same harness. The ratio of the two is what the check costs over serving any JSON call.
func BenchmarkCheckNull(b *testing.B) {
	l, _ := newLimiter(b)
	rec := httptest.NewRecorder()
	NewCheckHandler(l, CheckOptions{}).ServeHTTP(rec, httptest.NewRequest("POST", "/v1/check", bytes.NewReader([]byte(benchCheckBody))))
	answer := rec.Body.Bytes()
	size := strconv.Itoa(len(answer))
	runCheckBench(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			b.Fatal(err)
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", size)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(answer)
	}))
}
