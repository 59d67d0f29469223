package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/serve/server"
)

// TestCheckWaitOutlastsWriteTimeout asks the check API to wait for room (max_delay_ms)
// longer than the HTTP API's write timeout: a token bucket of one request a second, the
// second request a second early. The wait must end in an answer, not in a connection
// closed at the write deadline (a client sees a bare EOF).
func TestCheckWaitOutlastsWriteTimeout(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1, scope: local, algorithm: token_bucket, burst: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const writeTimeout = 100 * time.Millisecond
	srv, err := server.New(server.Config{
		Config:   streamlimit.Config{Site: "eu", Rules: rules},
		HTTPAddr: "127.0.0.1:0",
		GRPCAddr: "off",
		Limits:   server.Limits{WriteTimeout: writeTimeout, ReadTimeout: writeTimeout},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()

	post := func(body string) (int, string, time.Duration, error) {
		start := time.Now()
		resp, err := http.Post("http://"+srv.HTTPAddr()+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			return 0, "", time.Since(start), err
		}
		defer resp.Body.Close()
		var out struct {
			OverallCode string `json:"overall_code"`
			WaitedMs    int64  `json:"waited_ms"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out.OverallCode, time.Since(start), err
	}
	if code, oc, _, err := post(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"1"}]}]}`); err != nil || oc != "OK" {
		t.Fatalf("first request: %d %q %v", code, oc, err)
	}
	code, oc, took, err := post(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"1"}]}],"max_delay_ms":5000}`)
	if err != nil {
		t.Fatalf("a request waiting %v for room, past the write timeout %v, got no answer: %v", took.Round(time.Millisecond), writeTimeout, err)
	}
	if code != http.StatusOK || oc != "OK" {
		t.Fatalf("after waiting %v: %d %q, want 200 OK", took, code, oc)
	}
	if took < writeTimeout {
		t.Fatalf("answered in %v: the request did not wait past the write timeout, the test shows nothing", took)
	}
}

// TestRefusedConnAnswered opens one connection more than --max-conns-per-addr allows from
// one address, as a client's connection pool does when its requests outnumber the bound,
// and sends a check request on it: the enforcer refuses the connection, and must say so
// (503, Retry-After) instead of closing it under the request, which a client sees as a
// bare EOF. Every such request is answered, not most: none is lost to a reset.
func TestRefusedConnAnswered(t *testing.T) {
	srv := startServer(t, server.Config{Limits: server.Limits{MaxConnsPerAddr: 1, ReadHeaderTimeout: time.Minute}})
	// The connection that fills the address's bound: first in the accept queue, so
	// accepted before any of the client's.
	held, err := net.Dial("tcp", srv.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 20 {
		resp, err := client.Post("http://"+srv.HTTPAddr()+"/v1/check", "application/json", strings.NewReader(checkBody))
		if err != nil {
			t.Fatalf("request %d on a refused connection: %v, want an answer", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "--max-conns-per-addr") {
			t.Fatalf("request %d on a refused connection: %d %q %s, want 503 with Retry-After", i, resp.StatusCode, resp.Header, body)
		}
	}
	// The connection within the bound is served as before.
	fmt.Fprintf(held, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(checkBody), checkBody)
	resp, err := http.ReadResponse(bufio.NewReader(held), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the connection within the bound: %v %v", resp, err)
	}
	resp.Body.Close()
}
