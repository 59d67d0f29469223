// Package enforcer decides whether a request is admitted, against rules of three scopes,
// without ever waiting on Kafka or on another data center. New makes an Engine from a
// Config (the rules and the site's name are required; everything else has a default,
// Defaults); Decide, DecideInto (no allocation) and DecideAt (the caller's clock) decide a
// Request — a domain and descriptors, as Envoy sends them — into a Result with one Status
// per descriptor; Await waits for room instead of refusing. The Engine's plug points are
// a SiteStore for site-scope limits (package sitestore, in Redis), a sitecount.Counter for
// this site's own count of global limits, the snapshot of the other sites' counts (package
// snapshot) and a Publisher of hits (package producer). Package streamlimit assembles all
// of them for a Go service; the rest of this documentation is the model the Engine
// follows.
//
// Each descriptor is matched most-specific-first against the rules of package rules (a
// descriptor that carries its own limit, an Override, is limited by that instead), and
// every limit in force is decided:
//
//   - scope local: in this process, with one of the six algorithms of package algo;
//   - scope site: shared by all enforcers of one site through a SiteStore (package
//     sitestore: Lua scripts in a data center's Redis, falling back to process-local
//     counting when Redis fails);
//   - scope global: across all sites. The Engine estimates the key's use from the
//     snapshot of the counts topic (package snapshot), which holds every site's count as
//     the aggregator last saw it, late by the pipeline's lag, and from this site's own
//     exact count (a sitecount.Counter: in process, or in the data center's Redis),
//     immediate. Every admitted hit of a global limit, and every denied request, is
//     published through a Publisher (package producer) so that the aggregator counts it
//     for everybody else.
//
// # Global limits
//
// Sites that cannot yet see each other's latest hits would each spend all the room a count
// shows. So a site may hold only its count plus its share of the room: with L the limit
// and c_s each site's count in the snapshot, the room is L − Σ c_s (negative when the
// window is over the limit, and then each site gives back its share of the excess), and
// this site's cap on its own exact count is c_me + f_me × room. The shares f_s follow
// demand — each site's requests, admitted or denied, weighted by e^(−age/τ), which the
// aggregator publishes with the counts — so that the room goes where the client is now: a
// client that moves from one data center to another takes its room with it within a
// pipeline lag and τ. A small prior (Config.DemandPrior) is spread evenly over the fresh
// sites first, so that a site whose demand has just begun is not held to the minimum
// while it travels. Every fresh site gets at least Config.MinShare, so that a site the
// snapshot does not show yet (where the client has just arrived) is not shut out while its
// demand travels. Config.ShareDamping holds back part of each share, which absorbs the
// room two consecutive counts hand out twice when shares move between them. The caps are
// rounded to whole requests together, with one random offset every site draws alike from
// the key and the count's as-of time, so that rounding never admits more than the limit.
// The shares are those of data centers (the sites heard on one hits topic), each split
// evenly among its fresh sites: processes behind one load balancer see a client alike, and
// a data center of many processes gets one minimum share and one part of the prior, not
// one per process.
//
// Shares alone keep back for the other sites far more than they can spend: a share
// follows demand a lag late, and near its limit a client is refused at one site while room
// it will not use is kept for another. What takes the room from this site is what the
// others admit before they see its admissions, not their shares. So a key not in demand
// beyond twice its limit (its demand rate over the sites, for a window) may reach, where
// its share gives less, the whole room less what the other fresh sites may admit within
// the lag: their recent request rate for the key (told from their demand now and about
// 300 ms before, so that a site a client has left stops being kept room within a fraction
// of a second) over the snapshot's age and a lead — for the other data centers, which see
// this site a replication late, plus Config.ReserveMargin — with two standard deviations
// of Poisson margin (package internal/room), never more than the shares would give them:
// the rule never gives less than the share rule, and when every site keeps back the
// others' shares the caps add up to the room. A site that has not served a key is kept
// almost nothing of it, and a client that moves brings its rate with it a lag later. The
// price is a bounded risk: a client that surges at several sites at once before the counts
// show it could be admitted by each; every site that served the key in the window is
// taken to see a surge here (this site's own rate, measured over half a second), and the
// sites of one data center this site's rate times their number. A Reporter's quota, spent
// over seconds, gets only its data center's share of the room ahead; its share is weighed
// by at least the rate its report stands for, since reported usage reaches the snapshot
// in lumps whose demand fades within seconds (withDemand).
//
// The snapshot shows this site as of a local hop ago, the other data centers as of a
// replication ago: the room it leaves for this site is partly spent by what the others
// have not seen yet. So the cap counts this site as the others see it — its hits since
// the other data centers were last heard from are taken out of their shares' reach —
// which only ever lowers the share's cap. The room ahead needs no such correction: there
// the others keep back this site's rate over the lag.
// The aggregators help from their side by holding each data center's own hits back by
// the lag difference (aggregator.Config.MaxLocalHold).
//
// A key the snapshot does not show (new, or idle for a whole window) may start at every
// site at once: each site spends only Config.DefaultShare of the limit (by default one
// over the number of sites that may spend it: the live ones and those cut off from here)
// until its count comes back.
//
// # Sites that come and go
//
// Every site proves it is alive through site heartbeats on its hits topic, which
// replication carries like its hits; the aggregators publish, per source partition, when
// they last heard from each site, and which sites left (package topics). A decision takes
// each site to be in one of four states (the streamlimit_enforcer_sites gauge counts them):
//
//   - fresh: heard from within Config.SiteStaleAfter. It shares the room by demand.
//   - left: every instance of it stopped cleanly (producer.Producer.Close writes a leave
//     record to every partition). It admits nothing more: its hits still in the window
//     count, nothing is reserved beyond them, and it is not counted among the sites that
//     share new keys. A site that restarts under its name is live again at its next
//     heartbeat.
//   - cut: silent, and so is every other site of its data center (its hits topic) — a cut
//     link, a stopped replicator, a data center down. It may still be admitting what it
//     was given, so it is assumed to hold at least its share of each key it served, taken
//     from the key's breakdown before the silence (the aggregators count it as of its last
//     heartbeat, so its count does not fade either), for as long as the silence lasts, and
//     its default share of keys new since. Never a share of keys it did not serve. Both
//     sides of a cut reserve each other's shares from counts made before the cut, so that
//     together they stay within the limit.
//   - crashed: silent while other sites of its data center still speak — it stopped on its
//     own, most likely without the chance to leave. Its reservation fades to nothing over
//     Config.CrashHold, and it gets no share of new keys.
//
// Room reserved for a silent site is not a fallback (Status.Fallback is only for the
// degraded path below); such caps are counted in
// streamlimit_enforcer_silent_site_reservations_total. An Engine younger than a key's
// window also gives its in-process count what the snapshot shows of its own site's hits of
// the key (a process restarted under the same site name lost its count, which the
// aggregators still have), so that a restart admits nothing twice. Such a process is
// fresh to itself at once, but the other sites of its data center take it for left or
// crashed until its heartbeats reach them, and share the data center's whole share among
// themselves: until its own snapshot shows it fresh, it holds only its count of a key in
// demand beyond its limit, so as not to spend its part on top of theirs.
//
// This site's own count treats the window's oldest sub-bucket by the span of its hits
// (their exact times are known here), so that a burst that filled part of a sub-bucket
// leaves the window when it does. A limit with hard: true counts that sub-bucket whole
// until it has left, so that one site never admits more than the limit in any window.
// docs/accuracy.md measures all of this against an exact global limiter.
//
// # Degradation
//
// When the snapshot is stale (no aggregator heartbeat for MaxStaleness, or an
// aggregator is replaying), a global limit becomes a local one of limit × share, where
// share is the site's last known share of the key (at least MinShare) or
// Config.DefaultShare for keys it never saw. When a SiteStore falls back because Redis
// failed, the decision is made in process and reported as such. Neither ever returns an
// error to the caller: a rate limiter that fails closed takes the API down with it.
//
// # All or nothing
//
// A request passes only if every non-shadow limit of every descriptor passes, and a
// denied request consumes no quota from any of its limits: all limits are checked first
// (local with Peek, global against the snapshot and the site counter's counts), then site
// limits are taken atomically in one SiteStore call, then local limits atomically, then
// global ones. A request with global limits and no global shadow limit, that its local
// limits admit, has its global limits checked and taken in one site counter call (one
// Redis round trip instead of two), before its local limits are taken; when it has site
// limits too, none of them shadow, and the site counter keeps its counts in the SiteStore
// (sitecount.SiteCommitter: sitestore.Counter on its own Store), that same call takes the
// site limits, all or nothing with the global ones (one round trip instead of three). The one
// exception is a race between concurrent requests on the same keys between the check and
// the commit (a few hundred nanoseconds, or one site counter call when its global limits
// were taken first): a later stage may then deny after an earlier one has taken its quota,
// an error toward refusing. Shadow-mode rules are decided and reported, and consume quota
// only when the request is admitted, but never deny.
//
// # envoyproxy/ratelimit's counters
//
// In a domain in rules.CompatEnvoy, a limit that envoyproxy/ratelimit would count itself
// (rules.Limit.EnvoyShared: a fixed window of one of its units, in site scope, the one
// limit in force of its descriptor) is counted at its key in envoyproxy/ratelimit's Redis
// layout (rules.AppendEnvoyKey, Config.EnvoyKeyPrefix), with the SiteStore's CountEnvoy
// (sitestore.Store.CountEnvoy), by the Engine's decisions and by package rls's answers
// alike: one counter per limit, whichever way a
// client asks, shared with a deployment of envoyproxy/ratelimit on the same Redis. As
// there, such a limit counts every request that reaches it, over the limit or not, before
// the other stages; it is the exception to all or nothing.
package enforcer
