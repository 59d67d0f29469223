package server

import (
	_ "embed"
	"net/http"
	"strconv"
)

// OpenAPIPath is where the Handler serves OpenAPI, without a token like /healthz: it
// describes the API and holds nothing secret.
const OpenAPIPath = "/openapi.yaml"

// OpenAPI is the OpenAPI 3.1 document of the HTTP API that Handler serves: every
// operation, request and response body, status and rate-limit header field. The tests
// check the server's real requests and answers against it.
//
//go:embed openapi.yaml
var OpenAPI []byte

// serveOpenAPI answers with the OpenAPI document.
func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/yaml")
	h.Set("Content-Length", strconv.Itoa(len(OpenAPI)))
	_, _ = w.Write(OpenAPI)
}
