package sim

import (
	"slices"
	"time"
)

// DCResult is what one data-center run measured, over the requests at or after the end of
// the warm-up window, against an exact global sliding-window log per client (the oracle)
// run on the same requests on its own.
type DCResult struct {
	Config DCConfig
	// Clients, Requests, Admitted: streamlimit's decisions; OracleAdmitted: the oracle's on
	// the same requests.
	Clients                            int
	Requests, Admitted, OracleAdmitted int64
	// MaxRatio is the largest number of one client's requests admitted in any sliding window
	// (t−W, t], over all data centers, divided by the limit (evaluated at each admission);
	// ClientsOver counts the clients for which it exceeds 1.02.
	MaxRatio    float64
	ClientsOver int
	// FalseLiteral counts the requests streamlimit denied that the oracle admitted.
	// FalseBehind counts those of them at which streamlimit had admitted the client fewer
	// requests in (t−W, t] than the oracle had: a client held below what an exact global
	// limiter gives it, not two exact limiters admitting at slightly different instants.
	FalseLiteral, FalseBehind int64
	// UnderRequests and UnderFalse are the requests and FalseBehind of the clients whose load
	// is under their limit (the ones an exact limiter never refuses).
	UnderRequests, UnderFalse int64
	// MigratingRequests and MigratingFalse are the requests and FalseBehind of migrating
	// clients.
	MigratingRequests, MigratingFalse int64
	// MoveDelays are, for every move of a migrating client whose first request at the new
	// data center the oracle admitted, the milliseconds until streamlimit admitted one there.
	MoveDelays []int64
	// Phases are the figures of the scenario's named intervals (the cut, after healing,
	// after the failover): the largest one-client window ratio among admissions in it.
	Phases []PhaseResult
	// AggregatorErrors and SnapshotErrors count records refused; they should be zero.
	AggregatorErrors, SnapshotErrors int64
	// Clocks are the enforcer processes' clocks and what their snapshots showed of them
	// (DCConfig.ClockSkew, ClockOffsets), in the order the processes first started.
	Clocks []ProcClock
}

// ProcClock is one enforcer process's clock offset from true time and what its snapshot's
// skew meter (snapshot.Snapshot.ClockSkew, CheckClock) showed of it, sampled every second
// after the warm-up.
type ProcClock struct {
	Site   string
	Offset time.Duration
	// Ahead and Behind are the largest ClockSkew readings.
	Ahead, Behind time.Duration
	// Checks counts the samples, Unready those at which CheckClock failed (the process
	// would have been taken out of service).
	Checks, Unready int
	// Estimated counts the samples at which an aggregator had an estimate of the
	// process's clock (aggregator.Memory.ClockOffset), one per aggregator, and EstimateErr
	// is the largest error of those estimates against the true offset between the two
	// clocks plus the local hop (what the estimate is of), held to clock.MaxAhead as the
	// estimates are.
	Estimated   int
	EstimateErr time.Duration
}

// PhaseResult is the largest ratio of admissions in a window to the limit, over the
// admissions within a named interval.
type PhaseResult struct {
	Name     string
	MaxRatio float64
}

// Ratio returns Admitted / OracleAdmitted.
func (r *DCResult) Ratio() float64 {
	if r.OracleAdmitted == 0 {
		return 0
	}
	return float64(r.Admitted) / float64(r.OracleAdmitted)
}

// log is a client's admission times in a sliding window.
type slidingLog struct {
	t    []int64
	head int
}

// count returns how many times in the log lie in (now−w, now].
func (l *slidingLog) count(now, w int64) int64 {
	for l.head < len(l.t) && l.t[l.head] <= now-w {
		l.head++
	}
	if l.head > 256 && l.head*2 > len(l.t) {
		l.t = append(l.t[:0], l.t[l.head:]...)
		l.head = 0
	}
	return int64(len(l.t) - l.head)
}

type dcClientAcc struct {
	ours, oracle slidingLog
	maxCount     int64
	moveAt       int64 // ms of the last move not yet admitted at the new site, or −1
}

type dcAccounting struct {
	cfg     DCConfig
	limit   int64 // the oracle's limit per wMs: Limit per Window, or Burst per Burst/rate
	plan    *dcPlan
	wMs     int64
	warm    int64
	clients []dcClientAcc
	res     DCResult
	phase   []int64 // max count per phase
}

func newDCAccounting(cfg DCConfig, plan dcPlan, limit int64, countWindow time.Duration) *dcAccounting {
	a := &dcAccounting{cfg: cfg, limit: limit, plan: &plan, wMs: countWindow.Milliseconds(), warm: cfg.Window.Milliseconds(),
		clients: make([]dcClientAcc, len(plan.clients)), phase: make([]int64, len(plan.phases))}
	for i := range a.clients {
		a.clients[i].moveAt = -1
	}
	return a
}

// decide records streamlimit's decision on arrival x, and the oracle's on the same request.
func (a *dcAccounting) decide(x dcArrival, ok bool) {
	c := &a.clients[x.client]
	limit := a.limit
	oracleOK := c.oracle.count(x.t, a.wMs) < limit
	if oracleOK {
		c.oracle.t = append(c.oracle.t, x.t)
	}
	if ok {
		c.ours.t = append(c.ours.t, x.t)
	}
	ours := c.ours.count(x.t, a.wMs)
	steady := x.t >= a.warm
	kind := a.plan.clients[x.client].kind
	if x.moved && oracleOK {
		c.moveAt = x.t
	}
	if c.moveAt >= 0 && ok {
		if steady {
			a.res.MoveDelays = append(a.res.MoveDelays, x.t-c.moveAt)
		}
		c.moveAt = -1
	}
	if !steady {
		return
	}
	a.res.Requests++
	under := a.plan.clients[x.client].load < 1
	if under {
		a.res.UnderRequests++
	}
	if kind == kindMigrating {
		a.res.MigratingRequests++
	}
	if ok {
		a.res.Admitted++
		c.maxCount = max(c.maxCount, ours)
		for i, ph := range a.plan.phases {
			if x.t >= ph.from && x.t < ph.to {
				a.phase[i] = max(a.phase[i], ours)
			}
		}
	}
	if oracleOK {
		a.res.OracleAdmitted++
		if !ok {
			a.res.FalseLiteral++
			// The oracle's count before this request, against ours.
			if ours < c.oracle.count(x.t, a.wMs)-1 {
				a.res.FalseBehind++
				if under {
					a.res.UnderFalse++
				}
				if kind == kindMigrating {
					a.res.MigratingFalse++
				}
			}
		}
	}
}

func (a *dcAccounting) result(r *DCResult) {
	limit := float64(a.limit)
	r.Clients = len(a.clients)
	r.Requests, r.Admitted, r.OracleAdmitted = a.res.Requests, a.res.Admitted, a.res.OracleAdmitted
	r.FalseLiteral, r.FalseBehind = a.res.FalseLiteral, a.res.FalseBehind
	r.UnderRequests, r.UnderFalse = a.res.UnderRequests, a.res.UnderFalse
	r.MigratingRequests, r.MigratingFalse = a.res.MigratingRequests, a.res.MigratingFalse
	r.MoveDelays = a.res.MoveDelays
	slices.Sort(r.MoveDelays)
	for i := range a.clients {
		ratio := float64(a.clients[i].maxCount) / limit
		r.MaxRatio = max(r.MaxRatio, ratio)
		if ratio > 1.02 {
			r.ClientsOver++
		}
	}
	for i, ph := range a.plan.phases {
		r.Phases = append(r.Phases, PhaseResult{Name: ph.name, MaxRatio: float64(a.phase[i]) / limit})
	}
}
