package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/topics"
)

// The forgery runs' rule, a global limit of forgeLimit per forgeWindow on each user, and
// their traffic: a burst of forgeBurst requests at each enforcer on a new user, and a
// client at 80% of its limit, forgeClient requests over one window, alternating between
// the enforcers.
const (
	forgeLimit  = 100
	forgeWindow = 10 * time.Second
	forgeBurst  = 200
	forgeClient = forgeLimit * 8 / 10
	// forgeGhosts is how many made-up sites the attacker heartbeats for.
	forgeGhosts = 50
	// forgeTolerance is the most a burst may be admitted over the limit, as a fraction.
	forgeTolerance = 0.02
)

// forgeWithoutKeys makes TestKafkaForgedSiteRecords measure the attack without site keys,
// each forgery alone and all together, for docs/hardening.md's "before" figures: it logs
// them (FIGURE lines) and holds them to nothing.
var forgeWithoutKeys = flag.Bool("forge-without-keys", false, "TestKafkaForgedSiteRecords: measure the attack without site keys instead of testing it")

// forgeAttack says which forgeries the attacker writes.
type forgeAttack struct {
	// leaves: leave records for eu and us on every partition every 100 ms, from each
	// site's real instance and from a stranger, dated now and 25 s ahead.
	leaves bool
	// ghosts: heartbeats for forgeGhosts made-up sites on every partition every 400 ms,
	// every other site's signed.
	ghosts bool
	// hits: hits of the client's key in us's name, forgeLimit a record, two records every
	// 100 ms: they would leave eu no room for the client.
	hits bool
}

// forgePhase is what the traffic of one phase met.
type forgePhase struct {
	// burst is how many requests of the burst on a new user both enforcers admitted
	// together; denied how many of the client's requests (at 80% of its limit) were denied.
	burst, denied int
	// disturbed says why the phase's figures may not be the product's: the machine
	// stalled during the burst, a real site was taken as silent or a snapshot went stale
	// at a sample, a decision fell back.
	disturbed []string
}

// forgeResult is what one run measured: the same traffic without the attack (base) and
// under it.
type forgeResult struct {
	base, attack forgePhase
	// maxFresh is the most sites an enforcer took as fresh during the attack, itself
	// included; left the samples in which an enforcer took eu or us as left, of samples
	// (each enforcer's every 100 ms or so).
	maxFresh, left, samples int
	// bad is the aggregator's bad_records_total by reason at the end, every record the
	// attacker wrote read (with site keys) or once the attack stopped (without).
	bad map[string]float64
	// written is how many records the attacker wrote, acknowledged by the broker, by the
	// reason site keys refuse them for; unsure those it wrote without an acknowledgement.
	written, unsure map[string]int
}

// TestKafkaForgedSiteRecords attacks a real broker with docs/hardening.md's ACL recipe and
// site keys applied, as that page's setup gives them: one aggregator, two enforcers (sites
// eu and us, the enforcers' shared user, each with its own site's key), a global rule of
// 100 per 10 s. The attacker is logged in as the enforcers' user, so the broker lets it
// write anything to the hits topic, and has no site's key: it writes, unsigned and signed
// with a key of its own, leave records for both sites on every partition every 100 ms
// (from each site's real instance, as if it had learned its name, and from a stranger,
// dated now and 25 s ahead), heartbeats of 50 made-up sites every 400 ms, and hits of a
// client's key in us's name, which would leave eu no room for the client.
//
// The aggregator refuses every one of them, by reason (unsigned, bad_signature,
// unknown_site), and nothing changes: neither enforcer ever takes a made-up site as fresh
// or a real one as left, a burst of 200 requests at each enforcer on a new user is admitted
// at most 1.02 times the limit, as in the same run's phase before the attack, and a client
// at 80% of its limit is denied no more than in that phase. Without site keys the ghosts,
// the leaves of the real instances and the hits count (docs/hardening.md gives the
// figures).
//
// The bursts are measured from a state both enforcers agree on, each fresh to the other:
// until an enforcer has heard the other site, it takes itself for the only one and admits
// the whole limit. A bound broken in a phase in which the machine stalled during the burst,
// a real site was taken as silent by the other or a decision fell back fails as
// inconclusive, not on its figures.
func TestKafkaForgedSiteRecords(t *testing.T) {
	if *forgeWithoutKeys {
		for _, c := range []struct {
			name string
			atk  forgeAttack
		}{
			{"leaves", forgeAttack{leaves: true}},
			{"ghosts", forgeAttack{ghosts: true}},
			{"hits", forgeAttack{hits: true}},
			{"all", forgeAttack{leaves: true, ghosts: true, hits: true}},
		} {
			t.Run(c.name, func(t *testing.T) { runForgery(t, false, c.atk) })
		}
		return
	}
	r := runForgery(t, true, forgeAttack{leaves: true, ghosts: true, hits: true})
	if t.Failed() {
		return
	}
	for _, reason := range []string{"unsigned", "bad_signature", "unknown_site"} {
		if r.written[reason] == 0 {
			t.Errorf("the attacker wrote no record refused as %s", reason)
		}
		if got := r.bad[reason]; got < float64(r.written[reason]) || got > float64(r.written[reason]+r.unsure[reason]) {
			t.Errorf("bad_records_total{reason=%q} = %v, want %d (and up to %d more the broker did not acknowledge)",
				reason, got, r.written[reason], r.unsure[reason])
		}
	}
	// Refused for their signatures before anything else is looked at.
	for _, reason := range []string{"too_far_future", "stranger_leave"} {
		if got := r.bad[reason]; got != 0 {
			t.Errorf("bad_records_total{reason=%q} = %v, want 0: every forgery is refused for its signature", reason, got)
		}
	}
	if r.maxFresh != 2 {
		t.Errorf("an enforcer took %d sites as fresh during the attack, want 2 (eu and us)", r.maxFresh)
	}
	if r.left != 0 {
		t.Errorf("an enforcer took eu or us as left in %d samples during the attack, want none", r.left)
	}
	// A bound broken in a disturbed phase is inconclusive: the machine, not the product,
	// may have broken it. A phase kept to its bound passes, disturbed or not.
	failf := func(p forgePhase, format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...)
		if len(p.disturbed) > 0 {
			msg = "inconclusive: " + msg + ", in a phase set aside: " + strings.Join(p.disturbed, "; ")
		}
		t.Error(msg)
	}
	most := int(forgeLimit * (1 + forgeTolerance))
	if r.base.burst > most {
		failf(r.base, "without the attack, the burst on a new user was admitted %d times, want at most %d (limit %d)", r.base.burst, most, forgeLimit)
	}
	if r.attack.burst > most {
		failf(r.attack, "under the attack, the burst on a new user was admitted %d times, want at most %d (limit %d)", r.attack.burst, most, forgeLimit)
	}
	// What the machine alone denies the client, the phase without the attack says, unless
	// it was disturbed: then none.
	honest := r.base.denied
	if len(r.base.disturbed) > 0 {
		honest = 0
	}
	if r.attack.denied > honest {
		failf(r.attack, "under the attack, %d of the %d requests of a client at 80%% of its limit were denied, %d without it", r.attack.denied, forgeClient, r.base.denied)
	}
}

// runForgery runs the attack atk against an aggregator and two enforcers on an aclBroker,
// with site keys (the aggregator all sites', each enforcer its own) or without, after the
// same traffic without the attack, and returns what it measured. It fails t, as
// inconclusive, when the enforcers do not become fresh to each other, or do not read the
// aggregator's view of the attack, within generous bounds.
func runForgery(t *testing.T, keys bool, atk forgeAttack) forgeResult {
	testenv.RealParts(t)
	// Each site counts in its own process, whatever Redis the environment names.
	t.Setenv("STREAMLIMIT_REDIS_ADDR", "")
	stalls := testenv.StartStalls(t)
	b := startACLBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()

	siteKey := map[string][]byte{"eu": randomKey(t), "us": randomKey(t)}
	attackerKey := randomKey(t)
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	line := func(site string) string { return site + " " + hex.EncodeToString(siteKey[site]) + "\n" }
	allKeys := write("site-keys", line("eu")+line("us"))
	rules := write("rules.yaml", fmt.Sprintf("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {window: %s, requests_per_unit: %d}\n", forgeWindow, forgeLimit))

	aggArgs := []string{"aggregator", "--hits-topic", "hits", "--counts-topic", "counts", "--admin-listen", anyPort, "--log-level", "info", "--instance-id", "agg-1"}
	if keys {
		aggArgs = append(aggArgs, "--site-keys", allKeys)
	}
	aggMetrics := "http://" + serve(t, append(aggArgs, b.sec("aggregator")...)...).addr(t, "admin") + "/metrics"
	sites := []string{"eu", "us"}
	other := map[string]string{"eu": "us", "us": "eu"}
	enf := map[string]string{}
	for _, site := range sites {
		args := []string{"enforcer", "--site", site, "--rules", rules, "--hits-topic", "hits", "--counts-topic", "counts",
			"--http-listen", anyPort, "--grpc-listen", "off", "--log-level", "info", "--aggregator-instances", "agg-1"}
		if keys {
			args = append(args, "--site-keys", write(site+".key", line(site)))
		}
		enf[site] = "http://" + serve(t, append(args, b.sec("enforcer")...)...).addr(t, "http")
	}

	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 16, MaxIdleConnsPerHost: 16, IdleConnTimeout: 2 * time.Second}}
	t.Cleanup(hc.CloseIdleConnections)
	// check asks site's enforcer to decide a request of user: admitted or denied, and
	// whether the decision fell back.
	check := func(site, user string) (admitted, fallback bool, err error) {
		body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"` + user + `"}]}]}`
		resp, err := hc.Post(enf[site]+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			return false, false, err
		}
		defer resp.Body.Close()
		text, err := io.ReadAll(resp.Body)
		if err != nil {
			return false, false, err
		}
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
			return false, false, fmt.Errorf("%s: %d %s", site, resp.StatusCode, text)
		}
		return resp.StatusCode == http.StatusOK, bytes.Contains(text, []byte(`"fallback":true`)), nil
	}

	staleAfter := enforcer.Defaults().SiteStaleAfter
	// fresh reports whether both enforcers' snapshots are ready and fresh and each takes
	// the other site as fresh, heard from recently enough that it stays so for a while.
	fresh := func() bool {
		for _, site := range sites {
			s := sampleSites(site, enf[site], other[site])
			if !s.ready || s.stale || s.otherAge < 0 || s.otherAge > (staleAfter/2).Seconds() {
				return false
			}
		}
		return true
	}
	if !waitFor(60*time.Second, fresh) {
		t.Fatalf("inconclusive: the enforcers did not become fresh to each other within 60 s (stalls: %s):\neu: %+v\nus: %+v",
			stalls.Summary(time.Time{}, time.Time{}, 0), sampleSites("eu", enf["eu"], "us"), sampleSites("us", enf["us"], "eu"))
	}

	var res forgeResult
	// phase runs the traffic on new users, burstUser's burst and clientUser's client at
	// 80%, while sampling what each enforcer takes the sites to be.
	phase := func(name, burstUser, clientUser string) (p forgePhase, samples []siteSample) {
		start := time.Now()
		var mu sync.Mutex
		var fallbacks int
		count := func(admitted, fallback bool, err error, onAdmit, onDeny *int) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Errorf("%s: %v", name, err)
			case admitted:
				*onAdmit++
			default:
				*onDeny++
			}
			if fallback {
				fallbacks++
			}
		}
		stop := make(chan struct{})
		sampled := make(chan []siteSample)
		go func() {
			var ss []siteSample
			defer func() { sampled <- ss }()
			for {
				for _, site := range sites {
					ss = append(ss, sampleSites(site, enf[site], other[site]))
				}
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
		var wg sync.WaitGroup
		var burstDenied, clientAdmitted int
		var burstEnd time.Time
		var burstMu sync.Mutex
		for _, site := range sites {
			jobs := make(chan struct{}, forgeBurst)
			for range forgeBurst {
				jobs <- struct{}{}
			}
			close(jobs)
			for range 8 {
				wg.Go(func() {
					for range jobs {
						a, f, err := check(site, burstUser)
						count(a, f, err, &p.burst, &burstDenied)
					}
					burstMu.Lock()
					burstEnd = time.Now()
					burstMu.Unlock()
				})
			}
		}
		wg.Go(func() {
			// One window's forgeClient requests, evenly spaced, alternating between the
			// enforcers: a request late for its time is sent at once, never more than
			// forgeClient in any window.
			for i := range forgeClient {
				time.Sleep(time.Until(start.Add(time.Duration(i) * forgeWindow / forgeClient)))
				a, f, err := check(sites[i%2], clientUser)
				count(a, f, err, &clientAdmitted, &p.denied)
			}
		})
		wg.Wait()
		close(stop)
		samples = <-sampled
		t.Logf("%s: burst %d of %d admitted (limit %d); client at 80%%: %d of %d denied; %d decisions fell back",
			name, p.burst, 2*forgeBurst, forgeLimit, p.denied, forgeClient, fallbacks)
		if fallbacks > 0 {
			p.disturbed = append(p.disturbed, fmt.Sprintf("%d decisions fell back", fallbacks))
		}
		// A stall of the process longer than what is left of a site's freshness makes the
		// enforcers take each other as silent: each would then admit a new key's whole
		// limit.
		if stalls.Overlaps(start, burstEnd, 500*time.Millisecond) {
			p.disturbed = append(p.disturbed, "the machine stalled during the burst: "+stalls.Summary(start, burstEnd, 500*time.Millisecond).String())
		}
		for _, s := range samples {
			why := ""
			switch {
			case s.stale:
				why = s.site + "'s snapshot went stale"
			case s.otherAge > (staleAfter - 200*time.Millisecond).Seconds():
				why = fmt.Sprintf("%s heard %s %.1f s before", s.site, other[s.site], s.otherAge)
			case s.otherAge < 0 && !s.otherLeft:
				why = fmt.Sprintf("%s did not list %s", s.site, other[s.site])
			}
			if why != "" {
				// One reason is enough to set the phase aside.
				p.disturbed = append(p.disturbed, fmt.Sprintf("at %v %s", s.at.Sub(start).Round(time.Millisecond), why))
				break
			}
		}
		if len(p.disturbed) > 0 {
			t.Logf("%s: disturbed: %s", name, strings.Join(p.disturbed, "; "))
		}
		return p, samples
	}

	res.base, _ = phase("without the attack", "burst-1", "client-1")

	// The attacker learned the real sites' instance names (readable by whoever may read
	// the hits topic, which the recipe does not let the enforcers' user do).
	instance := instances(t, ctx, b.Addr(), sites)
	attacker := b.client(t, "enforcer", kgo.RecordPartitioner(kgo.ManualPartitioner()))
	clientKey := "api|user=client-2#" + fmt.Sprint(forgeWindow.Seconds()) + "s"
	actx, stopAttack := context.WithCancel(ctx)
	attacked := make(chan struct{})
	var amu sync.Mutex
	res.written, res.unsure = map[string]int{}, map[string]int{}
	go func() {
		defer close(attacked)
		for tick := 0; actx.Err() == nil; tick++ {
			now := time.Now()
			var recs []*kgo.Record
			var reasons []string
			add := func(part int32, key string, h topics.Hit, signed bool, reason string) {
				v, err := h.MarshalBinary()
				if err != nil {
					t.Errorf("attacker: %v", err)
					return
				}
				r := &kgo.Record{Topic: "hits", Partition: part, Key: []byte(key), Value: v}
				if signed {
					r.Headers = []kgo.RecordHeader{{Key: topics.HeaderSiteMAC, Value: topics.SiteMAC(attackerKey, v)}}
				} else {
					reason = "unsigned"
				}
				recs, reasons = append(recs, r), append(reasons, reason)
			}
			for part := range int32(2) {
				if atk.leaves {
					for _, site := range sites {
						for _, inst := range []string{instance[site], "forger"} {
							for _, at := range []time.Time{now, now.Add(25 * time.Second)} {
								for _, signed := range []bool{false, true} {
									add(part, topics.SiteLeaveKey, topics.Hit{Key: topics.SiteLeaveKey, Site: site, BucketStart: at.UnixMilli(), Instance: inst}, signed, "bad_signature")
								}
							}
						}
					}
				}
				if atk.ghosts && tick%4 == 0 {
					for i := range forgeGhosts {
						g := fmt.Sprintf("ghost-%02d", i)
						add(part, topics.SiteHeartbeatKey, topics.Hit{Key: topics.SiteHeartbeatKey, Site: g, BucketStart: now.UnixMilli(),
							Instance: g + "-1", Counter: "process:" + g + "-1"}, i%2 == 1, "unknown_site")
					}
				}
			}
			if atk.hits {
				part := topics.Partition([]byte(clientKey), 2)
				for _, signed := range []bool{false, true} {
					add(part, clientKey, topics.Hit{Key: clientKey, Site: "us", BucketStart: now.Truncate(100 * time.Millisecond).UnixMilli(),
						Window: forgeWindow.Milliseconds(), Count: forgeLimit}, signed, "bad_signature")
				}
			}
			results := attacker.ProduceSync(actx, recs...)
			amu.Lock()
			for i, pr := range results {
				if pr.Err == nil {
					res.written[reasons[i]]++
				} else {
					res.unsure[reasons[i]]++
				}
			}
			amu.Unlock()
			select {
			case <-actx.Done():
			case <-time.After(time.Until(now.Add(100 * time.Millisecond))):
			}
		}
	}()
	t.Cleanup(func() { stopAttack(); <-attacked })

	// The attack is under way once the aggregator refused some of it; the enforcers'
	// snapshots show what it made of it once they hold the aggregator's heartbeats written
	// after that, the leaves' emission delay (up to five emission intervals) included.
	if !waitFor(30*time.Second, func() bool {
		if !keys {
			// Without keys the forgeries need not be refused: the attack is under way once
			// the broker took some of it.
			amu.Lock()
			defer amu.Unlock()
			for _, n := range res.written {
				if n > 0 {
					return true
				}
			}
			return false
		}
		m := scrape(t, aggMetrics)
		for _, reason := range []string{"unsigned", "bad_signature", "unknown_site"} {
			if m[`streamlimit_aggregator_bad_records_total{reason="`+reason+`"}`] > 0 {
				return true
			}
		}
		return false
	}) {
		amu.Lock()
		written := fmt.Sprint(res.written)
		amu.Unlock()
		t.Fatalf("inconclusive: the attack did not reach the aggregator within 30 s: written %s; %s", written, nonZero(t, aggMetrics, "streamlimit_aggregator_bad"))
	}
	refused := time.Now()
	if !waitFor(30*time.Second, func() bool {
		for _, site := range sites {
			m := scrape(t, enf[site]+"/metrics")
			age, ok := m["streamlimit_snapshot_age_seconds"]
			if !ok || time.Now().Add(-time.Duration(age*float64(time.Second))).Before(refused.Add(500*time.Millisecond)) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("inconclusive: the enforcers' snapshots did not catch up with the attack within 30 s (stalls: %s)", stalls.Summary(refused, time.Time{}, 0))
	}

	var samples []siteSample
	res.attack, samples = phase("under the attack", "burst-2", "client-2")
	res.samples = len(samples)
	for _, s := range samples {
		res.maxFresh = max(res.maxFresh, int(s.fresh))
		if s.left > 0 || s.otherLeft {
			res.left++
		}
	}
	stopAttack()
	<-attacked

	// Every record the attacker wrote is read and refused.
	bad := func() map[string]float64 {
		m := scrape(t, aggMetrics)
		out := map[string]float64{}
		for k, v := range m {
			if reason, ok := strings.CutPrefix(k, `streamlimit_aggregator_bad_records_total{reason="`); ok && v != 0 {
				out[strings.TrimSuffix(reason, `"}`)] = v
			}
		}
		return out
	}
	waitFor(30*time.Second, func() bool {
		res.bad = bad()
		if !keys {
			return true
		}
		for reason, n := range res.written {
			if res.bad[reason] < float64(n) {
				return false
			}
		}
		return true
	})
	t.Logf("FIGURE forged site records (site keys %v, attack %+v): burst on a new user %d then %d of %d admitted (limit %d); "+
		"client at 80%%: %d then %d of %d denied; most sites fresh under the attack %d, eu or us left in %d of %d samples; "+
		"written %v (unacknowledged %v); refused %v",
		keys, atk, res.base.burst, res.attack.burst, 2*forgeBurst, forgeLimit, res.base.denied, res.attack.denied, forgeClient,
		res.maxFresh, res.left, res.samples, res.written, res.unsure, res.bad)
	return res
}

// siteSample is what one enforcer took the sites to be, from its metrics.
type siteSample struct {
	at   time.Time
	site string // the enforcer's
	// ready and stale: its snapshot's readiness and staleness.
	ready, stale bool
	// fresh and left: the sites it takes as fresh (itself included) and as left.
	fresh, left float64
	// otherAge is how long ago the other real site was heard from, -1 when not listed;
	// otherLeft whether it is listed as left.
	otherAge  float64
	otherLeft bool
}

// sampleSites reads what site's enforcer, serving at base, takes the sites to be; a
// scrape that fails reads as a snapshot not ready. It may be called from any goroutine.
func sampleSites(site, base, other string) siteSample {
	m := map[string]float64{}
	if resp, err := http.Get(base + "/metrics"); err == nil {
		m = parseMetrics(resp.Body)
		resp.Body.Close()
	}
	s := siteSample{at: time.Now(), site: site, ready: m["streamlimit_snapshot_ready"] == 1, stale: m["streamlimit_snapshot_stale"] != 0,
		fresh: m[`streamlimit_enforcer_sites{state="fresh"}`], left: m[`streamlimit_enforcer_sites{state="left"}`], otherAge: -1,
		otherLeft: m[`streamlimit_snapshot_site_left{site="`+other+`"}`] == 1}
	if age, ok := m[`streamlimit_snapshot_site_age_seconds{site="`+other+`"}`]; ok {
		s.otherAge = age
	}
	return s
}

// instances reads the hits topic at brokers (the admin's listener) until it has found a
// heartbeat of each of sites, and returns their instances by site.
func instances(t *testing.T, ctx context.Context, brokers string, sites []string) map[string]string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics("hits"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	found := map[string]string{}
	for len(found) < len(sites) {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("the sites' heartbeats not found in the hits topic within 30 s: found %v", found)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if h, err := topics.DecodeHit(r.Value); err == nil && h.IsSiteHeartbeat() && h.Instance != "" {
				found[h.Site] = h.Instance
			}
		})
	}
	return found
}

// waitFor calls cond until it returns true, every 100 ms, for at most timeout, and
// returns whether it did.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// randomKey returns a new site key.
func randomKey(t *testing.T) []byte {
	t.Helper()
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}
