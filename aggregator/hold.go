package aggregator

// Holding this data center's own hits back.
//
// An aggregator reads its own data center's hits a local hop after they are made, and the
// other data centers' a replication later. Counted as they arrive, its counts would show
// its own sites fresher than the other data centers' aggregators show them — and every data
// center's enforcers would see themselves fresher than the rest, spend the room the others'
// recent traffic has not yet taken from the counts, and share it by demand that they see
// more of for themselves: each site's part of the room would be larger in its own eyes
// than in anyone else's. So the aggregator holds its local records back by the difference
// between the two lags it measures (arrival time minus bucket start, averaged, for local
// and for replicated records), and every data center's counts describe every site as of
// about the same moment. The sites' own exact counts make up the difference in the
// enforcers.

// lagEstimate is an exponentially weighted average of arrival lags, in milliseconds.
type lagEstimate struct {
	v float64
	n int
}

// lagWeight is the weight of a new sample once the first lagWarmup samples are averaged.
const (
	lagWeight = 0.02
	lagWarmup = 50
	// maxLagSample discards samples of records more than this late (a backlog after an
	// outage), which say nothing about the steady lag, and of records stamped more than
	// this far ahead.
	maxLagSample = 5_000
)

// add takes a sample of a record's lag. A negative lag is a record stamped ahead of this
// clock: the sites' clock is ahead of the aggregator's by more than the lag. It is taken
// as it is: the hold is the difference of two lags, in which an offset common to the
// local and the remote sites cancels out only if neither estimate drops the samples it
// makes negative. Dropping them (as this did) kept the local estimate to its records
// late enough to show a positive lag, held the local records too little, and showed this
// data center's sites fresher than the others: with every site 100 ms ahead of its
// aggregator, one client spread over three data centers got 1.28× its limit.
func (e *lagEstimate) add(sample int64) {
	if sample < -maxLagSample || sample > maxLagSample {
		return
	}
	e.n++
	w := lagWeight
	if e.n <= lagWarmup {
		w = 1 / float64(e.n)
	}
	e.v += (float64(sample) - e.v) * w
}

// held is a local record waiting to be counted.
type held struct {
	release int64 // ms, the aggregator's clock
	slot    int32
	h       hitRef
	origin  string
	expiry  int64
	site    bool   // a site record: h.site and h.bucketStart are its site and time
	leave   bool   // the site record is a leave
	topic   string // a site record's topic, with slot its source
	inst    string // the site record's instance and counter
	counter string
}

// holder keeps local records back by the measured lag difference. It is not safe for
// concurrent use: the Aggregator guards it with its mutex.
type holder struct {
	local, remote lagEstimate
	max           int64 // ms, the longest hold
	q             []held
	last          int64
}

// sample records the lag of a record that arrived at now.
func (h *holder) sample(now, stamp int64, remote bool) {
	if remote {
		h.remote.add(now - stamp)
	} else {
		h.local.add(now - stamp)
	}
}

// delay returns how long a local record arriving now is held: the replicated records' lag
// less the local ones', within [0, max]; 0 until both have been measured.
func (h *holder) delay() int64 {
	if h.remote.n == 0 || h.local.n == 0 {
		return 0
	}
	return min(max(int64(h.remote.v-h.local.v), 0), h.max)
}

// push queues a local record at now. Records leave in the order they came.
func (h *holder) push(now int64, it held) {
	it.release = max(now+h.delay(), h.last)
	h.last = it.release
	h.q = append(h.q, it)
}

// due removes and returns the records whose time has come at now (into dst).
func (h *holder) due(now int64, dst []held) []held {
	k := 0
	for k < len(h.q) && h.q[k].release <= now {
		k++
	}
	dst = append(dst, h.q[:k]...)
	clear(h.q[:k])
	h.q = h.q[k:]
	if len(h.q) == 0 {
		h.q = h.q[:0:0]
	}
	return dst
}

// dropSlot forgets the held records of slot (its partitions went to another instance,
// which replays them).
func (h *holder) dropSlot(slot int32) {
	keep := h.q[:0]
	for _, it := range h.q {
		if it.slot != slot {
			keep = append(keep, it)
		}
	}
	clear(h.q[len(keep):])
	h.q = keep
}
