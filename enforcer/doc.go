// Package enforcer decides whether a request is admitted, against rules of three scopes,
// without ever waiting on Kafka or on another data center.
//
// A Limiter takes an Envoy-style Request (a domain and several descriptors, each a list of
// key/value entries), matches each descriptor most-specific-first against the rules of
// package rules, and decides every limit in force:
//
//   - scope local: in this process, with one of the six algorithms of package algo;
//   - scope site: shared by all enforcers of one site through a SiteStore (package
//     sitestore: Lua scripts in a data center's Redis, falling back to process-local
//     counting when Redis fails);
//   - scope global: across all sites. The Limiter estimates the key's use as
//     used = (snapshot.total − snapshot.site[me]) + local_exact (DESIGN invariant 3): the
//     other sites' part from the snapshot of the counts topic (package snapshot), late by
//     the pipeline lag; its own site's part exact and immediate from a SiteCounter. Every
//     admitted hit of a global limit is published through a Publisher (package producer)
//     so that the aggregator counts it for everybody else.
//
// # Global limits when a key is hot
//
// Sites that cannot yet see each other's latest hits would each spend the whole remaining
// room. So when the room left in the snapshot (limit − total) is small against the key's
// recent rate over the pipeline lag plus Config.HotHorizon, or below Config.HotFraction of
// the limit (by default always), a site may hold only its count in the snapshot plus its
// share of that room: its fraction of the key's traffic in the snapshot's per-site
// breakdown, smoothed toward Config.DefaultShare, at least Config.MinShare. The room may be
// negative, and then each site gives back its share of the excess. Summed over the sites,
// the caps spend the room once; they are rounded to whole requests together (systematic
// sampling with an offset every site draws alike from the key and the snapshot's as-of
// time), so that rounding up at several sites never admits more than the limit.
//
// # Degradation
//
// When the snapshot is stale (no aggregator heartbeat for Config.MaxStaleness, or an
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
// (global against the snapshot, local with Peek), then site limits are taken atomically in
// one SiteStore call, then local limits atomically, then global ones. The one exception is
// a race between concurrent requests on the same keys in the few hundred nanoseconds
// between the check and the commit: a later stage may then deny after an earlier one has
// taken its quota. Shadow-mode rules are decided and reported, and consume quota only when
// the request is admitted, but never deny.
package enforcer
