package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

// The rule of TestSiteLeave: 3 requests per minute per client, global (the default scope).
const (
	leaveLimit = 3
	leaveRules = "domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"
	// leaveTarget is how soon after a site leaves cleanly a client the sites never saw
	// gets the whole limit at the site that stays.
	leaveTarget = time.Second
	// leaveRounds is how often b leaves (and is started again) for the figure.
	leaveRounds = 3
)

// TestSiteLeave runs, on the real broker, an aggregator and two enforcers a and b of the
// built binary (`streamlimit aggregator`, `streamlimit enforcer --site a|b`) sharing one hits
// topic, rule `client` 3 per minute. b serves one request and is stopped with SIGTERM: it
// writes its leave records and exits. A client never seen anywhere then asks a three times:
//
//   - 5 s after the SIGTERM, all 3 are admitted and none is marked "fallback" (before sites
//     could leave, a still took b for a site that might spend its share: 1 of 3, and
//     marked fallback);
//   - from the SIGTERM on, a new client every 50 ms: the first that gets all 3 times how
//     soon after the leave a gets the whole limit back, asserted within leaveTarget of b's
//     exit; while b was live the same probe got 1 or 2 (a's default share, half the limit).
//
// b is started again under its name and leaves leaveRounds times in all; a's metrics must
// list it as left (not crashed or cut) each time, and no decision as a fallback. Last, b is
// killed with SIGKILL: a takes it for crashed, and the time until a new client gets the
// whole limit is logged beside the leave's (a crash is known only once b has been silent
// for topics.SiteSilentAfter).
func TestSiteLeave(t *testing.T) {
	testenv.RealParts(t)
	binary := buildStreamlimitAsync(t)
	brokers := testenv.Kafka(t)
	hits := testenv.CreateTopic(t, "hits", 2, nil)
	counts := testenv.CreateTopic(t, "counts", 1, compacted())
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rulesPath, leaveRules)
	bin := binary()

	agg := newProc(t, bin, "aggregator", "aggregator", "--brokers", brokers, "--hits-topic", hits,
		"--counts-topic", counts, "--group", testenv.TopicName(t, "group"), "--admin-listen", anyPort, "--log-level", "warn")
	enforcerProc := func(site string) *proc {
		return newProc(t, bin, "enforcer "+site, "enforcer", "--site", site, "--brokers", brokers,
			"--hits-topic", hits, "--counts-topic", counts, "--rules", rulesPath, "--rules-reload-interval", "200ms",
			"--http-listen", anyPort, "--grpc-listen", "off", "--log-level", "info")
	}
	a, b := enforcerProc("a"), enforcerProc("b")
	for _, p := range []*proc{agg, a, b} {
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*proc{agg, a, b} {
		if err := p.waitReady(90 * time.Second); err != nil {
			t.Fatal(err)
		}
	}

	clients := atomic.Int64{}
	newClient := func() string { return fmt.Sprintf("new-%d-%d", time.Now().UnixNano(), clients.Add(1)) }
	var fallbacks int
	// ask sends n requests of client to p, one after the other, and returns how many were
	// admitted; answers marked fallback are counted.
	ask := func(p *proc, client string, n int) int {
		t.Helper()
		admitted := 0
		for range n {
			ok, fb, err := checkOnce(p.addr(), "api", "client", client)
			if err != nil {
				t.Fatalf("%s: %v", p.name, err)
			}
			if fb {
				fallbacks++
			}
			if ok {
				admitted++
			}
		}
		return admitted
	}
	// aSees waits until a's global decisions take the sites to be in the states want
	// (streamlimit_enforcer_sites), and returns how long that took.
	aSees := func(timeout time.Duration, want map[string]float64) time.Duration {
		t.Helper()
		start := time.Now()
		eventually(t, timeout, fmt.Sprintf("enforcer a taking the sites as %v", want), func() bool {
			ms, err := a.metrics()
			if err != nil {
				return false
			}
			for state, n := range want {
				if metric(ms, "streamlimit_enforcer_sites", "state", state) != n {
					return false
				}
			}
			return true
		})
		return time.Since(start)
	}

	var fromExit, fromTerm []time.Duration
	for round := range leaveRounds {
		if round > 0 {
			if err := b.start(); err != nil {
				t.Fatal(err)
			}
			if err := b.waitReady(60 * time.Second); err != nil {
				t.Fatal(err)
			}
		}
		// b serves one request, and a hears from both sites.
		if got := ask(b, newClient(), 1); got != 1 {
			t.Fatalf("round %d: b admitted %d of a first request", round, got)
		}
		aSees(60*time.Second, map[string]float64{"fresh": 2, "left": 0, "crashed": 0, "cut": 0})
		// While b is live, a spends only its default share of a key it never saw: the probe
		// below cannot get the whole limit before b has left.
		if got := ask(a, newClient(), leaveLimit); got >= leaveLimit {
			t.Fatalf("round %d: with b live, a new client got %d of %d at a; the probe would not tell a leave", round, got, leaveLimit)
		} else if round == 0 {
			t.Logf("FIGURE site-leave: with b live, a new client gets %d of %d at a (a's default share: half)", got, leaveLimit)
		}

		term := time.Now()
		type stopped struct {
			at  time.Time
			err error
		}
		exit := make(chan stopped, 1)
		go func() {
			at, err := b.stop(30 * time.Second)
			exit <- stopped{at, err}
		}()
		var whole time.Time
		probes := 0
		for deadline := term.Add(20 * time.Second); whole.IsZero(); {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: no new client got the whole limit at a within 20 s of b's SIGTERM (%d probes)", round, probes)
			}
			started := time.Now()
			probes++
			if ask(a, newClient(), leaveLimit) == leaveLimit {
				whole = started
				break
			}
			time.Sleep(time.Until(started.Add(50 * time.Millisecond)))
		}
		st := <-exit
		if st.err != nil {
			t.Fatalf("round %d: %v", round, st.err)
		}
		if n := strings.Count(b.out.String(), "producer: left"); n != round+1 {
			t.Errorf("round %d: b logged %d leaves in %d clean stops", round, n, round+1)
		}
		fromTerm = append(fromTerm, whole.Sub(term))
		fromExit = append(fromExit, whole.Sub(st.at))
		t.Logf("FIGURE site-leave: round %d: SIGTERM → b exited in %v; a new client got the whole limit at a %v after b's exit (%v after the SIGTERM, %d probes)",
			round, st.at.Sub(term).Round(time.Millisecond), whole.Sub(st.at).Round(time.Millisecond), whole.Sub(term).Round(time.Millisecond), probes)
		aSees(10*time.Second, map[string]float64{"fresh": 1, "left": 1, "crashed": 0, "cut": 0})
		ms, err := a.metrics()
		if err != nil {
			t.Fatal(err)
		}
		if v := metric(ms, "streamlimit_snapshot_site_left", "site", "b"); v != 1 {
			t.Errorf("round %d: a's streamlimit_snapshot_site_left{site=\"b\"} = %v, want 1", round, v)
		}

		if round == 0 {
			// The reproduction: 5 s after b's SIGTERM, a client never seen anywhere.
			time.Sleep(time.Until(term.Add(5 * time.Second)))
			before := fallbacks
			if got := ask(a, newClient(), leaveLimit); got != leaveLimit || fallbacks != before {
				t.Errorf("5 s after b left: a new client got %d of %d at a, %d answers marked fallback; want %d, none",
					got, leaveLimit, fallbacks-before, leaveLimit)
			} else {
				t.Logf("FIGURE site-leave: 5 s after b's SIGTERM a new client got %d of %d at a, none marked fallback", got, leaveLimit)
			}
		}
	}

	// A crash for comparison: no leave record; a new client gets the whole limit once a
	// takes b as crashed (silent while a, on the same source, still speaks).
	if err := b.start(); err != nil {
		t.Fatal(err)
	}
	if err := b.waitReady(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	ask(b, newClient(), 1)
	aSees(60*time.Second, map[string]float64{"fresh": 2, "left": 0})
	kill := time.Now()
	b.kill()
	var crashWhole time.Duration
	for deadline := kill.Add(30 * time.Second); ; {
		if time.Now().After(deadline) {
			t.Fatalf("no new client got the whole limit at a within 30 s of b's crash")
		}
		started := time.Now()
		if ask(a, newClient(), leaveLimit) == leaveLimit {
			crashWhole = started.Sub(kill)
			break
		}
		time.Sleep(time.Until(started.Add(50 * time.Millisecond)))
	}
	aSees(10*time.Second, map[string]float64{"fresh": 1, "crashed": 1, "left": 0})

	ms, err := a.metrics()
	if err != nil {
		t.Fatal(err)
	}
	if v := metric(ms, "streamlimit_enforcer_fallback_decisions_total"); v != 0 || fallbacks != 0 {
		t.Errorf("a made %v fallback decisions (%d answers marked fallback); nothing was degraded", v, fallbacks)
	}
	med := func(ds []time.Duration) time.Duration { s := slices.Clone(ds); slices.Sort(s); return s[len(s)/2] }
	t.Logf("FIGURE site-leave: after a clean leave a new client gets the whole limit %v after b's exit (median of %d; %v–%v), %v after its SIGTERM (%v–%v); after a crash, %v after the SIGKILL (a site is taken as silent after %v)",
		med(fromExit).Round(time.Millisecond), len(fromExit), slices.Min(fromExit).Round(time.Millisecond), slices.Max(fromExit).Round(time.Millisecond),
		med(fromTerm).Round(time.Millisecond), slices.Min(fromTerm).Round(time.Millisecond), slices.Max(fromTerm).Round(time.Millisecond),
		crashWhole.Round(time.Millisecond), topics.SiteSilentAfter)
	if m := med(fromExit); m > leaveTarget {
		t.Errorf("after a clean leave a new client got the whole limit %v after b's exit (median of %d), later than %v", m, len(fromExit), leaveTarget)
	}
}

// checkOnce asks the enforcer at addr once for one descriptor (key=value) of domain and
// returns whether it admitted the request and whether any status was marked fallback. An
// answer whose status is not its decision's (200 admitted, 429 denied) is an error.
func checkOnce(addr, domain, key, value string) (admitted, fallback bool, err error) {
	body := fmt.Sprintf(`{"domain":%q,"descriptors":[{"entries":[{"key":%q,"value":%q}]}]}`, domain, key, value)
	resp, err := http.Post("http://"+addr+"/v1/check", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		return false, false, err
	}
	defer resp.Body.Close()
	var reply checkReply
	if err := json.NewDecoder(resp.Body).Decode(&reply); err != nil {
		return false, false, fmt.Errorf("decoding the check response: %w", err)
	}
	admitted = reply.OverallCode == "OK"
	for _, s := range reply.Statuses {
		fallback = fallback || s.Fallback
	}
	if want := map[bool]int{true: http.StatusOK, false: http.StatusTooManyRequests}[admitted]; resp.StatusCode != want {
		return admitted, fallback, fmt.Errorf("answered %s for overall code %s", resp.Status, reply.OverallCode)
	}
	return admitted, fallback, nil
}

// TestSiteRestart restarts an enforcer under its name, as a rolling restart does, while a
// client under its limit uses it: on the real broker, an aggregator and two enforcers a and
// b of the built binary sharing one hits topic, rule `user` 100 per 5 s; the client sends
// 0.6 × its limit, alternately to a and b. Once the first window is past, b is stopped with
// SIGTERM (its requests go to a meanwhile) and started again 1 s later. An exact limiter
// refuses nothing of this client, and the restart is no conflict: the old b left before the
// new one started. The test asserts both:
//
//   - no request of the client is refused. The restarted b gives its counter what the
//     snapshot shows of b's hits of the key, and must neither take them for hits the other
//     site has not seen yet (which lowered its cap at its first decision) nor keep them a
//     whole window after the snapshot has seen the real ones leave (which refused the
//     client late in the window): both refused a few requests of every restart before;
//   - neither enforcer reports b as announced by two instances counting apart
//     (streamlimit_snapshot_site_conflicts, and the error b logs): the aggregator forgets an
//     instance at its leave record, not 10 s after its last heartbeat.
func TestSiteRestart(t *testing.T) {
	testenv.RealParts(t)
	binary := buildStreamlimitAsync(t)
	brokers := testenv.Kafka(t)
	hits := testenv.CreateTopic(t, "hits", 2, nil)
	counts := testenv.CreateTopic(t, "counts", 1, compacted())
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, rulesPath, rulesYAML(ruleLimit, ruleWindow))
	bin := binary()

	agg := newProc(t, bin, "aggregator", "aggregator", "--brokers", brokers, "--hits-topic", hits,
		"--counts-topic", counts, "--group", testenv.TopicName(t, "group"), "--admin-listen", anyPort, "--log-level", "warn")
	var ps []*mcProc
	for _, site := range []string{"a", "b"} {
		ps = append(ps, &mcProc{site: site, proc: newProc(t, bin, "enforcer "+site, "enforcer", "--site", site,
			"--brokers", brokers, "--hits-topic", hits, "--counts-topic", counts, "--rules", rulesPath,
			"--rules-reload-interval", "200ms", "--http-listen", anyPort, "--grpc-listen", "off", "--log-level", "info")})
	}
	a, b := ps[0], ps[1]
	for _, p := range []*proc{agg, a.proc, b.proc} {
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
	}
	if err := agg.waitReady(90 * time.Second); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if err := p.waitReady(60 * time.Second); err != nil {
			t.Fatal(err)
		}
		if _, err := waitState(context.Background(), p, "fresh", 2, time.Now().Add(60*time.Second)); err != nil {
			t.Fatal(err)
		}
		p.live.Store(true)
	}

	const (
		restartAt = ruleWindow + lagAllowance
		end       = restartAt + 3*ruleWindow
	)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), end)
	defer cancel()
	var events sync.WaitGroup
	var conflicts atomic.Int64 // most sites a took as in conflict
	events.Go(func() {
		for sleepUntil(ctx, time.Now().Add(250*time.Millisecond)) {
			if ms, err := a.metrics("streamlimit_snapshot_site_conflicts"); err == nil {
				if v := int64(metric(ms, "streamlimit_snapshot_site_conflicts")); v > conflicts.Load() {
					conflicts.Store(v)
				}
			}
		}
	})
	var restarted time.Duration
	events.Go(func() {
		if !sleepUntil(ctx, start.Add(restartAt)) {
			return
		}
		if err := stopProc(b); err != nil {
			t.Error(err)
			return
		}
		time.Sleep(time.Second)
		if err := startProc(b); err != nil {
			t.Error(err)
		}
		restarted = time.Since(start)
	})
	d := &mcDC{procs: ps}
	pool := newCheckPool()
	defer pool.close()
	client := mcClient{name: "light", rate: 0.6 * ruleLimit / ruleWindow.Seconds(), dcAt: func(time.Duration, int) int { return 0 }}
	rs := runClients(ctx, start, []mcClient{client}, func(name string, _ int, sent time.Duration) result {
		r := result{client: name, sent: sent}
		p := d.pick()
		if p == nil {
			r.recv, r.err = time.Since(start), errors.New("no enforcer in rotation")
			return r
		}
		r.site = p.site
		r.status, r.admitted, r.fallback, r.err = pool.check(p.addr(), checkRequest(name))
		r.recv = time.Since(start)
		return r
	})
	events.Wait()

	var refused []string
	var failed int
	for _, r := range rs {
		switch {
		case r.err != nil || !r.answered():
			failed++
		case r.sent >= ruleWindow && !r.admitted:
			refused = append(refused, fmt.Sprintf("%.2fs@%s", r.sent.Seconds(), r.site))
		}
	}
	t.Logf("FIGURE site-restart: b stopped at %.1fs and ready again at %.1fs; %d requests of a client at 0.6 × its limit after the first window, %d refused (%s), %d failed",
		restartAt.Seconds(), restarted.Seconds(), len(rs), len(refused), strings.Join(refused, " "), failed)
	if failed > 0 {
		t.Errorf("%d of %d requests failed or were not answered as decided", failed, len(rs))
	}
	if len(refused) > 0 {
		t.Errorf("a client at 0.6 × its limit was refused %d times after b restarted under its name (at %s); an exact limiter refuses none",
			len(refused), strings.Join(refused, " "))
	}
	logs := strings.Count(a.out.String(), "count it apart") + strings.Count(a.out.String(), "counts it apart") +
		strings.Count(b.out.String(), "count it apart") + strings.Count(b.out.String(), "counts it apart")
	if n := conflicts.Load(); n > 0 || logs > 0 {
		t.Errorf("b restarted under its name after a clean leave was taken for two instances counting apart: a's streamlimit_snapshot_site_conflicts reached %d, %d such errors logged", n, logs)
	}
}
