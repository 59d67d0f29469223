package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// Two requests per second for a user, globally (this site's share without a snapshot: all
// of it), and for an address in this process.
const delayRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 2, scope: local, algorithm: fixed_window}
`

// newDelayLimiter returns a limiter on a fake clock whose waits advance the clock, so
// that tests wait no real time.
func newDelayLimiter(t *testing.T, mod func(*enforcer.Config)) (*enforcer.Engine, *clock.Fake) {
	t.Helper()
	rc, err := rules.Parse("rules.yaml", []byte(delayRules))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(t0)
	cfg := enforcer.Config{Rules: rules.Static(rc), Site: "t", Clock: clk,
		Sleep: func(ctx context.Context, d time.Duration) error { clk.Advance(d); return ctx.Err() }}
	if mod != nil {
		mod(&cfg)
	}
	l, err := enforcer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l, clk
}

func checkBody(key string, maxDelayMs int) string {
	b := `{"domain":"api","descriptors":[{"entries":[{"key":"` + key + `","value":"1"}]}]`
	if maxDelayMs >= 0 {
		b += `,"max_delay_ms":` + strconv.Itoa(maxDelayMs)
	}
	return b + "}"
}

// The check API waits for room when max_delay_ms allows, for a global and a local limit,
// and says how long it waited; without it, or with too short a delay, it refuses at once
// and says how long to wait.
func TestCheckAPIDelay(t *testing.T) {
	for _, key := range []string{"user", "ip"} {
		t.Run(key, func(t *testing.T) {
			l, clk := newDelayLimiter(t, nil)
			srv := httptest.NewServer(NewCheckHandler(l, CheckOptions{}))
			defer srv.Close()
			check := func(maxDelayMs int) CheckResponse {
				t.Helper()
				resp, body := postJSON(t, srv.Client(), srv.URL, checkBody(key, maxDelayMs))
				var cr CheckResponse
				if err := json.Unmarshal(body, &cr); err != nil {
					t.Fatal(err)
				}
				if want := map[string]int{"OK": http.StatusOK, "OVER_LIMIT": http.StatusTooManyRequests}[cr.OverallCode]; resp.StatusCode != want {
					t.Fatalf("max_delay_ms %d: status %d: %s", maxDelayMs, resp.StatusCode, body)
				}
				return cr
			}
			for range 2 {
				if cr := check(1000); cr.OverallCode != "OK" || cr.WaitedMs != 0 {
					t.Fatalf("a request with room: %+v", cr)
				}
			}
			cr := check(-1) // no max_delay_ms: refused at once, told when to come back
			if cr.OverallCode != "OVER_LIMIT" || cr.WaitedMs != 0 || cr.Statuses[0].RetryAfterMs <= 0 || cr.Statuses[0].RetryAfterMs > 1000 {
				t.Fatalf("without max_delay_ms: %+v", cr)
			}
			retry := cr.Statuses[0].RetryAfterMs
			if cr := check(int(retry) - 1); cr.OverallCode != "OVER_LIMIT" || cr.WaitedMs != 0 {
				t.Fatalf("max_delay_ms %d, shorter than the retry-after: %+v", retry-1, cr)
			}
			start := clk.Now()
			cr = check(2000)
			if cr.OverallCode != "OK" || cr.WaitedMs <= 0 || cr.WaitedMs > 1000 {
				t.Fatalf("max_delay_ms 2000: %+v, want admitted after waiting up to a second", cr)
			}
			if got := clk.Now().Sub(start).Milliseconds(); got != cr.WaitedMs {
				t.Fatalf("waited_ms %d, the clock moved %d ms", cr.WaitedMs, got)
			}
		})
	}
	l, _ := newDelayLimiter(t, nil)
	srv := httptest.NewServer(NewCheckHandler(l, CheckOptions{}))
	defer srv.Close()
	for _, ms := range []int{-5, int(MaxDelay.Milliseconds()) + 1} {
		body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"1"}]}],"max_delay_ms":` + strconv.Itoa(ms) + `}`
		if resp, b := postJSON(t, srv.Client(), srv.URL, body); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("max_delay_ms %d: status %d %s, want 400", ms, resp.StatusCode, b)
		}
	}
}

// The reverse proxy built on Delay holds the third request of the second and forwards it
// when there is room; the one without answers 429.
func TestProxyDelay(t *testing.T) {
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer up.Close()
	uu, _ := url.Parse(up.URL)
	cfg := Config{Domain: "api", Descriptors: one(Source{Type: SourceHeader, Name: "X-User", Key: "user"})}
	for _, delay := range []bool{false, true} {
		l, clk := newDelayLimiter(t, nil)
		var dec Decider = l
		if delay {
			dec = Delay(l, 2*time.Second)
		}
		mw, err := New(dec, Options{Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		front := httptest.NewServer(NewProxy(uu, mw))
		calls.Store(0)
		start := clk.Now()
		var codes []int
		for range 3 {
			codes = append(codes, do(t, front.Client(), "GET", front.URL+"/x", map[string]string{"X-User": "42"}, "").StatusCode)
		}
		front.Close()
		want, wantCalls := []int{200, 200, 429}, int64(2)
		if delay {
			want, wantCalls = []int{200, 200, 200}, 3
		}
		if !equalInts(codes, want) || calls.Load() != wantCalls {
			t.Fatalf("delay %v: statuses %v, upstream saw %d; want %v and %d", delay, codes, calls.Load(), want, wantCalls)
		}
		if waited := clk.Now().Sub(start); delay != (waited > 0) {
			t.Fatalf("delay %v: the proxy waited %v", delay, waited)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A client that goes away while its request waits ends the wait (the handler returns,
// the upstream never sees it); while the only waiting place is taken, another request is
// refused at once.
func TestDelayCanceledAndQueueFull(t *testing.T) {
	entered, stop := make(chan struct{}, 1), make(chan struct{})
	l, _ := newDelayLimiter(t, func(c *enforcer.Config) {
		c.MaxWaiters = 1
		c.Sleep = func(ctx context.Context, d time.Duration) error {
			entered <- struct{}{}
			select { // room never comes: only the client (or the test's end) ends this wait
			case <-ctx.Done():
				return ctx.Err()
			case <-stop:
				return errors.New("test over")
			}
		}
	})
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer up.Close()
	uu, _ := url.Parse(up.URL)
	mw, err := New(Delay(l, 10*time.Second), Options{Config: Config{Domain: "api", Descriptors: one(Source{Type: SourceHeader, Name: "X-User", Key: "user"})}})
	if err != nil {
		t.Fatal(err)
	}
	returned := make(chan struct{}, 1)
	proxy := NewProxy(uu, mw)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxy.ServeHTTP(w, r)
		returned <- struct{}{}
	}))
	defer front.Close()
	check := httptest.NewServer(NewCheckHandler(l, CheckOptions{}))
	defer check.Close()
	defer close(stop) // first of the defers: a wait that outlives its client must not hang Close

	for range 2 {
		do(t, front.Client(), "GET", front.URL, map[string]string{"X-User": "1"}, "")
		<-returned
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", front.URL, nil)
	req.Header.Set("X-User", "1")
	done := make(chan error, 1)
	go func() {
		resp, err := front.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select { // the request waits, holding the only place
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy did not wait for room")
	}

	resp, body := postJSON(t, check.Client(), check.URL, checkBody("user", 5000))
	var cr CheckResponse
	if err := json.Unmarshal(body, &cr); err != nil || resp.StatusCode != http.StatusTooManyRequests || cr.OverallCode != "OVER_LIMIT" || cr.WaitedMs != 0 {
		t.Fatalf("a second waiter while the queue is full: %d %s (%v), want OVER_LIMIT at once", resp.StatusCode, body, err)
	}

	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v", err)
	}
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy kept waiting after its client went away")
	}
	if calls.Load() != 2 {
		t.Fatalf("upstream saw %d requests, want the 2 admitted", calls.Load())
	}
}
