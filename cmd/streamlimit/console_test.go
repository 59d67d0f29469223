package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/producer"
)

// EnvConsoleScreenshot names a file where TestConsoleInABrowser saves a PNG of the page
// as it ends (it always saves one in the test's temporary directory too).
const EnvConsoleScreenshot = "STREAMLIMIT_CONSOLE_SCREENSHOT"

// startDev runs `streamlimit dev` with args until the test ends and returns what its
// banner says: the Kafka address and the console's URL.
func startDev(t *testing.T, args ...string) (broker, consoleURL string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out devOutput
	cmd := newRootCmd()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"dev"}, args...))
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dev returned %v", err)
		}
	})
	kafkaRE := regexp.MustCompile(`(?m)^  kafka +(127\.0\.0\.1:\d+)$`)
	consoleRE := regexp.MustCompile(`(?m)^  console +(http://\S+)`)
	for deadline := time.Now().Add(30 * time.Second); ; {
		k, c := kafkaRE.FindStringSubmatch(out.String()), consoleRE.FindStringSubmatch(out.String())
		if k != nil && c != nil {
			return k[1], c[1]
		}
		select {
		case err := <-done:
			t.Fatalf("dev exited: %v\n%s", err, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev printed no kafka address or console URL:\n%s", out.String())
		}
	}
}

// cuttableDialer dials Kafka for a producer until Cut, which closes its connections and
// refuses new ones: the producer's site goes silent without leaving, as when it crashes.
type cuttableDialer struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func (d *cuttableDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut {
		return nil, errors.New("link cut")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *cuttableDialer) Cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cut = true
	for _, c := range d.conns {
		_ = c.Close()
	}
}

// startBrowser starts headless Chromium and returns a tab's context. Under CI=true a
// missing Chromium fails the test; elsewhere it skips it.
func startBrowser(t *testing.T) context.Context {
	t.Helper()
	exe := testenv.Tool(t, "chromium", "apt-get install -y chromium (examples/install-test-tools.sh, which make test runs, installs it)")
	var logs bytes.Buffer
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox, // as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1200),
		chromedp.CombinedOutput(&syncWriter{w: &logs}),
	)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		if t.Failed() {
			t.Logf("chromium's output:\n%s", logs.String())
		}
	})
	// The first action starts the browser, with no deadline of its own (see chromedp.Run).
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v\n%s", err, logs.String())
	}
	return ctx
}

// syncWriter serializes writes to w (chromium's stdout and stderr).
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// waitJS waits until the JavaScript expression cond is true in the page.
func waitJS(t *testing.T, ctx context.Context, timeout time.Duration, what, cond string) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](cond))
		if err == nil && ok {
			t.Logf("%s: after %v", what, time.Since(start).Round(time.Millisecond))
			return
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	status, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('status').textContent + ' | ' + document.querySelector('main').innerText`))
	t.Fatalf("%s: not within %v (last error %v); the page says:\n%s", what, timeout, last, status)
}

// consoleRules are the demo's rules and a soft limit for carol.
const consoleRules = `domain: demo
descriptors:
  - key: client
    rate_limit: {requests_per_unit: 50, window: 5s, scope: global}
  - key: client
    value: carol
    rate_limit:
      requests_per_unit: 20
      window: 5s
      scope: site
      soft_percent: 10
`

// TestConsoleInABrowser opens the console of `streamlimit dev` in headless Chromium and
// checks that it loads and updates live, that it shows a site that leaves as left and one
// that goes silent as crashed, a client held to its limit among the top keys and the
// recent 429s with the denials per second, and that a key holding markup is shown as
// text, never run.
func TestConsoleInABrowser(t *testing.T) {
	ctx := startBrowser(t)
	// The demo's rules, and carol with a soft band: 20 per 5 s, 429s past 22.
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(consoleRules), 0o644); err != nil {
		t.Fatal(err)
	}
	checked, err := run(t, "rules", "check", rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	carolAt := regexp.MustCompile(`(?m)^demo +client=carol .* (\S+:\d+)$`).FindStringSubmatch(checked)
	if carolAt == nil {
		t.Fatalf("rules check shows no limit for carol:\n%s", checked)
	}
	broker, ui := startDev(t, "--port", "0", "--http-listen", "127.0.0.1:0", "--grpc-listen", "off", "--log-level", "error", "--rules", rulesFile)
	api := strings.TrimSuffix(ui, "/ui/")

	// Two more sites publish to dev's hits topic, as enforcers of their own would.
	quiet := slog.New(slog.DiscardHandler)
	us, err := producer.New(producer.Config{Brokers: []string{broker}, Site: "us", Instance: "us-1", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var apLink cuttableDialer
	ap, err := producer.New(producer.Config{Brokers: []string{broker}, Site: "ap", Instance: "ap-1", Logger: quiet,
		KafkaOpts: []kgo.Opt{kgo.Dialer(apLink.DialContext)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = ap.Close(cctx) // cut: its last hits are lost, as a crash loses them
	})
	// bob is hit from both until the page shows him: his counts leave a 5 s window, which a
	// loaded machine can take longer than to start the browser.
	const bob = "demo|client=bob#5s"
	bobDone := make(chan struct{})
	var bobWG sync.WaitGroup
	bobWG.Add(1)
	go func() {
		defer bobWG.Done()
		for {
			us.Hit(bob, 5*time.Second, 2)
			ap.Hit(bob, 5*time.Second, 1)
			select {
			case <-bobDone:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	stopBob := sync.OnceFunc(func() { close(bobDone); bobWG.Wait() })
	defer stopBob()

	if err := chromedp.Do(ctx, chromedp.Navigate(ui)); err != nil {
		t.Fatal(err)
	}
	const loading = 30 * time.Second
	waitJS(t, ctx, loading, "the page loads and shows the first State",
		`document.title === 'streamlimit console' && document.getElementById('status').dataset.status === 'ok' && document.body.dataset.updated !== undefined`)
	first, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.dataset.updated`))
	if err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, 10*time.Second, "the page updates", fmt.Sprintf(`document.body.dataset.updated !== %q`, first))
	waitJS(t, ctx, loading, "the three sites fresh",
		`['dev','us','ap'].every(s => { const r = document.querySelector('#sites tr[data-site="'+s+'"]'); return r && r.dataset.state === 'fresh'; })`)
	waitJS(t, ctx, loading, "bob among the top keys with the counts of us and ap",
		`(() => { const r = document.querySelector('#top tr[data-key="`+bob+`"]'); return !!r && !!r.querySelector('[data-site="us"]') && !!r.querySelector('[data-site="ap"]'); })()`)
	stopBob()

	// us stops cleanly (a leave record), ap loses Kafka without a word.
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := us.Close(cctx); err != nil {
		t.Fatalf("us: Close: %v", err)
	}
	cancel()
	apLink.Cut()

	// alice asks on and on, past her 50 per 5 s; and a client whose name is markup.
	const markup = `<img src=x onerror="window.xss=1">`
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			for _, client := range []string{"alice", "carol", markup} {
				body := fmt.Sprintf(`{"domain":"demo","descriptors":[{"entries":[{"key":"client","value":%q}]}]}`, client)
				if resp, err := http.Post(api+"/v1/check", "application/json", strings.NewReader(body)); err == nil {
					resp.Body.Close()
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	const settling = 30 * time.Second
	waitJS(t, ctx, settling, "us shown as left", `document.querySelector('#sites tr[data-site="us"]')?.dataset.state === 'left'`)
	waitJS(t, ctx, settling, "ap shown as crashed (silent while dev, on its hits topic, speaks)",
		`document.querySelector('#sites tr[data-site="ap"]')?.dataset.state === 'crashed'`)
	const alice = "demo|client=alice#5s"
	waitJS(t, ctx, settling, "alice among the recent 429s",
		`document.querySelector('#denials tr[data-key="`+alice+`"]')?.dataset.rule === 'demo.client'`)
	waitJS(t, ctx, settling, "alice among the top keys at her limit of 50 per 5 s",
		`(() => { const r = document.querySelector('#top tr[data-key="`+alice+`"]'); return !!r && r.classList.contains('limited') && r.cells[3].textContent === '50 / 5s'; })()`)
	// A soft band is shown as `rules check` shows it, in every panel, and the limit is
	// cited at the line `rules check` cites.
	const carol = "demo|client=carol#5s"
	waitJS(t, ctx, settling, "carol among the recent 429s at 20 per 5 s, soft to 22",
		`document.querySelector('#denials tr[data-key="`+carol+`"]')?.cells[4].textContent === '20 / 5s (soft to 22) site'`)
	waitJS(t, ctx, settling, "carol's rule in the rules table with its soft band, at "+carolAt[1],
		`[...document.querySelectorAll('#rules tr')].some(r => r.cells[1]?.textContent === 'client=carol' && r.cells[2].textContent === '20 / 5s (soft to 22)' && r.cells[4].textContent === '21–22' && r.cells[7].textContent === `+strconv.Quote(carolAt[1])+`)`)
	waitJS(t, ctx, settling, "denials per second above 0", `Number(document.getElementById('rate-over_limit').dataset.rate) > 0`)
	waitJS(t, ctx, settling, "the markup client among the recent 429s, as text",
		`[...document.querySelectorAll('#denials td.key')].some(td => td.textContent.includes('<img src%3Dx'))`)
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('img').length + (window.xss ? 100 : 0)`)); err != nil || n != 0 {
		t.Errorf("a key holding markup made %d img elements or ran its script (%v)", n, err)
	}

	// Once the crash hold is over, ap is still listed (until the aggregators forget it),
	// but no longer said to hold a fading reservation.
	waitJS(t, ctx, settling, "ap's crash hold shown as over",
		`(() => { const r = document.querySelector('#sites tr[data-site="ap"]'); return r?.dataset.held === 'over' && r.cells[4].textContent.includes('the crash hold is over'); })()`)

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "console.png")
	if p := os.Getenv(EnvConsoleScreenshot); p != "" {
		path = p
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)

	// Cut the page off from the enforcer: it says so, dims every panel and gives the
	// figures' age; once the enforcer answers again the page is live again.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.realFetch = window.fetch; window.fetch = () => Promise.reject(new Error('cut by the test')); true`)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, 10*time.Second, "the page says its figures are old",
		`document.body.dataset.stale === 'true' && !document.getElementById('stale').hidden && document.getElementById('stale').textContent.includes('no longer update') && getComputedStyle(document.querySelector('#sites-section')).opacity < 1`)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.fetch = window.realFetch; true`)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, 10*time.Second, "the page live again",
		`document.body.dataset.stale === undefined && document.getElementById('stale').hidden && document.getElementById('status').dataset.status === 'ok'`)

	// On a narrow screen a key wraps at its width, not one character a line.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(420, 900)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, 10*time.Second, "alice's key in at most 3 lines at 420 px",
		`(() => { const td = document.querySelector('#top tr[data-key="`+alice+`"] td'); if (!td) return false; const fs = parseFloat(getComputedStyle(td).fontSize); return td.getBoundingClientRect().height < 3.5 * 1.4 * fs; })()`)
}
