package algo

// entry is the state of one counter. Each algorithm's file defines the part of it that the
// algorithm uses; one struct for all of them keeps the Store's map monomorphic and lets a
// key change algorithm on a rules reload.
type entry struct {
	alg    Algorithm
	window int64 // ns

	bucketState  // token bucket, leaky bucket, GCRA (bucket.go)
	windowState  // fixed window and sliding window (fixed_window.go)
	slidingState // sliding window, beside windowState (sliding_window.go)
	logState     // sliding log (sliding_log.go)

	// expires is the instant from which the entry is indistinguishable from a new one, so
	// removing it then changes no decision.
	expires int64
	// fill is the share of its limit the counter had used after its last decision (1 at
	// the limit or denied), what a full store keeps counters by. It only overstates what
	// is used now, as the counter drains: a counter is kept longer, never evicted early.
	fill float32
	busy bool // held by an AllowAll in progress; never evicted then
}

// note records in e the share of its limit used after decision d.
func (e *entry) note(d Decision) {
	switch {
	case !d.Allowed || d.Limit <= 0 || d.Remaining <= 0:
		e.fill = 1
	default:
		e.fill = float32(1 - float64(d.Remaining)/float64(d.Limit))
	}
}

// adopt makes e fit op: a new key, or a key reused with another algorithm or window
// (a rules reload), starts empty; an algorithm whose state depends on the allowance keeps
// it across a change of the allowance alone (see impl.keep).
func (e *entry) adopt(op *Op) {
	w := int64(op.Limit.Window)
	if e.alg == op.Algorithm && e.window == w && e.window != 0 {
		if keep := algorithms[e.alg].keep; keep != nil {
			keep(e, op.Limit)
		}
		return
	}
	log := e.log[:0]
	busy, fill := e.busy, e.fill
	*e = entry{alg: op.Algorithm, window: w, busy: busy, fill: fill}
	e.log, e.den = log, op.Limit.Allowance()
}

// decide evaluates op against e at now (unix ns) and, when commit is set and the request
// fits, takes op.N. e must already be adopted for op.
func (e *entry) decide(now int64, op *Op, commit bool) Decision {
	return algorithms[op.Algorithm].decide(e, now, op.Limit, op.N, commit)
}

// noteUndo records in saved, e's copy from before an op of an AllowAll, what the op did
// that the copy cannot tell (which sliding-log entry it changed), so that the op can be
// undone if the AllowAll fails.
func (saved *entry) noteUndo(e *entry) {
	saved.logDid, saved.logPrevTS = e.logDid, e.logPrevTS
}
