package rlqs

import (
	"math"
	"math/bits"
	"sync"
	"time"

	"github.com/streamlimit/streamlimit/enforcer"
	sharedroom "github.com/streamlimit/streamlimit/internal/room"
)

// kind is the strategy of an assignment, as the client holds it.
type kind uint8

const (
	// kindNone: no assignment sent (the client decides by its no_assignment_behavior).
	kindNone kind = iota
	// kindAllow: ALLOW_ALL, for a bucket that no global limit applies to.
	kindAllow
	// kindDeny: DENY_ALL, when this client's part of the room is below one request.
	kindDeny
	// kindTokens: a token bucket of burst tokens, refilled with fill tokens per
	// FillInterval.
	kindTokens
	// kindPerUnit: requests_per_time_unit, burst requests per Unit.
	kindPerUnit
)

// assignment is what a holder was told: the strategy and its numbers.
type assignment struct {
	kind  kind
	burst uint32 // max_tokens, or requests_per_time_unit
	fill  uint32 // tokens_per_fill per FillInterval (kindTokens)
}

// FillInterval is the fill_interval of every token bucket the server assigns. Rates are
// tokens_per_fill / FillInterval, so its length is their resolution (1/60 request per
// second); it never changes, because Envoy compares a new token bucket with the one it
// holds by max_tokens, tokens_per_fill and fill_interval's nanoseconds only, so a change of
// whole seconds alone would go unnoticed.
const FillInterval = time.Minute

// rate returns the assignment's refill rate, requests per second.
func (a assignment) rate(unit time.Duration) float64 {
	switch a.kind {
	case kindTokens:
		return float64(a.fill) / FillInterval.Seconds()
	case kindPerUnit:
		return float64(a.burst) / unit.Seconds()
	}
	return 0
}

// keyState is one counter key's holders at this server — the buckets of open or draining
// streams whose requests count toward it — summed, so that a holder's assignment is
// computed from all of them in constant time. Each holder adds its contribution and takes
// it back before changing it.
type keyState struct {
	tableEntry // name: the counter key; holders: contributing, open or draining

	mu     sync.Mutex
	open   int     // holders on open streams
	demand float64 // Σ demand of holders on open streams, requests per second
	hzp    float64 // Σ horizonPower of the horizons of holders on open streams
	tok    float64 // Σ tokens each holder had after its last report
	rate   float64 // Σ refill rates assigned
	rateAt float64 // Σ rate × time of the holder's last report (seconds since the epoch)
	rateH  float64 // Σ rate × the holder's horizon: its refill over one reporting period
	use    float64 // Σ what each holder plausibly admits over one reporting period
}

// contribution is what one holder adds to each of its keys' sums.
type contribution struct {
	open   int
	demand float64
	hzp    float64
	tok    float64
	rate   float64
	rateAt float64
	rateH  float64
	use    float64
}

func (k *keyState) add(c contribution, sign float64) {
	k.open += int(sign) * c.open
	k.demand += sign * c.demand
	k.hzp += sign * c.hzp
	if k.open == 0 {
		k.hzp = 0 // no holder left: no rounding residue either
	}
	k.tok += sign * c.tok
	k.rate += sign * c.rate
	k.rateAt += sign * c.rateAt
	k.rateH += sign * c.rateH
	k.use += sign * c.use
}

// held is, at t, the most the holders may have admitted since their last reports plus
// the tokens they hold: for each, its tokens after its last report plus its refill since.
// Called with k.mu held.
func (k *keyState) held(t float64) float64 {
	return max(k.tok+k.rate*t-k.rateAt, 0)
}

// ahead is, at t, what the holders may plausibly admit from their last reports until
// their next. Its bound is worst: for each, its tokens after its last report plus its
// refill over one reporting period from that report, whatever part of it is spent by t.
// What a holder admits after its next report is allotted at that report, from the room it
// leaves then, and that allotment keeps back what every other holder may admit until its
// own next report: so at every allotment, what all holders can admit until they report
// again fits in the room. Each holder's whole burst and refill is what it can admit, not
// what it does: a holder of a client spread thin is kept a burst of 8 and a period of
// refill, about 11 requests, against the 5 it asks for; kept for every other holder, that
// left a data center's room spent at about one report in a hundred. A holder is counted
// instead at what it plausibly admits (use: its demand over its period, at most its worst),
// and all of them together with plausibleZ standard deviations of a Poisson count of that
// sum: the holders' requests are independent, and their sum's spread is far less than
// the sum of each one's. It errs low only while holders' demands jump together, by at
// most their bursts and refill for one period. A holder whose report is late (a stream
// being started again, a report lost) is counted by its refill since its report when that
// is more. Called with k.mu held.
func (k *keyState) ahead(t float64) float64 {
	worst := max(k.held(t), k.tok+k.rateH, 0)
	use := max(k.use, k.rate*t-k.rateAt, 0)
	return min(worst, use+plausibleZ*math.Sqrt(use))
}

// plausibleZ is the margin, in standard deviations of a Poisson count, over what the
// other holders of a key plausibly admit until their next reports (keyState.ahead).
const plausibleZ = 4.0

// model is the server's picture of one holder's assignment, which the client runs on its
// own: the tokens it may hold and how fast they come back. From it the server knows the
// most the client can admit before its next report, without being told.
type model struct {
	a    assignment
	tok  float64 // tokens after the last report (an upper bound)
	last float64 // time of the last report, seconds since the epoch
}

// afterReport updates m for a report at t of admitted requests. A token bucket's
// tokens are taken to be its whole max_tokens: the server cannot tell what the client
// holds — refill that arrived after the bucket ran dry, fractions of a token, a bucket
// that started full or empty — and max_tokens bounds them all. Assignments keep
// max_tokens small (next), so the bound costs little.
func (m *model) afterReport(t float64, admitted uint64, unit time.Duration) {
	switch m.a.kind {
	case kindTokens:
		m.tok = float64(m.a.burst)
	case kindPerUnit:
		// A fixed window may start again at any instant: its whole allowance is always
		// available as far as the server knows.
		m.tok = float64(m.a.burst)
	default:
		m.tok = 0
	}
	m.last = t
}

// adopt switches m to assignment a. Envoy keeps the tokens of a token bucket equal to the
// one it holds and makes any other anew, full or empty by rules that changed between
// releases (global_client_impl.cc, createTokenBucketFromAction; token_bucket_impl.cc,
// AtomicTokenBucketImpl): the server assumes the worst, a full bucket.
func (m *model) adopt(a assignment) {
	switch a.kind {
	case kindTokens, kindPerUnit:
		m.tok = float64(a.burst)
	default:
		m.tok = 0
	}
	m.a = a
}

// potential is the most the client can admit over the next h seconds on m: its tokens
// and their refill.
func (m *model) potential(h float64, unit time.Duration) float64 {
	if m.a.kind == kindPerUnit {
		// A fixed window of burst per unit admits at most burst × (h/unit + 1) in h.
		return float64(m.a.burst) * (h/unit.Seconds() + 1)
	}
	return m.tok + m.a.rate(unit)*h
}

// horizonPower is what a holder of horizon h adds to its keys' hzp: h⁸, so that the
// power mean of the holders' horizons (longHorizon) is close to the longest of them, and
// equal to it when all are equal, from sums that holders add to and take back from. h is
// taken at most at horizonCap: a sum of eighth powers of long horizons would
// leave, once such a holder takes its part back, a rounding residue whose root is whole
// seconds.
func horizonPower(h float64) float64 { h = min(h, horizonCap); h *= h; h *= h; return h * h }

// horizonCap is the longest horizon horizonPower tells apart: 60 s leaves a residue of
// at most 2^-52 × 60⁸, whose eighth root, under a second, scales no share but those of
// holders reporting more than once a second.
const horizonCap = 60.0

// longHorizon is the power mean of open holders' horizons whose powers sum to hzp.
func longHorizon(hzp float64, open int) float64 {
	return math.Pow(max(hzp, 0)/float64(max(open, 1)), 1.0/8)
}

// share is one holder's part of a key's room, from its demand among the key's open
// holders: each weighs its demand plus a small prior (a twentieth of the mean), so that a
// holder whose requests have only just begun is not shut out.
func share(own, total float64, open int) float64 {
	n := float64(max(open, 1))
	prior := 0.05*total/n + 1e-9
	return (own + prior) / (total + n*prior)
}

// allot returns how many requests a holder may admit over the next h seconds, its tokens
// included (over), and how many of them at once (now), for one quota q. The room is what
// the site's cap leaves: its count h from now (the hits leaving the window by then) for
// over, its count now for now. A holder gets the lesser of what it is given and the room
// less what the other holders may plausibly admit from their last reports until their
// next (keyState.ahead: their demand over a period with a margin, at most the tokens they
// held then and a period of their refill). The second term keeps the limit: at every
// allotment, what all holders plausibly admit until they report again fits in the room. What a holder is given is its share of the room, which keeps
// the holders fair; and, while the key's holders here ask for less than its limit, at
// least what a holder at the larger of its demand and the holders' mean demand may
// plausibly ask for over h and a burst (package room's expected spend, needZ standard
// deviations of margin). Each holder's demand is measured over a period of a few
// requests, so that the shares of a client spread thin over many holders follow the
// chance of which holder its last requests reached: a holder that drew few is otherwise
// given too little for its next period, and denied while the room is far from spent.
// Above its limit a key gets its shares only: there the room is the scarce thing, and
// the shares divide it by demand. others is the key's sums less this holder's
// contribution; t is now, in seconds since the epoch. A holder that reports more often
// than the key's other holders has its share scaled down to its horizon, as if it
// reported as seldom as they do (longHorizon): its share of the room would otherwise be
// handed out anew at each of its reports, and the rate that gives it, which every other
// holder must leave room for over its own longer horizon, would crowd them out.
func allot(q *enforcer.Quota, others contribution, t, h, own float64, open int, part float64) (now, over float64) {
	k := keyState{tok: others.tok, rate: others.rate, rateAt: others.rateAt, rateH: others.rateH, use: others.use}
	held := k.held(t)
	f := share(own, others.demand+own, open)
	// The power mean is h when every holder's horizon is h, or the others' are shorter:
	// the root is taken only when some other holder reports less often.
	if hp := horizonPower(h); others.hzp > float64(open-1)*hp*(1+1e-9) {
		if long := longHorizon(others.hzp+hp, open); h < long {
			f *= (h + BurstSeconds) / (long + BurstSeconds)
		}
	}
	ahead := k.ahead(t)
	room := part * (q.Cap - q.Later)
	give := f * room
	if w, total := q.Window.Seconds(), others.demand+own; w > 0 && total < float64(q.Limit)/w {
		give = max(give, sharedroom.Expected(max(own, total/float64(max(open, 1))), h+BurstSeconds, needZ))
	}
	over = max(min(give, room-ahead), 0)
	room = part * (q.Cap - q.Count)
	now = max(min(f*room, room-held, over), 0)
	return now, over
}

// needZ is the margin, in standard deviations of a Poisson count, of what a holder of a
// key under its limit is given at least (allot): four keep a client at half its limit,
// spread over sixty Envoys of three data centers at about a request a second each,
// denied under 1% of its requests in the simulator over seeds 1–6; three left it at
// 0.8–1.3%.
const needZ = 4.0

// BurstSeconds is how many seconds of its fill rate an assigned token bucket holds
// (max_tokens). A small bucket makes the assignment safe whatever the client's bucket
// does: full or empty at its start, with fractions of a token or without, it admits at
// most max_tokens plus its refill; and the revision of Envoy's token bucket that starts a
// bucket empty unless the host has been up longer than max_tokens ÷ fill rate starts it
// full after the first second. Large enough to absorb the bunching of random arrivals at
// a client's fair rate.
const BurstSeconds = 1.0

// MinBurst is the least max_tokens of a holder allotted three times as much or more.
const MinBurst = 8

// next returns the assignment that lets a holder admit at most over requests over the
// next h seconds: DENY_ALL below one request; otherwise a token bucket filled at the
// fair rate over ÷ (h + BurstSeconds), rounded down to a coarse grid (quantize), holding
// BurstSeconds of it (at least one token), so that max_tokens plus h of refill stays
// within over whether it starts full or empty; or requests_per_time_unit such that a
// fixed window of it, which may start at once, stays within now and, over h, within over.
// The grid keeps an assignment equal from report to report while the room moves a
// little, and Envoy keeps the tokens of an equal token bucket. A holder spending its
// burst (exact: short, see session.due) has none to keep for long, and is assigned its
// rate off the grid, rounded down to the fill's resolution only: on the grid, a rate up to
// a step (1/16) below its allotment gives it the bucket it holds, whose burst it has spent.
func next(now, over, h float64, perUnit, exact bool, unit time.Duration) assignment {
	if over < 1 {
		return assignment{kind: kindDeny}
	}
	if perUnit {
		n := min(math.Floor(over/(h/unit.Seconds()+1)), math.Floor(now))
		if n < 1 {
			return assignment{kind: kindDeny}
		}
		return assignment{kind: kindPerUnit, burst: uint32(min(n, math.MaxUint32))}
	}
	fi := FillInterval.Seconds()
	r := over / (h + BurstSeconds)
	// A slow holder's burst is a few requests rather than a second of its rate, which
	// would be one: random arrivals bunch, and a bucket of one denies the second of two
	// close requests however slow the client.
	low := min(MinBurst, math.Floor(over/3))
	burst := max(math.Floor(r*BurstSeconds), low, 1)
	fill := math.Floor(min(r, (over-burst)/h) * fi)
	if !exact {
		fill = quantize(fill)
	}
	// The burst follows the rate on the grid, so that equal rates make equal buckets.
	burst = max(math.Floor(fill/fi*BurstSeconds), low, 1)
	// A rate below the grid's least (a token a minute) still gets one: the bucket's
	// validation refuses zero; it overshoots over by at most h/60 of a request.
	fill = max(fill, 1)
	return assignment{kind: kindTokens, burst: uint32(min(burst, math.MaxUint32)), fill: uint32(min(fill, math.MaxUint32))}
}

// quantize rounds a fill count down to 5 significant bits (steps of at most 1/16), so
// that assignments move in steps rather than with every report.
func quantize(f float64) float64 {
	if f < 32 {
		return max(f, 0)
	}
	n := uint64(min(f, math.MaxUint32))
	shift := bits.Len64(n) - 5
	return float64(n >> shift << shift)
}
