package demo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// Kind is the behaviour of a synthetic client.
type Kind uint8

const (
	// Light clients send well under the limit, always to their home site.
	Light Kind = iota
	// Abusive clients send several times the limit, spread evenly over every site.
	Abusive
	// Burst clients send a short burst of several times the limit to one site.
	Burst
)

// String returns "light", "abusive" or "burst".
func (k Kind) String() string {
	switch k {
	case Light:
		return "light"
	case Abusive:
		return "abusive"
	case Burst:
		return "burst"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// The traffic mix, as multiples of the limit per window.
const (
	lightLoad    = 0.2 // each light client: 20% of the limit
	abusiveLoad  = 5   // the abusive client: 5× the limit
	burstSize    = 3   // the burst: 3× the limit ...
	burstSpacing = 5 * time.Millisecond
	burstAt      = 0.4 // ... starting at 40% of the run
)

// clientPlan is one synthetic client's schedule.
type clientPlan struct {
	name     string
	kind     Kind
	home     int // site index, or -1 for all sites in turn
	start    time.Duration
	interval time.Duration // mean time between requests
	jitter   bool          // intervals uniform in [0.5, 1.5] × interval
	count    int           // requests to send; 0 means until the end
	req      enforcer.Request
	key      string // counter key of the limit
}

// plan is the whole synthetic workload.
type plan struct {
	clients []clientPlan
	abusive int // index of the abusive client
	limit   int64
	window  time.Duration
	sites   int
	seed    uint64
}

func newPlan(rcfg *rules.Config, opts Options) (*plan, error) {
	p := &plan{sites: opts.Sites, seed: opts.Seed}
	add := func(name string, kind Kind, home int) *clientPlan {
		entries := []rules.Entry{{Key: "client", Value: name}}
		c := clientPlan{name: name, kind: kind, home: home,
			req: enforcer.Request{Domain: Domain, Descriptors: [][]rules.Entry{entries}}}
		if r := rcfg.Match(Domain, entries); r != nil && len(r.Limits) > 0 {
			c.key = r.Key(entries, 0)
			if p.limit == 0 {
				p.limit, p.window = r.Limits[0].Requests, r.Limits[0].Window
			}
		}
		p.clients = append(p.clients, c)
		return &p.clients[len(p.clients)-1]
	}
	for i, name := range []string{"alice", "bob", "carol", "dave", "erin"} {
		add(name, Light, i%opts.Sites)
	}
	p.abusive = len(p.clients)
	add("mallory", Abusive, -1)
	add("batch-job", Burst, opts.Sites-1)
	if p.limit <= 0 || p.window <= 0 {
		return nil, errors.New("demo: the embedded rules set no limit on the client descriptor")
	}
	if opts.Duration <= p.window {
		return nil, fmt.Errorf("demo: duration %v must exceed the limit's window %v", opts.Duration, p.window)
	}
	perWindow := func(load float64) time.Duration {
		return time.Duration(float64(p.window) / (load * float64(p.limit)))
	}
	for i := range p.clients {
		c := &p.clients[i]
		switch c.kind {
		case Light:
			c.interval, c.jitter = perWindow(lightLoad), true
		case Abusive:
			c.interval = perWindow(abusiveLoad)
		case Burst:
			c.interval = burstSpacing
			c.count = int(burstSize * p.limit)
			c.start = time.Duration(burstAt * float64(opts.Duration))
		}
	}
	return p, nil
}

// drive sends client i's requests until its count is done or ctx is done, recording every
// decision. Requests are paced on an absolute schedule; after a stall (a loaded machine)
// the schedule restarts from now instead of catching up in a burst.
func (p *plan) drive(ctx context.Context, i int, sites []*site, rec *recorder) {
	c := p.clients[i]
	r := rand.New(rand.NewPCG(p.seed, uint64(i)))
	next := rec.start.Add(c.start)
	if c.jitter { // a random phase, so that light clients do not tick together
		next = next.Add(time.Duration(r.Float64() * float64(c.interval)))
	}
	turn := r.IntN(len(sites))
	t := time.NewTimer(time.Until(next))
	defer t.Stop()
	var res enforcer.Result
	for n := 0; c.count == 0 || n < c.count; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s := c.home
		if s < 0 {
			s, turn = turn, (turn+1)%len(sites)
		}
		sites[s].lim.DecideInto(ctx, c.req, &res)
		rec.add(i, s, res.Code == enforcer.CodeOK)

		d := c.interval
		if c.jitter {
			d = time.Duration((0.5 + r.Float64()) * float64(c.interval))
		}
		next = next.Add(d)
		now := time.Now()
		if now.Sub(next) > c.interval {
			next = now
		}
		t.Reset(next.Sub(now))
	}
}

// decision is one recorded decision.
type decision struct {
	at     time.Duration // since the start of traffic
	client uint8
	site   uint8
	ok     bool
}

// recorder keeps every decision of the run. It is safe for simultaneous use.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	log   []decision
	// Running totals for the status output, [admitted, denied].
	bySite   [][2]int64
	byClient [][2]int64
}

func newRecorder(p *plan, sites int) *recorder {
	return &recorder{
		bySite:   make([][2]int64, sites),
		byClient: make([][2]int64, len(p.clients)),
		log:      make([]decision, 0, 1<<14),
	}
}

// begin marks the start of traffic. It is called before any add.
func (r *recorder) begin() { r.start = time.Now() }

func (r *recorder) add(client, site int, ok bool) {
	at := time.Since(r.start)
	v := 1
	if ok {
		v = 0
	}
	r.mu.Lock()
	r.log = append(r.log, decision{at: at, client: uint8(client), site: uint8(site), ok: ok})
	r.bySite[site][v]++
	r.byClient[client][v]++
	r.mu.Unlock()
}

// elapsed returns the time since the start of traffic.
func (r *recorder) elapsed() time.Duration { return time.Since(r.start) }

// admittedIn counts client's admissions in (from, to]. The log is in nearly increasing
// time order (goroutines take the time before the lock), so the scan from the end stops a
// second before from.
func (r *recorder) admittedIn(client int, from, to time.Duration) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for i := len(r.log) - 1; i >= 0; i-- {
		d := r.log[i]
		if d.at < from-time.Second {
			break
		}
		if int(d.client) == client && d.ok && d.at > from && d.at <= to {
			n++
		}
	}
	return n
}

// totals returns copies of the running totals.
func (r *recorder) totals() (bySite, byClient [][2]int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][2]int64(nil), r.bySite...), append([][2]int64(nil), r.byClient...)
}

// admissions returns the admission times of client.
func (r *recorder) admissions(client int) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var at []time.Duration
	for _, d := range r.log {
		if int(d.client) == client && d.ok {
			at = append(at, d.at)
		}
	}
	return at
}
