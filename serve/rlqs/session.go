package rlqs

import (
	"context"
	"errors"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/memsize"
)

// minInterval is the shortest time between two reports of a bucket that counts as a
// reporting period (a new bucket's immediate report may be followed at once by a periodic
// one).
const minInterval = 0.05

// request is what every stream's bucket of one bucket id shares: the descriptors the id
// maps to, the Reporter that counts its usage, and the keys of its global limits. Its
// mutex serializes the reports of the id, whichever stream they come on.
type request struct {
	tableEntry // name: domain and canonical(bucket id); holders: the streams' buckets
	id         map[string]string

	mu  sync.Mutex
	cfg *rules.Config
	// orphans are the holders of this bucket id on closed streams whose reservations
	// stand until their assignments expire or a new stream takes them over (lookup).
	orphans []*holder
	rep     *enforcer.Reporter
	quotas  []enforcer.Quota // the last Report's, shadow limits left out
}

// session is the server's side of one stream: its domain and its buckets.
type session struct {
	srv    *Server
	addr   netip.Addr // its client's address (addrShare)
	domain string
	byReq  map[*request]*holder
	byRaw  map[string]*holder // by the bytes of a BucketId message
	until  float64            // once closed: when its last assignment expires
	// tick is when its client's report timer last reported (a report of a bucket
	// reported before at the client), -1 before: the phase of its timer (takeOver).
	tick    float64
	scratch []byte // the response being written
	enc     encoder
}

// holder is one stream's bucket: it holds part of its keys' room.
type holder struct {
	req     *request
	raw     string      // the bucket id in wire form, for the responses (a byRaw key)
	aliases []string    // other wire forms it was reported in (byRaw keys), maxAliases at most
	bytes   int64       // charged to Options.MaxBytes
	addr    netip.Addr  // its stream's client address, charged too
	keys    []*keyState // the keys it contributes to
	contrib contribution
	m       model
	started bool
	demand  float64 // requests per second, smoothed
	period  float64 // seconds between reports, measured; 0 until measured
	sentAt  float64
	idle    float64 // since when it reported no request; -1 while active
	taken   bool    // an orphan released early, by a new stream's holder (req.mu)
	phase   float64 // once an orphan: a time its client's report timer fired (takeOver)
	phased  bool    // phase is a timer report's; else its last report's, of a new bucket
	fresh   bool    // not reported on its stream yet
	// measured: a report came after the first, so the next interval is a period.
	measured bool
	// short: its last period's requests reached its token bucket's refill over the
	// period and none was denied: it is spending its burst, and will run dry (next, due).
	short bool
}

// maxAliases is how many wire forms of a bucket id besides its first a stream remembers:
// a form past them is decoded and found by its canonical form at every report, so that
// one bucket id sent in a million encodings (map entries in another order, unknown
// fields) is one bucket, not a million keys.
const maxAliases = 2

// retainBytes is the most a stream keeps of its buffers (the last report, the last
// response) from one message to the next: a larger one is dropped after use. 16 KiB
// holds the report of some 250 buckets; a larger one is made anew at each report.
const retainBytes = 16 << 10

// streamBytes is what an open stream is charged against Options.MaxBytes: its goroutine
// and grown stack, grpc-go's state of the stream and its session, 32 KiB (30 000 idle
// streams took 841 MiB of the process, 28 KiB each), and the buffers it keeps
// (retainBytes each for the report and the response).
const streamBytes = 32<<10 + 2*retainBytes

// bucketBytes is what a stream's bucket of the bucket id in wire form raw, with entries
// id, is charged against Options.MaxBytes: the holder, its entries in the stream's maps,
// and — charged to every holder, a bound rather than a share — the request it shares
// with the other streams (the id's entries, its canonical name, its Reporter with a
// descriptor and counter key or two) and its keys' states.
func bucketBytes(raw string, id map[string]string) int64 {
	n := memsize.Alloc(int64(unsafe.Sizeof(holder{}))) + memsize.Alloc(int64(len(raw))) + 2*mapEntryBytes
	n += memsize.Alloc(int64(unsafe.Sizeof(request{}))) + memsize.Alloc(int64(unsafe.Sizeof(enforcer.Reporter{}))) + mapEntryBytes
	for k, v := range id {
		// The map's entry, the key and value strings, twice more in the canonical name
		// and the descriptor.
		n += mapEntryBytes + 3*(memsize.Alloc(int64(len(k)))+memsize.Alloc(int64(len(v))))
	}
	return n + 2*(memsize.Alloc(int64(unsafe.Sizeof(keyState{})))+keyNameBytes+mapEntryBytes)
}

// mapEntryBytes is what an entry of a Go map of strings or pointers takes, its part of
// the buckets and their spare room included; keyNameBytes a counter key's length, about.
const (
	mapEntryBytes = 64
	keyNameBytes  = 64
)

// errRefused: the bucket is past a bound (Options.MaxStreamBuckets, MaxBytes).
var errRefused = errors.New("rlqs: bucket refused")

func (s *Server) newSession() *session {
	s.metrics.streams.Inc()
	return &session{srv: s, byReq: map[*request]*holder{}, byRaw: map[string]*holder{}, tick: -1}
}

// handle processes one usage report message at now and returns the response to send (a
// RateLimitQuotaResponse in wire form), nil when no bucket needs an action.
func (ss *session) handle(ctx context.Context, now time.Time, domain string, us []usage) ([]byte, error) {
	s := ss.srv
	s.metrics.messages.Inc()
	switch {
	case ss.domain == "" && domain == "":
		s.metrics.invalid.WithLabelValues("no_domain").Inc()
		return nil, status.Error(codes.InvalidArgument, "domain: required in a stream's first report")
	case ss.domain == "":
		ss.domain = strings.Clone(domain)
	case domain != "" && domain != ss.domain:
		s.metrics.invalid.WithLabelValues("domain_changed").Inc()
		return nil, status.Errorf(codes.InvalidArgument, "domain: %q on a stream of domain %q (open a new stream to change it)", domain, ss.domain)
	}
	// Counts are bounded as at the other front doors: no client sees 2^32 requests of a
	// bucket between two reports, and a larger number would swamp the counts. The whole
	// report is refused, before any of it is counted, and the stream ended with
	// InvalidArgument: a client that sends such a count is broken or forging, and the
	// status says why. Envoy takes a stream's end in its stride: it drops the stream
	// (onRemoteClose), opens another at its next report (onSendReportsTimer), and keeps
	// deciding on its buckets' assignments until their TTL meanwhile (Envoy:
	// source/extensions/filters/http/rate_limit_quota/global_client_impl.cc); a stream
	// kept open would leave it unaware that its reports are not counted.
	for i := range us {
		if u := &us[i]; u.allowed > math.MaxUint32 || u.denied > math.MaxUint32 {
			s.metrics.invalid.WithLabelValues("count_too_large").Inc()
			field, n := "num_requests_allowed", u.allowed
			if u.denied > math.MaxUint32 {
				field, n = "num_requests_denied", u.denied
			}
			return nil, status.Errorf(codes.InvalidArgument, "bucket_quota_usages[%d].%s: %d is above 2^32-1", i, field, n)
		}
	}
	t := s.since(now)
	resp := ss.scratch[:0]
	var reports, allowed, denied uint64
	// Actions sent, by kind (kindNone: abandon), counted once per message: a metric's
	// label lookup per bucket costs as much as a tenth of the report.
	var actions [kindPerUnit + 1]uint64
	timer := false
	for i := range us {
		u := &us[i]
		h, err := ss.lookup(u, now)
		if err == errRefused {
			// No action: the client goes on by its no_assignment_behavior, and the
			// usage is not counted (the server keeps nothing of the bucket to count it
			// with).
			continue
		}
		if err != nil {
			s.metrics.invalid.WithLabelValues("malformed").Inc()
			return nil, status.Errorf(codes.InvalidArgument, "bucket_quota_usages[%d].bucket_id: %v", i, err)
		}
		if h == nil {
			s.metrics.invalid.WithLabelValues("no_bucket_id").Inc()
			continue
		}
		if !u.first {
			timer = true
		}
		reports++
		allowed += u.allowed
		denied += u.denied
		a, send, abandon := ss.report(ctx, now, t, h, u.allowed, u.denied)
		switch {
		case abandon:
			resp = ss.enc.appendAbandon(resp, unsafeBytes(h.raw))
			ss.forget(h)
			actions[kindNone]++
		case send:
			resp = ss.enc.appendAssignment(resp, unsafeBytes(h.raw), a, s.ttl, s.opts.Unit)
			actions[a.kind]++
		}
	}
	if timer {
		ss.tick = t
	}
	for k, n := range actions {
		if n > 0 {
			s.metrics.action(kind(k)).Add(float64(n))
		}
	}
	s.metrics.reports.Add(float64(reports))
	s.metrics.allowed.Add(float64(allowed))
	s.metrics.denied.Add(float64(denied))
	ss.scratch = resp
	if cap(resp) > retainBytes {
		ss.scratch = nil
	}
	if len(resp) == 0 {
		return nil, nil
	}
	// gRPC may hold the message after SendMsg returns: it gets its own copy.
	return append([]byte(nil), resp...), nil
}

// lookup returns u's holder, made when the stream has not reported its bucket before; nil
// for an empty bucket id; errRefused when a new bucket would pass MaxStreamBuckets or
// MaxBytes. A bucket id in wire form is looked up by its bytes first, and decoded only
// when they are new: the same id may come encoded otherwise (its entries in another
// order, unknown fields); it is then found by its canonical form, and up to maxAliases of
// its other forms remembered.
func (ss *session) lookup(u *usage, now time.Time) (*holder, error) {
	if u.raw != nil {
		if h := ss.byRaw[string(u.raw)]; h != nil {
			return h, nil
		}
		m, err := decodeBucketID(u.raw)
		if err != nil {
			return nil, err
		}
		u.bucket = m
	}
	if len(u.bucket) == 0 {
		return nil, nil
	}
	s := ss.srv
	req := requestOf(&s.requests, ss.domain, u.bucket)
	h := ss.byReq[req]
	if h != nil {
		s.requests.release(req) // the holder has its reference already
		if raw := unsafeString(u.raw); u.raw != nil && raw != h.raw && len(h.aliases) < maxAliases {
			raw = string(u.raw)
			if n := memsize.Alloc(int64(len(raw))) + mapEntryBytes; s.charge(ss.addr, n) == "" {
				h.bytes += n
				ss.byRaw[raw] = h
				h.aliases = append(h.aliases, raw)
			}
		}
		return h, nil
	}
	var raw string
	if u.raw != nil {
		raw = string(u.raw)
	} else {
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(&rlqsv3.BucketId{Bucket: u.bucket})
		raw = string(b)
	}
	if n := s.opts.MaxStreamBuckets; n > 0 && len(ss.byReq) >= n {
		s.requests.release(req)
		s.metrics.refusedBkts.WithLabelValues("stream").Inc()
		return nil, errRefused
	}
	size := bucketBytes(raw, u.bucket)
	if bound := s.charge(ss.addr, size); bound != "" {
		s.requests.release(req)
		s.metrics.refusedBkts.WithLabelValues(bound).Inc()
		return nil, errRefused
	}
	h = &holder{req: req, idle: -1, raw: raw, bytes: size, addr: ss.addr, fresh: true}
	ss.byReq[req] = h
	ss.byRaw[raw] = h
	s.metrics.buckets.Inc()
	if !u.first {
		// A bucket's first report at its client (Envoy reports a new bucket at once)
		// is no stream's continuation: it takes over nothing.
		ss.takeOver(h, s.since(now))
	}
	return h, nil
}

// takeOver releases the reservation of one holder of h's bucket id on a closed stream
// when this stream reports it for the first time, at t, and h continues that holder's
// measurements. An Envoy whose stream ends starts another at its next report, with the
// same buckets and the same token buckets, and reports on it what it admitted meanwhile:
// its old holder's reservation would count the same tokens twice, and deny other clients,
// until its TTL. The protocol names no Envoy (a report carries a domain and buckets;
// Envoy adds no node id to the stream), but its report timer does: it ticks at a fixed
// period from a phase of its own, so the orphan taken is the one whose stream's last
// timer report is closest to a whole number of periods before t, within takeOverSlack.
// None closer: the Envoy's old holder is gone (its assignment expired) or was never
// there, and taking another Envoy's would leave that Envoy unreserved until it reports
// again, and it would take a third's in turn, down a chain (a new bucket's first report
// taking one started such chains: at 3 × 20 Envoys with streams cut every 7 s, one to
// five Envoys of a data center were left unreserved at any time, and the heavy client
// reached 1.005× its limit). An orphan of a stream that ended before its timer reported
// has no known phase: it is taken when no orphan with one is close enough.
//
// h continues the orphan: its demand, period and model of the client's assignment (its
// report covers the requests since the orphan's last, and Envoy keeps its token buckets
// across streams). A demand measured anew over one period of a few requests would swing
// with chance at each stream's start, and a new assignment make Envoy refill a bucket
// that was equal. The first report on the stream is answered whatever due says.
func (ss *session) takeOver(h *holder, t float64) {
	req := h.req
	req.mu.Lock()
	best, bestD, phased := -1, math.Inf(1), false
	for i, o := range req.orphans {
		d := offPhase(t-o.phase, ss.srv.opts.ReportingInterval.Seconds())
		if o.period > 0 {
			d = min(d, offPhase(t-o.phase, o.period))
		}
		switch {
		case o.phased && d > takeOverSlack, phased && !o.phased:
			continue
		case o.phased && !phased, d < bestD:
			best, bestD, phased = i, d, o.phased
		}
	}
	if best < 0 {
		req.mu.Unlock()
		return
	}
	o := req.orphans[best]
	req.orphans = slices.Delete(req.orphans, best, best+1)
	o.taken = true
	req.mu.Unlock()
	h.started, h.demand, h.period, h.idle = o.started, o.demand, o.period, o.idle
	h.m, h.sentAt = o.m, o.sentAt
	// The interval from a new bucket's report, off the timer's phase, is no period.
	h.measured = o.measured && o.m.last == o.phase
	ss.release(o)
	ss.srv.uncharge(o.addr, o.bytes)
	ss.srv.metrics.drainingBkts.Dec()
}

// offPhase is how far dt is from a whole number of periods p.
func offPhase(dt, p float64) float64 {
	d := math.Mod(dt, p)
	return min(d, p-d)
}

// takeOverSlack is how far from a whole number of periods after a closed stream's last
// timer report, in seconds, a new stream's first report may come and take that stream's
// holder over: Envoy's timer is re-armed after each tick and reports cross the network
// with jitter, milliseconds; another Envoy's timer is at a phase of its own, anywhere in
// the period.
const takeOverSlack = 0.25

// forget drops an abandoned bucket from the session.
func (ss *session) forget(h *holder) {
	ss.release(h)
	delete(ss.byReq, h.req)
	delete(ss.byRaw, h.raw)
	for _, r := range h.aliases {
		delete(ss.byRaw, r)
	}
	ss.srv.requests.release(h.req)
	ss.srv.uncharge(h.addr, h.bytes)
	ss.srv.metrics.buckets.Dec()
}

// report counts one bucket's usage and returns its assignment and whether to send it,
// or that the bucket is to be abandoned.
func (ss *session) report(ctx context.Context, now time.Time, t float64, h *holder, allowed, denied uint64) (a assignment, send, abandon bool) {
	s := ss.srv
	// The reporting period, measured between reports, is the horizon of the assignment:
	// the client decides on it until its next report. The demand is the requests reported
	// per second, smoothed.
	hz := s.opts.ReportingInterval.Seconds()
	span := hz
	if h.started {
		dt := t - h.m.last
		// The first interval is not a period: a new bucket is reported at once, and then
		// by the report timer at whatever phase it runs (Envoy: global_client_impl.cc,
		// createBucketImpl). Taken as one, it would shorten the horizon for many reports
		// and keep the hits of the last report in the room's count.
		if dt >= minInterval && h.measured {
			if h.period == 0 {
				h.period = dt
			} else {
				h.period = 0.7*h.period + 0.3*min(dt, 4*h.period)
			}
		}
		span = max(dt, minInterval)
		h.measured = true
	}
	if h.period > 0 {
		hz = h.period
	}
	rate := float64(allowed+denied) / span
	h.short = h.measured && denied == 0 && h.m.a.kind == kindTokens && float64(allowed) >= h.m.a.rate(ss.unit())*span
	smooth := h.started
	h.m.afterReport(t, allowed, ss.unit())
	h.started = true

	req := h.req
	req.mu.Lock()
	defer req.mu.Unlock()
	if cfg := s.rules(); req.rep == nil || req.cfg != cfg {
		req.cfg = cfg
		req.rep = s.lim.Reporter(enforcer.Request{Domain: ss.domain, Descriptors: s.mapperOf(cfg).Descriptors(ss.domain, req.id)})
	}
	// The room is the count left when the holder reports next: the hits it reported a
	// period ago leave the window about then, and are looked at a little after it so that
	// they do count as gone (reports are counted in lumps, at their arrival, and two
	// reports a period apart arrive a few milliseconds more or less than a period apart).
	ahead := time.Duration((hz + aheadSlack) * float64(time.Second))
	qs, other := req.rep.Report(ctx, now, int64(allowed), int64(denied), ahead, req.quotas[:0])
	if other > 0 {
		s.metrics.ignoredLimits.Add(float64(other))
	}
	n := 0
	for _, q := range qs {
		if !q.Shadow {
			qs[n] = q
			n++
		}
	}
	qs = qs[:n]
	req.quotas = qs
	// A holder's demand is taken at most at the rate of its tightest limit: no client can
	// be admitted more than the whole limit, so asking for more earns it no larger share
	// (allot weighs the holders by their demands), and a forged count of requests cannot
	// crowd out the others' shares beyond what one client honestly over its limit does.
	for i := range qs {
		if w := qs[i].Window.Seconds(); w > 0 {
			rate = min(rate, float64(max(qs[i].Limit, 1))/w)
		}
	}
	if smooth {
		rate = 0.5*h.demand + 0.5*rate
	}
	h.demand = rate

	if allowed+denied > 0 {
		h.idle = -1
	} else if h.idle < 0 {
		h.idle = t
	} else if t-h.idle >= s.opts.AbandonAfter.Seconds() {
		s.metrics.abandoned.Inc()
		return a, false, true
	}

	ss.rekey(h, qs)
	allotted := math.Inf(1)
	if len(qs) == 0 {
		a = assignment{kind: kindAllow}
	} else {
		atOnce := math.Inf(1)
		for i := range qs {
			k := h.keys[i]
			k.mu.Lock()
			others := contribution{open: k.open - h.contrib.open, demand: k.demand - h.contrib.demand, hzp: k.hzp - h.contrib.hzp,
				tok: k.tok - h.contrib.tok, rate: k.rate - h.contrib.rate, rateAt: k.rateAt - h.contrib.rateAt,
				rateH: k.rateH - h.contrib.rateH, use: k.use - h.contrib.use}
			k.mu.Unlock()
			now, over := allot(&qs[i], others, t, hz, h.demand, others.open+1, s.opts.SiteShare)
			atOnce, allotted = min(atOnce, now), min(allotted, over)
		}
		a = next(atOnce, allotted, hz, s.opts.Strategy == RequestsPerTimeUnit, h.short, ss.unit())
	}
	a, send = ss.due(h, a, allotted, t, hz)
	if h.fresh {
		// The first report on a stream is always answered: the client may not hold
		// the assignment its old stream's last response carried.
		send, h.fresh = true, false
	}
	if send && a.kind == kindAllow && h.m.a.kind == kindNone {
		s.metrics.unmatchedBkts.Inc()
	}
	if send {
		h.m.adopt(a)
		h.sentAt = t
	}
	ss.contribute(h, contribution{open: 1, demand: h.demand, hzp: horizonPower(hz)}, hz)
	return a, send, false
}

// due returns the assignment to send for h, and whether to send one, given a, the one
// computed for it: a when h has none or another strategy, when its current one could
// admit more than allotted in the next hz seconds, or when a would admit noticeably
// more (by 5%), or more at all when h is short; the current one again when it would
// expire before the report after next could renew it (Envoy reports at a fixed cadence,
// and a renewal must reach it before the TTL's whole seconds run out, whatever
// reporting_interval says). An equal token bucket keeps its tokens at the client, so a
// renewal costs it nothing. A short holder is spending its burst and has no tokens to
// keep for long: Envoy makes another bucket anew, full when the old one still had a
// token, as a bucket that has denied nothing likely has; the server counts every bucket
// full whatever it holds (model), so the new one admits nothing beyond the allotment. A
// holder whose bucket denied requests has an empty one, which a new bucket would not
// fill: it keeps the 5% step.
func (ss *session) due(h *holder, a assignment, allotted, t, hz float64) (assignment, bool) {
	cur := h.m.a
	if cur.kind == kindNone || cur.kind != a.kind {
		return a, true
	}
	renew := t-h.sentAt+renewMargin*max(hz, ss.srv.opts.ReportingInterval.Seconds())+1 > ss.srv.ttl.Seconds()
	if a.kind != kindTokens && a.kind != kindPerUnit {
		return cur, renew
	}
	if a == cur {
		return a, renew
	}
	u := ss.unit()
	have := h.m.potential(hz, u)
	if have > allotted+1e-9 {
		return a, true
	}
	probe := h.m
	probe.adopt(a)
	if grown := probe.potential(hz, u); grown > 1.05*have+1 || h.short && grown > have {
		return a, true
	}
	return cur, renew
}

// renewMargin is how many reporting periods before its expiry an assignment is renewed:
// one for the next report, and half of one for a report that comes late.
const renewMargin = 1.5

// aheadSlack is how long after a holder's next report, in seconds, the room is looked at.
const aheadSlack = 0.1

// demandMargin is how far above its demand a holder's unreported admissions are taken
// to go (contribute).
const demandMargin = 1.25

// rekey makes h contribute to the keys of qs, in their order, taking its contribution
// from keys it no longer holds (the rules changed).
func (ss *session) rekey(h *holder, qs []enforcer.Quota) {
	same := len(h.keys) == len(qs)
	for i := 0; same && i < len(qs); i++ {
		same = h.keys[i].name == qs[i].Key
	}
	if same {
		return
	}
	ss.release(h)
	for i := range qs {
		h.keys = append(h.keys, ss.srv.keys.acquire(qs[i].Key, func() *keyState { return new(keyState) }))
	}
}

// contribute replaces h's contribution to its keys with c plus its model's tokens and rate.
func (ss *session) contribute(h *holder, c contribution, hz float64) {
	r := h.m.a.rate(ss.unit())
	if h.m.a.kind == kindTokens && h.demand > 0 {
		// What a holder admits between reports is bounded by its refill, and in
		// practice by its demand: one that asks for far less than its rate is counted
		// at its demand with a margin. It errs low only while a holder's demand jumps,
		// by at most its rate for a reporting period; a holder at its rate is counted
		// at its rate.
		r = min(r, demandMargin*h.demand)
	}
	c.tok, c.rate, c.rateAt, c.rateH = h.m.tok, r, r*h.m.last, r*hz
	if h.m.a.kind == kindPerUnit {
		c.tok = h.m.potential(0, ss.unit())
	}
	// What it plausibly admits until its next report (keyState.ahead): its demand over the
	// period, at most all it can; all it can until its demand has been measured over a
	// period (a new bucket's first report comes at once, and tells little of its rate).
	c.use = c.tok + c.rateH
	if h.period > 0 {
		c.use = min(c.use, h.demand*hz)
	}
	for _, k := range h.keys {
		k.mu.Lock()
		k.add(h.contrib, -1)
		k.add(c, 1)
		k.mu.Unlock()
	}
	h.contrib = c
}

// release takes h's contribution from its keys and lets them go.
func (ss *session) release(h *holder) {
	for _, k := range h.keys {
		k.mu.Lock()
		k.add(h.contrib, -1)
		k.mu.Unlock()
		ss.srv.keys.release(k)
	}
	h.keys = h.keys[:0]
	h.contrib = contribution{}
}

// close ends the session at now: its clients may go on admitting on their last
// assignments until these expire, so their buckets stay reserved, shares included, until
// then (Sweep) or until a new stream takes them over (takeOver).
func (ss *session) close(now time.Time) {
	s := ss.srv
	s.metrics.streams.Dec()
	t := s.since(now)
	ss.until = t
	for _, h := range ss.byReq {
		// Its contribution stays whole, its share of the room included: the client goes
		// on admitting at its assigned rate until it reports again on another stream or
		// its assignment expires, and the open holders must not hand out that share too.
		if h.m.a.kind != kindNone {
			ss.until = max(ss.until, h.sentAt+s.ttl.Seconds())
		}
		h.phase, h.phased = h.m.last, ss.tick >= 0
		if h.phased {
			h.phase = ss.tick // a new bucket's report comes off the timer's phase
		}
		h.req.mu.Lock()
		h.req.orphans = append(h.req.orphans, h)
		h.req.mu.Unlock()
		s.metrics.buckets.Dec()
		s.metrics.drainingBkts.Inc()
	}
	s.drainMu.Lock()
	s.draining = append(s.draining, ss)
	s.drainMu.Unlock()
}

// drain releases a closed session's buckets once their assignments have expired.
func (ss *session) drain() {
	for _, h := range ss.byReq {
		req := h.req
		req.mu.Lock()
		taken := h.taken
		if !taken {
			h.taken = true
			if i := slices.Index(req.orphans, h); i >= 0 {
				req.orphans = slices.Delete(req.orphans, i, i+1)
			}
		}
		req.mu.Unlock()
		if !taken {
			ss.srv.metrics.drainingBkts.Dec()
			ss.release(h)
			ss.srv.uncharge(h.addr, h.bytes)
		}
		ss.srv.requests.release(req)
	}
}

func (ss *session) unit() time.Duration {
	d, _ := unitDuration(ss.srv.opts.Unit)
	return d
}

// tableEntry is what a shared table (sharedTable) keeps of each value: its name and how many
// hold it, under the table's shard lock.
type tableEntry struct {
	name string
	refs int
}

// sharedTable holds values by name while someone holds them, in 64 mutex-guarded shards:
// acquire makes a value on first use, release drops it with its last holder. The server
// keeps its requests (by bucket id) and its keys' states (by counter key) in one each.
type sharedTable[V any, P interface {
	*V
	entry() *tableEntry
}] struct {
	shards [64]struct {
		mu sync.Mutex
		m  map[string]P
	}
}

func (t *sharedTable[V, P]) init() {
	for i := range t.shards {
		t.shards[i].m = map[string]P{}
	}
}

// acquire returns the value named name, made by newV if there is none, with one more
// holder.
func (t *sharedTable[V, P]) acquire(name string, newV func() P) P {
	sh := &t.shards[fnv(name)&63]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	v := sh.m[name]
	if v == nil {
		v = newV()
		v.entry().name = name
		sh.m[name] = v
	}
	v.entry().refs++
	return v
}

// release drops one holder of v, and v itself with the last.
func (t *sharedTable[V, P]) release(v P) {
	h := v.entry()
	sh := &t.shards[fnv(h.name)&63]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if h.refs--; h.refs == 0 {
		delete(sh.m, h.name)
	}
}

// len returns the number of values held.
func (t *sharedTable[V, P]) len() int {
	n := 0
	for i := range t.shards {
		t.shards[i].mu.Lock()
		n += len(t.shards[i].m)
		t.shards[i].mu.Unlock()
	}
	return n
}

func (r *request) entry() *tableEntry  { return &r.tableEntry }
func (k *keyState) entry() *tableEntry { return &k.tableEntry }

// requestOf returns the request of bucket id in domain from t, with one more holder.
func requestOf(t *sharedTable[request, *request], domain string, id map[string]string) *request {
	return t.acquire(domain+"\x00"+canonical(id), func() *request { return &request{id: id} })
}

// fnv is the FNV-1a hash of s, for the tables' shards.
func fnv(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}
