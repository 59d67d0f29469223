// Package console serves the live console of an enforcer: one page that shows the sites
// and their states, the top keys of the counts topic with their per-site counts, the
// decisions per second, the rules and the keys denied recently, updated every second.
// New makes a Console from Options; package server mounts it at /ui/ behind the same
// token as /metrics. What the page shows and how to read it: docs/operations.md,
// "Console".
package console

import (
	"cmp"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
)

//go:embed static
var static embed.FS

// StatePath is where the Handler serves the State, relative to where it is mounted.
const StatePath = "/api/state"

// Defaults of Options.
const (
	// DefaultTopKeys is Options.TopKeys when zero.
	DefaultTopKeys = 20
	// DefaultRefresh is Options.Refresh when zero: the page polls once a second.
	DefaultRefresh = 500 * time.Millisecond
)

// decisionsMetric is the counter family whose rates the console shows.
const decisionsMetric = "streamlimit_enforcer_decisions_total"

// Options configure a Console. Limiter is required.
type Options struct {
	// Limiter is the enforcer's Limiter, whose sites, snapshot, rules and recent denials
	// the console shows.
	Limiter *enforcer.Engine
	// Gatherer holds the Limiter's metrics (its Config.Registerer), from which the
	// decisions per second are read. Default nil: none are shown.
	Gatherer prometheus.Gatherer
	// TopKeys is how many keys of the counts topic are shown, those of largest count.
	// Default DefaultTopKeys.
	TopKeys int
	// Refresh is how long a State is served again before it is made anew, so that many
	// open pages cost what one does: finding the top keys is a pass over the snapshot.
	// Default DefaultRefresh.
	Refresh time.Duration
}

// Console serves the page and its State.
//
// The page is static HTML, CSS and JavaScript embedded in the binary (no framework, no
// build step); it polls one JSON document, the State, from StatePath. Every string the
// page shows that a client could have chosen (keys, descriptor values) is inserted as
// text, never as markup, and the answers forbid framing and scripts from elsewhere. It
// reads what the Limiter exposes for diagnostics (Limiter.Sites, Limiter.RecentDenials,
// the snapshot's Top and the rules) and the decision counters of the Prometheus
// registry: it adds nothing to the request path.
type Console struct {
	opts  Options
	clk   clock.Clock
	files http.Handler

	mu     sync.Mutex
	madeAt time.Time
	body   []byte // the last State, encoded

	// topKeys are the keys the last pass over the snapshot found (Snapshot.Top); until
	// topNext their counts are read again, each with a lookup, instead of another pass.
	topMu   sync.Mutex
	topKeys []string
	topNext time.Time
	// elapsed measures a pass: time.Since, in real time whatever the clock.
	elapsed func(time.Time) time.Duration
}

// TopCPUShare is the most of one core the passes over the snapshot for the top keys take:
// a pass that took d is not made again within d / TopCPUShare. A small snapshot (dev,
// tests) is passed over at every State; a million keys, a good part of a second of CPU,
// every several seconds.
const TopCPUShare = 0.05

// New returns a Console.
func New(opts Options) (*Console, error) {
	if opts.Limiter == nil {
		return nil, errors.New("console: Options.Limiter is required")
	}
	if opts.TopKeys <= 0 {
		opts.TopKeys = DefaultTopKeys
	}
	if opts.Refresh <= 0 {
		opts.Refresh = DefaultRefresh
	}
	sub, err := fs.Sub(static, "static")
	if err != nil {
		return nil, err
	}
	return &Console{opts: opts, clk: clock.Or(opts.Limiter.Config().Clock), files: http.FileServerFS(sub), elapsed: time.Since}, nil
}

// Handler serves the page at "/" (index.html, console.js, console.css) and the State at
// StatePath, with paths relative to where it is mounted (http.StripPrefix). It checks no
// token: its mount does.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+StatePath, c.serveState)
	mux.Handle("GET /", c.files)
	return secure(mux)
}

// secure sets the headers every answer of the console carries: no framing (clickjacking),
// scripts, styles and requests from the console's own origin only, no sniffing of types,
// no Referer with the page's address.
func secure(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

func (c *Console) serveState(w http.ResponseWriter, _ *http.Request) {
	body, err := c.encoded()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// encoded returns the State encoded, made anew when the last is older than Refresh.
func (c *Console) encoded() ([]byte, error) {
	now := c.clk.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.body != nil && now.Sub(c.madeAt) < c.opts.Refresh && !now.Before(c.madeAt) {
		return c.body, nil
	}
	body, err := json.Marshal(c.State(now))
	if err != nil {
		return nil, err
	}
	c.body, c.madeAt = body, now
	return body, nil
}

// State is what the page shows, as of Now. Times are unix milliseconds; durations are
// milliseconds.
type State struct {
	Now  int64  `json:"now"`
	Site string `json:"site"`
	// Snapshot is the counts topic as this enforcer follows it; nil without Kafka.
	Snapshot *SnapshotState `json:"snapshot"`
	Sites    []Site         `json:"sites"`
	// Decisions are the decision counters (cumulative: the page makes rates of them), by
	// domain, rule and result; nil without a Gatherer.
	Decisions []Decisions `json:"decisions"`
	Top       []Key       `json:"top"`
	Rules     []Rule      `json:"rules"`
	Denials   []Denial    `json:"denials"`
	// CrashHoldMs is how long after its last heartbeat a crashed site's reservation has
	// faded to nothing (enforcer.Config's SiteStaleAfter, then CrashHold); the site stays
	// listed, holding only its hits in their windows, until the aggregators forget it.
	CrashHoldMs int64 `json:"crash_hold_ms"`
}

// SnapshotState is the state of the snapshot of the counts topic.
type SnapshotState struct {
	Ready bool `json:"ready"`
	// Stale: global limits are decided on local shares (see enforcer, "Degradation").
	Stale bool  `json:"stale"`
	AgeMs int64 `json:"age_ms"`
	Keys  int   `json:"keys"`
}

// Site is one site as enforcer.SiteStatus gives it.
type Site struct {
	Site  string `json:"site"`
	State string `json:"state"`
	Self  bool   `json:"self,omitempty"`
	// Heard is when its hits were last counted (when it left, for a site that left); 0:
	// never listed by an aggregator.
	Heard int64 `json:"heard"`
	// SilentMs is how long a cut or crashed site has been silent.
	SilentMs int64 `json:"silent_ms"`
	// Peer is when another site of its data center was last heard from; 0: none.
	Peer int64 `json:"peer"`
}

// Decisions is one series of streamlimit_enforcer_decisions_total.
type Decisions struct {
	Domain string  `json:"domain"`
	Rule   string  `json:"rule"`
	Result string  `json:"result"`
	Total  float64 `json:"total"`
}

// Key is a key of the counts topic with its count, per site, and its limit.
type Key struct {
	Key      string  `json:"key"`
	Total    float64 `json:"total"`
	WindowMs int64   `json:"window_ms"`
	AsOf     int64   `json:"as_of"`
	// Sites is the per-site breakdown: each site's count and demand.
	Sites []SiteCount `json:"sites"`
	// Rule and Limit are the rule and limit the key counts for (a pool's key has a Limit
	// and no Rule); both empty when the rules in force make no such key.
	Rule  string `json:"rule,omitempty"`
	Limit *Limit `json:"limit,omitempty"`
}

// SiteCount is one site's part of a Key.
type SiteCount struct {
	Site   string  `json:"site"`
	Count  float64 `json:"count"`
	Demand float64 `json:"demand"`
}

// Limit is a limit of the rules.
type Limit struct {
	// Requests is the count the limit admits per window, soft raise included
	// (rules.Limit.CountAllowance), and Hard where its soft band begins
	// (rules.Limit.HardAllowance); they are equal without soft_percent.
	Requests int64 `json:"requests"`
	Hard     int64 `json:"hard"`
	// WindowMs is the window the count is kept over (rules.Limit.CountWindow).
	WindowMs  int64  `json:"window_ms"`
	Scope     string `json:"scope"`
	Algorithm string `json:"algorithm"`
	// SoftBand is the counts, first and last, admitted past Hard and marked soft; nil
	// without a soft band.
	SoftBand *[2]int64 `json:"soft_band,omitempty"`
	Pool     string    `json:"pool,omitempty"`
	// Line is the line of the limit's own rate_limit in its rule's file, as `rules check`
	// cites it; 0 when the limit has none of its own (the rule's line stands).
	Line int `json:"line,omitempty"`
}

// Rule is one rule of the rules in force, or a pool.
type Rule struct {
	Domain string `json:"domain"`
	// ID is the rule's ID (the rule label of the decisions); for a pool, "pool NAME".
	ID string `json:"id"`
	// Descriptor is the descriptor path, key=value/key.
	Descriptor string  `json:"descriptor"`
	File       string  `json:"file"`
	Line       int     `json:"line"`
	Shadow     bool    `json:"shadow,omitempty"`
	Unlimited  bool    `json:"unlimited,omitempty"`
	Limits     []Limit `json:"limits"`
}

// Denial is a key denied recently (enforcer.Denial).
type Denial struct {
	Time     int64  `json:"time"`
	Site     string `json:"site"`
	Domain   string `json:"domain"`
	Rule     string `json:"rule"`
	Key      string `json:"key"`
	Scope    string `json:"scope"`
	Requests int64  `json:"requests"`
	WindowMs int64  `json:"window_ms"`
}

// State returns what the page shows as of now. It costs a pass over the snapshot (the top
// keys) and a gathering of the registry.
func (c *Console) State(now time.Time) State {
	l := c.opts.Limiter
	cfg := l.Config()
	st := State{Now: now.UnixMilli(), Site: cfg.Site, Sites: []Site{}, Top: []Key{}, Rules: []Rule{}, Denials: []Denial{},
		CrashHoldMs: (cfg.SiteStaleAfter + max(cfg.CrashHold, 0)).Milliseconds()}
	for _, s := range l.Sites(now) {
		st.Sites = append(st.Sites, Site{Site: s.Site, State: s.State, Self: s.Self, Heard: unixMs(s.Heard),
			SilentMs: s.Silent.Milliseconds(), Peer: unixMs(s.Peer)})
	}
	rs := cfg.Rules()
	if sn := cfg.Snapshot; sn != nil {
		st.Snapshot = &SnapshotState{Ready: sn.Ready(), Stale: sn.StaleAt(now), AgeMs: sn.AgeAt(now).Milliseconds(), Keys: sn.Len()}
		for _, e := range c.top(sn, now) {
			k := Key{Key: e.Key, Total: e.Total, WindowMs: e.Window.Milliseconds(), AsOf: e.AsOf, Sites: make([]SiteCount, 0, len(e.Sites))}
			for _, s := range e.Sites {
				k.Sites = append(k.Sites, SiteCount{Site: s.Site, Count: s.Count, Demand: s.Demand})
			}
			if r, lim, ok := rs.LimitOfKey(e.Key); ok {
				if r != nil {
					k.Rule = r.ID
				}
				v := limitOf(lim)
				k.Limit = &v
			}
			st.Top = append(st.Top, k)
		}
	}
	if rs != nil {
		st.Rules = rulesOf(rs)
	}
	for _, d := range l.RecentDenials() {
		st.Denials = append(st.Denials, Denial{Time: d.Time.UnixMilli(), Site: d.Site, Domain: d.Domain, Rule: d.Rule,
			Key: d.Key, Scope: d.Scope.String(), Requests: d.Requests, WindowMs: d.Window.Milliseconds()})
	}
	if c.opts.Gatherer != nil {
		st.Decisions = decisions(c.opts.Gatherer)
	}
	return st
}

// top returns the top keys of sn at now: a new pass over sn when the last is old enough
// (TopCPUShare), else the keys the last pass found with their counts as of now, sorted anew.
func (c *Console) top(sn *snapshot.Snapshot, now time.Time) []snapshot.KeyEntry {
	c.topMu.Lock()
	defer c.topMu.Unlock()
	// A clock set back by more than a minute makes a pass at once too.
	if c.topKeys == nil || !now.Before(c.topNext) || now.Add(time.Minute).Before(c.topNext) {
		start := time.Now()
		es := sn.Top(c.opts.TopKeys, now)
		c.topNext = now.Add(time.Duration(float64(c.elapsed(start)) / TopCPUShare))
		c.topKeys = make([]string, len(es))
		for i := range es {
			c.topKeys[i] = es[i].Key
		}
		return es
	}
	es := make([]snapshot.KeyEntry, 0, len(c.topKeys))
	for _, k := range c.topKeys {
		if e, ok := sn.Get(k); ok && !e.Expired(now) {
			es = append(es, snapshot.KeyEntry{Key: k, Entry: e})
		}
	}
	slices.SortFunc(es, func(a, b snapshot.KeyEntry) int {
		if a.Total != b.Total {
			return cmp.Compare(b.Total, a.Total)
		}
		return strings.Compare(a.Key, b.Key)
	})
	return es
}

func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// limitOf describes lim.
func limitOf(lim *rules.Limit) Limit {
	v := Limit{Requests: lim.CountAllowance(), Hard: lim.HardAllowance(), WindowMs: lim.CountWindow().Milliseconds(),
		Scope: lim.Scope.String(), Algorithm: lim.Algorithm.String(), Line: lim.Line}
	if lim.Scope != rules.Global {
		v.WindowMs = lim.Window.Milliseconds()
	}
	if lim.SoftPercent > 0 && v.Requests > v.Hard {
		v.SoftBand = &[2]int64{v.Hard + 1, v.Requests}
	}
	if lim.Pool != nil {
		v.Pool = lim.Pool.Name
	}
	return v
}

// rulesOf lists the rules of rs in file and line order, then each domain's pools.
func rulesOf(rs *rules.Config) []Rule {
	var out []Rule
	for _, r := range rs.Rules() {
		parts := make([]string, len(r.Levels))
		for i, lv := range r.Levels {
			parts[i] = lv.Key
			if lv.Value != "" {
				parts[i] += "=" + lv.Value
			}
		}
		v := Rule{Domain: r.Domain, ID: r.ID, Descriptor: strings.Join(parts, "/"), File: r.File, Line: r.Line,
			Shadow: r.ShadowMode, Unlimited: r.Unlimited, Limits: make([]Limit, 0, len(r.Limits))}
		for i := range r.Limits {
			v.Limits = append(v.Limits, limitOf(&r.Limits[i]))
		}
		out = append(out, v)
	}
	domains := rs.Domains()
	slices.Sort(domains)
	for _, d := range domains {
		for _, pl := range rs.Pools(d) {
			out = append(out, Rule{Domain: d, ID: "pool " + pl.Name, Descriptor: "pool " + pl.Name, File: pl.File, Line: pl.Line,
				Limits: []Limit{limitOf(&pl.Limit)}})
		}
	}
	return out
}

// decisions reads the decision counters from g; none when it fails.
func decisions(g prometheus.Gatherer) []Decisions {
	mfs, _ := g.Gather() // a partial gathering still has what it could read
	out := []Decisions{}
	for _, mf := range mfs {
		if mf.GetName() != decisionsMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			d := Decisions{Total: m.GetCounter().GetValue()}
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "domain":
					d.Domain = lp.GetValue()
				case "rule":
					d.Rule = lp.GetValue()
				case "result":
					d.Result = lp.GetValue()
				}
			}
			out = append(out, d)
		}
	}
	return out
}
