package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/streamlimit/streamlimit/internal/envoyfilter"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/server"
)

// The RLQS test's rule: a global limit large enough that every one of 60 Envoys holds a
// few requests of it per reporting interval.
const (
	rlqsLimit    = 1200
	rlqsWindow   = 10 * time.Second
	rlqsWindows  = 5 // measured after the first
	rlqsEnvoys   = 20
	rlqsInterval = envoyfilter.ReportInterval // Envoy's fixed report timer
)

// TestRLQSMultiDC runs the three data centers of TestMultiDC on the real broker, each
// enforcer serving Envoy's Rate Limit Quota Service, and 20 Envoys per data center (the
// filter model over real gRPC streams, split over the data center's enforcers) that decide
// every request locally on their assignments and report every 5 s, as Envoy does. One
// heavy client sends 5× its global limit spread over all 60 Envoys; 30 light clients stay
// far under theirs, each at its home Envoy. The heavy client's admissions in every sliding window
// after the first must stay within 1.05 × the limit (and above 0.4 ×, a floor that an
// RLQS server assigning nothing would fail); light clients are never denied.
func TestRLQSMultiDC(t *testing.T) {
	tp := startTopology(t, topologyOptions{brokers: testenv.Brokers(t), rules: rulesYAML(rlqsLimit, rlqsWindow),
		customize: func(c *server.Config) {
			c.RLQSAddr = "127.0.0.1:0"
			c.RLQS.ReportingInterval = rlqsInterval
		}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// 20 Envoys per data center, spread over its enforcers.
	var envoys []*envoyfilter.Conn
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	bySite := map[string][]*node{}
	var siteNames []string
	for _, n := range tp.nodes {
		if bySite[n.site] == nil {
			siteNames = append(siteNames, n.site)
		}
		bySite[n.site] = append(bySite[n.site], n)
	}
	for _, site := range siteNames {
		for i := range rlqsEnvoys {
			n := bySite[site][i%len(bySite[site])]
			cc, err := grpc.NewClient(n.srv.RLQSAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			c := envoyfilter.NewConn(ctx, envoyfilter.New(envoyfilter.Options{Domain: domain}), cc, nil)
			wg.Go(func() { _ = c.Run(ctx) })
			envoys = append(envoys, c)
		}
	}

	// The schedule: Poisson arrivals, the heavy client's on a random Envoy each.
	type arrival struct {
		at     time.Duration
		envoy  int
		client int // 0: heavy; 1..: light
	}
	end := time.Duration(1+rlqsWindows) * rlqsWindow
	rng := rand.New(rand.NewPCG(1, 2))
	var plan []arrival
	poisson := func(perSec float64, client int, place func() int) {
		for x := rng.ExpFloat64() / perSec; x < end.Seconds(); x += rng.ExpFloat64() / perSec {
			plan = append(plan, arrival{at: time.Duration(x * float64(time.Second)), envoy: place(), client: client})
		}
	}
	heavyRate := 5 * rlqsLimit / rlqsWindow.Seconds()
	poisson(heavyRate, 0, func() int { return rng.IntN(len(envoys)) })
	const lights = 30
	lightRate := 0.02 * rlqsLimit / rlqsWindow.Seconds()
	for c := 1; c <= lights; c++ {
		home := rng.IntN(len(envoys))
		poisson(lightRate, c, func() int { return home })
	}
	slices.SortFunc(plan, func(a, b arrival) int { return int(a.at - b.at) })

	s := envoyfilter.Settings{ReportingInterval: rlqsInterval}
	var heavy []time.Duration
	var heavyReqs, lightReqs, lightDenied int
	late := time.Duration(0)
	start := time.Now()
	for _, a := range plan {
		if !sleepUntil(ctx, start.Add(a.at)) {
			break
		}
		late = max(late, time.Since(start)-a.at)
		id := map[string]string{"user": "heavy"}
		if a.client > 0 {
			id["user"] = fmt.Sprintf("light-%02d", a.client)
		}
		// The decision is local: its instant is the arrival's.
		at := time.Since(start)
		ok := envoys[a.envoy].Decide(id, s)
		if a.client == 0 {
			heavyReqs++
			if ok {
				heavy = append(heavy, at)
			}
		} else {
			lightReqs++
			if !ok {
				lightDenied++
			}
		}
	}
	var reports, dropped, responses int
	for _, e := range envoys {
		st := e.Stats()
		reports, dropped, responses = reports+st.Reports, dropped+st.Dropped, responses+st.Responses
	}
	all := sliding(heavy, rlqsWindow, rlqsWindow, end)
	cold := sliding(heavy, rlqsWindow, 0, 2*rlqsWindow)
	t.Logf("FIGURE rlqs-e2e: 3 data centers × %d Envoys reporting every %v, heavy client at 5× (%.0f/s): %d requests, %d admitted; per %v window after the first: %s",
		rlqsEnvoys, rlqsInterval, heavyRate, heavyReqs, len(heavy), rlqsWindow, all)
	t.Logf("FIGURE rlqs-e2e: max %.3f× and min %.3f× the limit %d; first windows (not asserted): %s; light clients: %d requests, %d denied; Envoys: %d reports, %d dropped, %d responses; schedule lag up to %v",
		float64(all.max)/rlqsLimit, float64(all.min)/rlqsLimit, rlqsLimit, cold, lightReqs, lightDenied, reports, dropped, responses, late)
	if float64(all.max) > 1.05*rlqsLimit {
		t.Errorf("heavy client admitted %d in a window, above 1.05 × %d", all.max, rlqsLimit)
	}
	if float64(all.min) < 0.4*rlqsLimit {
		t.Errorf("heavy client admitted only %d in a window, below 0.4 × %d", all.min, rlqsLimit)
	}
	if lightDenied > 0 {
		t.Errorf("%d of %d light-client requests denied", lightDenied, lightReqs)
	}
	if late > time.Second {
		t.Errorf("the schedule ran up to %v late: the machine is too loaded for the test to mean anything", late)
	}
	allowed := sumNodes(t, tp.nodes, "streamlimit_rlqs_allowed_requests_total")
	t.Logf("FIGURE rlqs-e2e: the enforcers counted %.0f reported admissions (all clients)", allowed)
}
