package server_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	vErrors "github.com/pb33f/libopenapi-validator/errors"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/serve/httplimit"
	"github.com/streamlimit/streamlimit/serve/server"
)

const openAPIRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, scope: local}
  - key: open
    rate_limit: {unlimited: true}
`

// newValidator builds a strict validator for doc: besides the schemas, a response header
// field or body property that the document does not declare is an error.
func newValidator(t *testing.T, doc []byte) validator.Validator {
	t.Helper()
	d, err := libopenapi.NewDocument(doc)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(d, config.WithStrictMode(), config.WithStrictIgnoredHeadersExtra("Date", "X-Content-Type-Options"))
	if len(errs) > 0 {
		t.Fatalf("validator: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		t.Fatalf("the document is not valid OpenAPI: %s", describe(verrs))
	}
	return v
}

func describe(errs []*vErrors.ValidationError) string {
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "\n  %s: %s", e.Message, e.Reason)
		for _, f := range e.SchemaValidationErrors {
			fmt.Fprintf(&b, "\n    %s %s: %s", f.FieldPath, f.KeywordLocation, f.Reason)
		}
	}
	return b.String()
}

// exchange is one request to the real server and what the document must say of it.
type exchange struct {
	name    string
	method  string
	path    string
	body    string
	header  http.Header
	status  int
	badBody bool // the request breaks the document (and the server answers 400)
}

// do sends x to base and returns a maker of copies of the request (the validator reads
// their bodies) and the response, its body read into memory.
func (x exchange) do(t *testing.T, base string) (func() *http.Request, *http.Response) {
	t.Helper()
	newReq := func() *http.Request {
		var body io.Reader = http.NoBody
		if x.body != "" {
			body = strings.NewReader(x.body)
		}
		r, err := http.NewRequest(x.method, base+x.path, body)
		if err != nil {
			t.Fatal(err)
		}
		if x.body != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		for k, vs := range x.header {
			r.Header[k] = vs
		}
		return r
	}
	resp, err := http.DefaultClient.Do(newReq())
	if err != nil {
		t.Fatalf("%s: %v", x.name, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	if resp.StatusCode != x.status {
		t.Fatalf("%s: status %d (%s), want %d", x.name, resp.StatusCode, b, x.status)
	}
	return newReq, resp
}

// startOpenAPIServer runs a whole enforcer (no Kafka: global limits on a local share)
// with the check API, /json, /v1/auth and, when tokens are given, bearer tokens.
func startOpenAPIServer(t *testing.T, tokens ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(openAPIRules), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := runServer(t, server.Config{
		Config:     streamlimit.Config{Site: "eu", Rules: p},
		HTTPAddr:   "127.0.0.1:0",
		GRPCAddr:   "127.0.0.1:0",
		AuthTokens: tokens,
		HTTP: httplimit.Config{Domain: "api", TrustedProxies: []string{"127.0.0.0/8"},
			Descriptors: []httplimit.Descriptor{{Entries: []httplimit.Source{{Type: "remote_address", Key: "user"}}}}},
	})
	return "http://" + srv.HTTPAddr()
}

// TestOpenAPIDescribesTheServer sends the real server every kind of request the document
// describes — admitted, denied, bad, too large, unauthorized, /json OK and OVER_LIMIT,
// /v1/auth, health, metrics — and checks each request and each answer against the
// document, strictly: a field the server adds, renames or retypes fails the test.
func TestOpenAPIDescribesTheServer(t *testing.T) {
	v := newValidator(t, server.OpenAPI)
	base := startOpenAPIServer(t)
	user := func(u string) string {
		return `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"` + u + `"}]}],"hits_addend":1}`
	}
	jsonUser := func(u, extra string) string {
		return `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"` + u + `"}]` + extra + `}]}`
	}
	large := `{"domain":"` + strings.Repeat("a", httplimit.DefaultMaxBodyBytes) + `","descriptors":[{"entries":[{"key":"user"}]}]}`
	client := func(ip string) http.Header {
		return http.Header{"X-Real-Ip": {ip}, "X-Original-Uri": {"/a?b=c"}, "X-Original-Method": {"GET"}}
	}
	for _, x := range []exchange{
		{name: "check admitted", method: "POST", path: "/v1/check", body: user("c"), status: 200},
		{name: "check admitted again", method: "POST", path: "/v1/check", body: user("c"), status: 200},
		{name: "check denied", method: "POST", path: "/v1/check", body: user("c"), status: 429},
		{name: "check unmatched and unlimited", method: "POST", path: "/v1/check", status: 200,
			body: `{"domain":"api","descriptors":[{"entries":[{"key":"nobody","value":"1"}]},{"entries":[{"key":"open","value":"1"}]}]}`},
		{name: "check waits", method: "POST", path: "/v1/check", body: `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"w"}]}],"max_delay_ms":10}`, status: 200},
		{name: "check bad", method: "POST", path: "/v1/check", body: `{"domain":"api","descriptors":[]}`, status: 400, badBody: true},
		{name: "check unknown field", method: "POST", path: "/v1/check", body: `{"domain":"api","descriptor":[]}`, status: 400, badBody: true},
		{name: "check too large", method: "POST", path: "/v1/check", body: large, status: 413},
		{name: "json OK", method: "POST", path: "/json", body: jsonUser("j", ""), status: 200},
		{name: "json OK again", method: "POST", path: "/json", body: jsonUser("j", ""), status: 200},
		{name: "json OVER_LIMIT", method: "POST", path: "/json", body: jsonUser("j", ""), status: 429},
		{name: "json override", method: "POST", path: "/json", body: jsonUser("o", `,"limit":{"requestsPerUnit":5,"unit":"HOUR"}`), status: 200},
		{name: "json override of 0", method: "POST", path: "/json", body: jsonUser("z", `,"limit":{"requests_per_unit":0,"unit":"SECOND"}`), status: 429},
		{name: "json bad unit", method: "POST", path: "/json", body: jsonUser("b", `,"limit":{"requestsPerUnit":5,"unit":"UNKNOWN"}`), status: 400, badBody: true},
		{name: "json malformed", method: "POST", path: "/json", body: `{"domain":`, status: 400, badBody: true},
		{name: "json too large", method: "POST", path: "/json", body: large, status: 413},
		{name: "auth admitted", method: "GET", path: "/v1/auth", header: client("192.0.2.1"), status: 204},
		{name: "auth admitted again", method: "POST", path: "/v1/auth", header: client("192.0.2.1"), status: 204},
		{name: "auth denied", method: "GET", path: "/v1/auth", header: client("192.0.2.1"), status: 429},
		{name: "auth denied 403", method: "GET", path: "/v1/auth?status=403", header: client("192.0.2.1"), status: 403},
		{name: "auth without the original request", method: "GET", path: "/v1/auth", status: 204},
		{name: "healthz", method: "GET", path: "/healthz", status: 200},
		{name: "readyz", method: "GET", path: "/readyz", status: 200},
		{name: "metrics", method: "GET", path: "/metrics", status: 200},
		{name: "openapi", method: "GET", path: server.OpenAPIPath, status: 200},
		{name: "check cross-origin", method: "POST", path: "/v1/check", body: user("x"), header: http.Header{"Origin": {"http://evil.example"}}, status: 403},
		{name: "check from a page, not JSON", method: "POST", path: "/v1/check", body: user("x"), status: 415, badBody: true,
			header: http.Header{"Origin": {base}, "Content-Type": {"text/plain"}}},
		{name: "json cross-origin", method: "POST", path: "/json", body: jsonUser("x", ""), header: http.Header{"Origin": {"http://evil.example"}}, status: 403},
		{name: "json from a page, not JSON", method: "POST", path: "/json", body: jsonUser("x", ""), status: 415, badBody: true,
			header: http.Header{"Origin": {base}, "Content-Type": {"text/plain"}}},
		{name: "metrics cross-origin", method: "GET", path: "/metrics", header: http.Header{"Origin": {"http://evil.example"}}, status: 403},
	} {
		req, resp := x.do(t, base)
		if ok, errs := v.ValidateHttpRequest(req()); ok == x.badBody {
			t.Errorf("%s: request valid %v, want %v:%s", x.name, ok, !x.badBody, describe(errs))
		}
		if ok, errs := v.ValidateHttpResponse(req(), resp); !ok {
			t.Errorf("%s: the %d response breaks the document:%s", x.name, resp.StatusCode, describe(errs))
		}
	}
}

// TestOpenAPIUnauthorized checks the answers of a server that asks for bearer tokens
// against the document: 401 problems without a token, the open paths without one.
func TestOpenAPIUnauthorized(t *testing.T) {
	v := newValidator(t, server.OpenAPI)
	base := startOpenAPIServer(t, "s3cret")
	check := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"t"}]}]}`
	bearer := http.Header{"Authorization": {"Bearer s3cret"}}
	auth := func(ip string) http.Header {
		return http.Header{"Authorization": {"Bearer s3cret"}, "X-Real-Ip": {ip}}
	}
	for _, x := range []exchange{
		{name: "check without a token", method: "POST", path: "/v1/check", body: check, status: 401},
		{name: "json without a token", method: "POST", path: "/json", body: check, status: 401},
		{name: "auth without a token", method: "GET", path: "/v1/auth", status: 401},
		{name: "metrics without a token", method: "GET", path: "/metrics", status: 401},
		{name: "healthz without a token", method: "GET", path: "/healthz", status: 200},
		{name: "openapi without a token", method: "GET", path: server.OpenAPIPath, status: 200},
		{name: "check with a token", method: "POST", path: "/v1/check", body: check, header: bearer, status: 200},
		{name: "auth with a token", method: "GET", path: "/v1/auth?status=401", header: auth("192.0.2.9"), status: 204},
		{name: "auth with a token again", method: "GET", path: "/v1/auth?status=401", header: auth("192.0.2.9"), status: 204},
		{name: "auth denied as 401", method: "GET", path: "/v1/auth?status=401", header: auth("192.0.2.9"), status: 401},
	} {
		req, resp := x.do(t, base)
		if ok, errs := v.ValidateHttpRequest(req()); !ok {
			t.Errorf("%s: request invalid:%s", x.name, describe(errs))
		}
		if ok, errs := v.ValidateHttpResponse(req(), resp); !ok {
			t.Errorf("%s: the %d response breaks the document:%s", x.name, resp.StatusCode, describe(errs))
		}
	}
}

// TestOpenAPIDetectsDrift shows that the checks above catch a server that drifts from the
// document: a renamed field of the check API or of /json, a missing or retyped header
// field.
func TestOpenAPIDetectsDrift(t *testing.T) {
	base := startOpenAPIServer(t)
	v := newValidator(t, server.OpenAPI)
	drifted := func(old, new string) validator.Validator {
		t.Helper()
		if bytes.Count(server.OpenAPI, []byte(old)) == 0 {
			t.Fatalf("the document has no %q", old)
		}
		return newValidator(t, bytes.ReplaceAll(server.OpenAPI, []byte(old), []byte(new)))
	}
	check := exchange{name: "check", method: "POST", path: "/v1/check", status: 200,
		body: `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"d"}]}]}`}
	jsonOK := exchange{name: "json", method: "POST", path: "/json", status: 200,
		body: `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"e"}]}]}`}
	for _, c := range []struct {
		x   exchange
		doc validator.Validator
	}{
		{check, drifted("limit_remaining", "remaining")},
		{jsonOK, drifted("durationUntilReset", "duration_until_reset")},
	} {
		req, resp := c.x.do(t, base)
		if ok, errs := v.ValidateHttpResponse(req(), resp); !ok {
			t.Fatalf("%s: the response breaks the real document:%s", c.x.name, describe(errs))
		}
		resp.Body = io.NopCloser(bytes.NewReader(mustRead(t, resp)))
		if ok, _ := c.doc.ValidateHttpResponse(req(), resp); ok {
			t.Errorf("%s: the response passes a document with a renamed field", c.x.name)
		}
	}
	check.body = strings.Replace(check.body, `"d"`, `"f"`, 1)
	check.do(t, base)
	check.do(t, base)
	check.status = 429
	req, resp := check.do(t, base)
	body := mustRead(t, resp)
	for name, value := range map[string]string{"Retry-After": "", "X-RateLimit-Remaining": "none"} {
		r := *resp
		r.Header = resp.Header.Clone()
		if value == "" {
			r.Header.Del(name)
		} else {
			r.Header.Set(name, value)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if ok, _ := v.ValidateHttpResponse(req(), &r); ok {
			t.Errorf("a 429 with %s %q passes the document", name, value)
		}
	}
}

func mustRead(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return b
}
