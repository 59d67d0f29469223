// Package enforcer decides whether a request is admitted, against rules of three scopes
// (local, site, global), without ever waiting on Kafka or on another data center.
//
// New makes an Engine from a Config (the rules and the site's name are required;
// everything else has a default, Defaults). Decide, DecideInto (no allocation) and
// DecideAt (the caller's clock) decide a Request — a domain and descriptors, as Envoy
// sends them — into a Result with one Status per descriptor; Await waits for room
// instead of refusing:
//
//	lim, err := enforcer.New(enforcer.Config{Site: "eu-1", Rules: reloader.Current})
//	res := lim.Decide(ctx, enforcer.Request{Domain: "api",
//		Descriptors: [][]rules.Entry{{{Key: "user", Value: "42"}}}})
//
// The Engine's plug points are a SiteStore for site-scope limits (package sitestore, in
// Redis), a sitecount.Counter for this site's own count of global limits, the snapshot of
// the other sites' counts (package snapshot) and a Publisher of hits (package producer).
// Package streamlimit assembles all of them for a Go service.
//
// The model the Engine follows — how sites share a global limit's room, degradation,
// all or nothing — is docs/decisions.md; what a site is, docs/sites.md.
package enforcer
