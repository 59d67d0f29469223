package enforcer

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// Publisher publishes the admitted hits of global limits to the hits topic, and the
// requests this site denied (its demand, by which sites share a hot key's room). It must
// never block. *producer.Producer implements it.
type Publisher interface {
	Hit(key string, window time.Duration, n int)
	Denied(key string, window time.Duration, n int)
}

// SiteStore decides site-scope limits for all enforcers of one site. It never fails: when
// its backend does, it decides in process and reports fellBack. *sitestore.Store
// implements it.
type SiteStore interface {
	AllowAll(ctx context.Context, now time.Time, ops []algo.Op, out []algo.Decision) (allowed, fellBack bool)
}

// Tuning is what a deployment may tune of an Engine: the global decision's settings and the
// bounds of its own structures. Config embeds it, and so do the configurations that
// assemble an Engine (package streamlimit's, the enforcer server's), so that a setting
// added here reaches every layer. Zero fields take Defaults.
type Tuning struct {
	// SubBuckets is the number of sub-buckets windows are split into, as the aggregators
	// split them. Default: Defaults (window.DefaultSubBuckets).
	SubBuckets int
	// MinShare is the smallest share of a hot key's room a data center's fresh sites may
	// hold together (the sites heard on one hits topic; see docs/decisions.md,
	// "Global limits"), so that a data center the snapshot does not show yet — where a
	// client has just arrived — is not shut out for the pipeline's lag. Default:
	// Defaults.
	MinShare float64
	// DefaultShare is a site's share of a global limit for a key the snapshot has never
	// shown (new, or idle for a whole window). Default 0: 1/the number of sites that may
	// spend it — the live ones and those cut off from here, not those that left or crashed,
	// nor, once this site has served, those no count has shown serving (docs/sites.md)
	// (1 without a snapshot).
	DefaultShare float64
	// ShareDamping holds back part of a hot key's room: the fresh sites of a data center
	// whose share of the room is f may spend f / (1 + ShareDamping × (1 − f)) of it until
	// the next count. The
	// counts lag the sites' admissions by the pipeline's lag and the shares move with
	// demand between two counts, so a site can have spent a larger share than the next
	// count gives it while the room that count hands the others is partly spent already;
	// the held-back part absorbs that. Near 0 spends the whole room (more over-admission in
	// bursts), 1 holds back the most (more under-admission near the limit); negative turns
	// damping off. Default: Defaults, chosen with the accuracy simulation
	// (docs/accuracy.md).
	ShareDamping float64
	// DemandPrior spreads a little demand evenly over the data centers of the fresh sites
	// before the room is shared by demand: each data center's weight is (its sites' demand
	// + DemandPrior × limit / n) over (all demand + DemandPrior × limit), for n data
	// centers. Without it a data center whose demand has just started (a client arriving
	// from another data center) is held to MinShare until its demand has travelled
	// through the pipeline, although the room may be large.
	// Default: Defaults; negative: none.
	DemandPrior float64
	// NewKeyHold is how long after a key was last unknown to this site every site is
	// assumed to hold at least its default share of it: the sites spent their default
	// shares while it was unknown, and its first counts may not show that yet. Default:
	// Defaults; negative: none.
	NewKeyHold time.Duration
	// SiteStaleAfter is how long a site may go unheard (its site heartbeats, through the
	// aggregators' heartbeats) before it is taken as silent: its hits may be cut off from
	// here (a partition between data centers), and its silence is not idleness. A silent
	// site is reserved its share of each key it served before the silence, for as long as
	// it stays silent when its whole data center is (cut off), for CrashHold when the
	// other sites of its data center still speak (it crashed). A site that stopped cleanly
	// (a leave record) is reserved nothing. Default: Defaults.
	SiteStaleAfter time.Duration
	// CrashHold is how long a site found silent while the other sites of its data center
	// still speak (a crash, most likely, or a process cut off alone) keeps a reservation
	// of its share of the keys it served, fading linearly to nothing; it is reserved
	// nothing of keys it never served. Longer protects against a lone process that still
	// admits while it cannot publish; shorter frees a crashed process's clients sooner.
	// Default: Defaults; negative: no reservation at all.
	CrashHold time.Duration
	// ReserveMargin is added to the pipeline's lag in the time over which the other sites'
	// spend of a key is reserved: a site may spend of a key under its limit all the room
	// it sees, less what the other fresh sites may admit before its hits reach them —
	// their request rate for the key over the snapshot's age, the lag and ReserveMargin,
	// never more than their shares of the room (see docs/decisions.md, "Global
	// limits"). Longer keeps more back for a client that surges at several sites at once
	// (less over-admission); shorter refuses less of a client near its limit. Default:
	// Defaults, chosen with the accuracy simulation (docs/accuracy.md); negative: none.
	ReserveMargin time.Duration
	// ServingSpan is the span over which the other data centers' recent rates of a key
	// tell which of them still serve it. A site takes every data center serving a key
	// under its limit to receive at least its own rate of it — the guard against a client
	// that surges at several data centers at once before the counts show it — and one
	// counts as serving while it has served the key in the window at half this site's
	// rate or more over the last ServingSpan or so (less, in proportion). A data center a
	// client has left then stops being kept this site's rate about ServingSpan after the
	// counts show it gone, and the client is not refused at its new data center for room
	// kept at the old one. Shorter refuses fewer moving clients, and mistakes a client
	// spread thinly over the data centers for one that left them more often (more
	// over-admission). Default: Defaults, chosen with the accuracy simulation
	// (docs/accuracy.md); negative: every data center that served the key in the window
	// counts whole.
	ServingSpan time.Duration
	// RecoveryHold is how long, after the snapshot was last stale, a global limit stays
	// capped at this site's share as well as by the snapshot (bounded by the limit's
	// window): right after Kafka or the aggregator comes back, hits published during the
	// outage are still being delivered and counted, so the first fresh counts are low, and
	// every site would spend the room they seem to leave. Default: Defaults.
	RecoveryHold time.Duration
	// MaxKeys bounds the counter keys the Engine interns (its key cache; the counters
	// have their own bounds). A full part of the cache is emptied, which costs only
	// interning the keys again. Default: Defaults.
	MaxKeys int
	// MaxWaiters bounds the requests Await keeps waiting at once. Default:
	// Defaults.
	MaxWaiters int
	// DenyUnknownDomain denies a request of a domain that no rule configures (and that
	// carries no limit override of its own), every descriptor over its limit, for a
	// deployment where a typo in a domain must not go unlimited. Default false: such a
	// request is admitted with no limit, as envoyproxy/ratelimit does. Either way it is
	// counted and its domain logged, at most once a second.
	DenyUnknownDomain bool
	// EnvoyKeyPrefix (envoyproxy/ratelimit's CACHE_KEY_PREFIX) starts the Redis keys of the
	// limits counted in envoyproxy/ratelimit's layout (rules.Limit.EnvoyShared, in a domain in rules.CompatEnvoy): set it to the
	// value a deployment of envoyproxy/ratelimit uses, so that both count on the same keys.
	// Default "", as there.
	EnvoyKeyPrefix string
}

// Config configures an Engine. Only Rules and Site are required.
type Config struct {
	Tuning
	// Rules returns the rules in force, read once per decision: a rules.Reloader's Current,
	// or rules.Static.
	Rules func() *rules.Config
	// Site names this enforcer's site, as in hit records and count breakdowns.
	Site string
	// Local holds the local-scope counters. Default: a new algo.Store with default
	// options.
	Local *algo.Store
	// SiteStore decides site-scope limits. Default: nil, and site-scope limits are
	// decided in Local, as if the site were this process.
	SiteStore SiteStore
	// Counter is this site's exact count of global keys. Default: a new sitecount.Local with
	// SubBuckets.
	// Several enforcers of one site must share one, in Redis (sitestore.NewCounter), for
	// invariant 3 to hold.
	Counter sitecount.Counter
	// Snapshot is the view of the counts topic. Default nil: no other site is visible and
	// global limits are always decided on a local share (DefaultShare).
	Snapshot *snapshot.Snapshot
	// Publisher receives every admitted hit of a global limit. Default nil: hits are not
	// published (a single-site setup, or tests).
	Publisher Publisher
	// ReportPublisher receives the usage that Reporters count (clients deciding on their
	// own, in bulk: RLQS reports), so that it can hold them apart from the decisions' hits
	// and never let them crowd those out (producer.Producer.Bulk). Default Publisher.
	ReportPublisher Publisher
	// KeyCacheBytes bounds the bytes the key cache keeps alive, by an estimate per key;
	// both bounds apply. Default 0: no bound in bytes (memsize.Split divides a process's target).
	KeyCacheBytes int64
	// Sleep is how Await waits: until d has passed or ctx is done. Default algo.Sleep, a
	// real timer; simulations pass one that advances their clock.
	Sleep func(ctx context.Context, d time.Duration) error
	// Clock defaults to the wall clock.
	Clock clock.Clock
	// Logger defaults to a logger that discards.
	Logger *slog.Logger
	// Registerer receives the Engine's metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

// Defaults returns the settings New gives a Tuning's zero fields: the one place each
// default is stated. Flags and other layers that expose a setting take its default from
// here.
func Defaults() Tuning {
	return Tuning{
		SubBuckets: window.DefaultSubBuckets,
		MinShare:   0.05,
		// Three site heartbeat periods. Until a cut site is taken as silent, the sites on
		// both sides of the cut still share the room as if they saw each other, which is
		// what a partition can over-admit.
		SiteStaleAfter: topics.SiteSilentAfter,
		// Chosen with the accuracy simulation's churn scenarios (docs/accuracy.md), as are
		// ShareDamping and DemandPrior.
		CrashHold:    10 * time.Second,
		ShareDamping: 0.15,
		// The knee of the frontier of over-admission against false 429s that
		// `streamlimit sim dc --sweep-reserve-margin` measures (docs/accuracy.md).
		ReserveMargin: 250 * time.Millisecond,
		// Long enough that a client spread thinly over the data centers is seldom taken
		// for one that left them (`streamlimit sim dc --sweep-serving-span`).
		ServingSpan:  time.Second,
		DemandPrior:  0.05,
		RecoveryHold: 30 * time.Second,
		// A few pipeline lags.
		NewKeyHold: time.Second,
		// As many keys as the site counter holds by default.
		MaxKeys:    sitecount.DefaultMaxKeys,
		MaxWaiters: 10_000,
	}
}
