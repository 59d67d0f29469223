package sim

// Result is what one run measured. Counts cover the steady state: requests at or after the
// end of the warm-up. In short: the number of admitted requests in the sliding window
// (t−W, t] over all sites, divided by the limit (max and mean); admitted requests against
// an exact global log run separately on the same requests (Oracle); and, decision by
// decision, whether streamlimit admitted a request although its own admitted history
// already held the limit in (t−W, t] (wrongly allowed), or denied one although it held
// less (wrongly denied).
type Result struct {
	// Config is the run's configuration with defaults filled in.
	Config Config
	// Requests, Admitted: the heavy client's requests and how many streamlimit admitted.
	Requests, Admitted int64
	// MaxRatio is the largest number of admitted requests in any sliding window (t−W, t]
	// that lies wholly in the steady state (t−W ≥ end of warm-up), divided by the limit.
	// It is evaluated at every admission, where the maximum is reached.
	MaxRatio float64
	// ColdMaxRatio is the same maximum over the windows that overlap the warm-up, which
	// holds the key's first contact with the enforcers (cold start).
	ColdMaxRatio float64
	// MeanRatio is the mean, over a 10 ms grid of the same windows as MaxRatio, of the
	// admitted count in (t−W, t], divided by the limit.
	MeanRatio float64
	// WronglyAllowed counts requests streamlimit admitted although the admitted count in
	// (t−W, t] before them, by streamlimit's own admitted history, was already at least
	// the limit; WronglyDenied those it denied although that count was below the limit.
	// That is, each decision is compared with what an exact global sliding-window log
	// would have decided in streamlimit's place.
	WronglyAllowed, WronglyDenied int64
	// Ideal is what an exact global sliding-window log would have admitted of the same
	// requests, run on its own (Oracle).
	Ideal Ideal
	// LightRequests and LightDenied count the light clients' requests (all of the run)
	// and their denials, which should be zero.
	LightRequests, LightDenied int64
	// AggregatorErrors and SnapshotErrors count records the real aggregator or snapshot
	// refused; they should be zero.
	AggregatorErrors, SnapshotErrors int64
	// Trace holds the series of Config.Trace.
	Trace Trace
}

// WrongPercent returns wrongly allowed, wrongly denied and both, in percent of Requests.
func (r Result) WrongPercent() (allowed, denied, both float64) {
	if r.Requests == 0 {
		return 0, 0, 0
	}
	f := 100 / float64(r.Requests)
	return float64(r.WronglyAllowed) * f, float64(r.WronglyDenied) * f, float64(r.WronglyAllowed+r.WronglyDenied) * f
}

// AdmittedVsIdeal returns Admitted / Ideal.Admitted: below 1 means streamlimit admitted
// less than a perfect global limiter would have (under-use), above 1 more.
func (r Result) AdmittedVsIdeal() float64 {
	if r.Ideal.Admitted == 0 {
		return 0
	}
	return float64(r.Admitted) / float64(r.Ideal.Admitted)
}

// Ideal is the exact global sliding-window log's outcome on the steady-state requests.
type Ideal struct {
	Requests, Admitted int64
}

// Oracle runs an exact global sliding-window log over all sites on arrivals: a request at
// t is admitted iff fewer than limit requests were admitted in (t−W, t]. Requests at the
// same millisecond are decided in order, each seeing the ones before it. It counts the
// requests at or after warmMs.
func Oracle(arrivals []Arrival, limit, wMs, warmMs int64) Ideal {
	var log []int64
	head := 0
	var out Ideal
	for _, a := range arrivals {
		for head < len(log) && log[head] <= a.T-wMs {
			head++
		}
		ok := int64(len(log)-head) < limit
		if ok {
			log = append(log, a.T)
		}
		if a.T >= warmMs {
			out.Requests++
			if ok {
				out.Admitted++
			}
		}
	}
	return out
}

// accounting follows streamlimit's admitted history and measures it against the exact
// rule, decision by decision.
type accounting struct {
	limit, wMs, warmMs int64
	log                []int64 // admission times, ms; log[head:] are in the current window
	head               int
	requests, admitted int64
	wrongA, wrongD     int64
	maxCount, coldMax  int64
	sum                float64
	samples            int64
}

func newAccounting(limit, wMs, warmMs int64) *accounting {
	return &accounting{limit: limit, wMs: wMs, warmMs: warmMs}
}

// count returns the number admitted in (t−W, t].
func (a *accounting) count(t int64) int64 {
	for a.head < len(a.log) && a.log[a.head] <= t-a.wMs {
		a.head++
	}
	if a.head > 4096 && a.head*2 > len(a.log) {
		a.log = append(a.log[:0], a.log[a.head:]...)
		a.head = 0
	}
	return int64(len(a.log) - a.head)
}

// decide records a decision at t.
func (a *accounting) decide(t int64, allowed bool) {
	c := a.count(t)
	steady := t >= a.warmMs
	if steady {
		a.requests++
		switch {
		case allowed && c >= a.limit:
			a.wrongA++
		case !allowed && c < a.limit:
			a.wrongD++
		}
	}
	if allowed {
		a.log = append(a.log, t)
		if steady {
			a.admitted++
		}
		if t-a.wMs >= a.warmMs {
			a.maxCount = max(a.maxCount, c+1)
		} else {
			a.coldMax = max(a.coldMax, c+1)
		}
	}
}

// tick samples the window's count at the end of millisecond t.
func (a *accounting) tick(t int64) {
	if t-a.wMs >= a.warmMs && (t-a.warmMs)%10 == 0 {
		a.sum += float64(a.count(t))
		a.samples++
	}
}

func (a *accounting) result(r *Result) {
	r.Requests, r.Admitted = a.requests, a.admitted
	r.WronglyAllowed, r.WronglyDenied = a.wrongA, a.wrongD
	r.MaxRatio = float64(a.maxCount) / float64(a.limit)
	r.ColdMaxRatio = float64(a.coldMax) / float64(a.limit)
	if a.samples > 0 {
		r.MeanRatio = a.sum / float64(a.samples) / float64(a.limit)
	}
}

// Trace is the time series of a traced run, for the plot.
type Trace struct {
	WindowMs, WarmupMs int64
	Limit              int64
	// Points are sampled every max(W/400, 10) ms over the whole run.
	Points []TracePoint
	// Decisions are the heavy client's decisions in the steady state, at every site.
	Decisions []TraceDecision
}

// TracePoint is one sample of a traced run at T ms since the start.
type TracePoint struct {
	T int64
	// Exact is the number of requests admitted in (T−W, T], over all sites.
	Exact int64
	// Remote and Local are site 0's view at T: the other sites' count from its snapshot
	// and its own exact count; their sum is the estimate it decides on.
	Remote, Local float64
}

// TraceDecision is one decision of a traced run.
type TraceDecision struct {
	T       int64
	Site    int
	Allowed bool
}
