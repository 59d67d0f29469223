package algo

import "time"

var slidingLogImpl = impl{
	name:   "sliding_log",
	decide: (*entry).slidingLog,
	// Pruning during the op only dropped expired entries; undo what it recorded and keep
	// the ring it may have grown.
	undo: func(e *entry, saved entry, n int64) { e.unrecord(saved.logDid, saved.logPrevTS, n) },
}

// logState is SlidingLog's part of an entry.
type logState struct {
	log   []logEntry // ring of admissions, oldest at head
	head  int
	n     int   // entries in the ring
	total int64 // hits the ring's entries hold
	// logDid says what the last committed op did to the ring, so that an AllowAll that
	// fails can undo it: logPushed a new entry, or logMerged N into the newest, whose time
	// was logPrevTS before.
	logDid    uint8
	logPrevTS int64
}

// SlidingLogDecision returns the Decision of a request of n under l for SlidingLog, where
// count is the number of timestamps in the log still inside the window (now − ts <
// l.Window), newest is the newest of them minus now (≤ 0; read only when count > 0), and
// oldest is the j-th oldest of them minus now, j = count + n − l.Allowance() (read only
// when the request is denied and n ≤ l.Allowance(), which is exactly when 1 ≤ j ≤ count).
//
// The request fits when count + n ≤ l.Allowance(); taking it logs n timestamps at now.
// ResetAfter is the time until the newest timestamp leaves the window (0 when the log is
// empty); RetryAfter is the time until the j oldest have left it, or Never when n exceeds
// the allowance.
func SlidingLogDecision(count, newest, oldest int64, l Limit, n int64, take bool) Decision {
	a, w := l.Allowance(), int64(l.Window)
	allowed := n <= a && count+n <= a
	if allowed && take && n > 0 {
		count += n
		newest = 0
	}
	d := Decision{Allowed: allowed, Limit: max(a, 0), Remaining: max(a-count, 0)}
	if count > 0 {
		d.ResetAfter = time.Duration(newest + w)
	}
	if !allowed {
		if n > a {
			d.RetryAfter = Never
		} else {
			d.RetryAfter = time.Duration(oldest + w)
		}
	}
	return d
}

func (e *entry) slidingLog(now int64, l Limit, n int64, commit bool) Decision {
	a, w := l.Allowance(), int64(l.Window)
	// Drop entries that left the window (now − ts ≥ w); this never changes a decision.
	for e.n > 0 && now-e.log[e.head].ts >= w {
		e.total -= e.log[e.head].n
		e.head++
		if e.head == len(e.log) {
			e.head = 0
		}
		e.n--
	}
	count := e.total
	var newest, oldest int64
	if e.n > 0 {
		newest = e.log[(e.head+e.n-1)%len(e.log)].ts - now
	}
	if j := count + n - a; j >= 1 && j <= count {
		// The time of the j-th oldest hit: walk the entries until they hold j.
		for i, held := 0, int64(0); i < e.n; i++ {
			le := &e.log[(e.head+i)%len(e.log)]
			if held += le.n; held >= j {
				oldest = le.ts - now
				break
			}
		}
	}
	d := SlidingLogDecision(count, newest, oldest, l, n, commit)
	e.logDid = logNone
	if d.Allowed && commit && n > 0 {
		e.record(now, n, a)
		e.expires = now + w
	}
	return d
}

// MaxLogEntries bounds the entries of one sliding log. Each entry holds the hits admitted
// at one instant, so a log needs one entry per distinct admission time, not per hit; past
// the bound, new hits are added to the newest entry, whose time moves to now. That only
// keeps those hits in the window longer than they would be: coalescing can deny a request
// an exact log would admit, never the reverse. Its cost is a key's memory: at most
// MaxLogEntries × 16 bytes (16 KiB), whatever the limit and the hits per request.
const MaxLogEntries = 1024

// logEntry is n hits admitted at ts (unix ns).
type logEntry struct{ ts, n int64 }

// What the last committed sliding-log op did (entry.logDid).
const (
	logNone uint8 = iota
	logPushed
	logMerged
)

// record logs n hits at now: into the newest entry when it has the same time, or when the
// ring holds MaxLogEntries (coalescing, see MaxLogEntries), else as a new entry. The ring
// grows toward min(a, MaxLogEntries) entries: a log never holds more hits than a.
func (e *entry) record(now, n, a int64) {
	e.total += n
	if e.n > 0 {
		last := &e.log[(e.head+e.n-1)%len(e.log)]
		if last.ts == now || e.n >= MaxLogEntries {
			e.logDid, e.logPrevTS = logMerged, last.ts
			last.ts, last.n = now, last.n+n
			return
		}
	}
	e.push(logEntry{ts: now, n: n}, min(a, MaxLogEntries))
	e.logDid = logPushed
}

// unrecord undoes the last record of n hits, as logDid and logPrevTS describe it.
func (e *entry) unrecord(did uint8, prevTS, n int64) {
	switch did {
	case logPushed:
		e.n--
	case logMerged:
		last := &e.log[(e.head+e.n-1)%len(e.log)]
		last.ts, last.n = prevTS, last.n-n
	default:
		return
	}
	e.total -= n
}

// push appends le to the ring, growing it up to size entries.
func (e *entry) push(le logEntry, size int64) {
	if e.n == len(e.log) {
		grow := max(2*len(e.log), 8)
		if int64(grow) > size {
			grow = int(size)
		}
		if grow <= e.n {
			grow = e.n + 1
		}
		grown := make([]logEntry, grow)
		for i := 0; i < e.n; i++ {
			grown[i] = e.log[(e.head+i)%len(e.log)]
		}
		e.log, e.head = grown, 0
	}
	e.log[(e.head+e.n)%len(e.log)] = le
	e.n++
}
