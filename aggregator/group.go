package aggregator

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/streamlimit/streamlimit/topics"
)

// The consumer group: what a member does when it is given partitions, when it hands them
// over, when it loses them, and when it leaves. The balancer that decides who owns what is
// in balancer.go.

// groupHeartbeat is the group heartbeat interval for a session timeout: how soon a member
// learns that a rebalance began (a member joined, left, or gave up a slot that moves) and
// joins it, which is most of the time a slot that moves goes unpublished. At most a quarter
// of a second (four small requests a second per member), and at least twenty fit in a
// session timeout.
func groupHeartbeat(session time.Duration) time.Duration {
	return max(min(session/20, 250*time.Millisecond), 10*time.Millisecond)
}

// joinWaitAfter is how long a JoinGroup may take before the member logs that the rebalance
// waits for other members: every live member joins within a group heartbeat interval of
// the rebalance's start, so longer means that the group waits for one that does not answer
// (it died without leaving, and is waited for until its session times out) or that is
// slow to give up its partitions.
func joinWaitAfter(session time.Duration) time.Duration {
	return max(time.Second, 2*groupHeartbeat(session))
}

// onAssigned runs when the group gives this member partitions. With the cooperative
// balancer those are only the partitions it did not hold: what it keeps goes on being
// counted and published throughout. Each new partition is positioned by adjust and replayed
// before its slot is published again (invariant 1).
func (a *Aggregator) onAssigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.admin == nil {
		a.admin = kadm.NewClient(cl)
	}
	now := time.Now()
	n := 0
	for t, ps := range assigned {
		for _, p := range ps {
			if k := (tp{t, p}); a.parts[k] == nil {
				a.parts[k] = &partState{fresh: true, assignedAt: now}
			}
			n++
		}
	}
	a.joined = true
	a.recomputePaused()
	if a.sessionErrs > 0 {
		a.log.Info("rejoined the group", "failed_attempts", a.sessionErrs)
		a.sessionErrs = 0
	}
	if n == 0 {
		return
	}
	a.m.groupEvents.WithLabelValues(eventAssigned).Inc()
	a.m.groupPartitions.WithLabelValues(eventAssigned).Add(float64(n))
	a.log.Info("partitions assigned", "slots", slotsOf(assigned), "partitions", n, "assigned", assigned,
		"holding", len(a.parts), "stopping", a.stopping)
}

// slotsOf returns the slots (partition numbers) of a set of partitions, sorted.
func slotsOf(parts map[string][]int32) []int32 {
	var out []int32
	for _, ps := range parts {
		for _, p := range ps {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	slices.Sort(out)
	return out
}

// adjust positions the newly assigned partitions: each seeks to the first offset at or after
// now − MaxWindow − Lateness and replays up to the high watermark listed now. A partition
// already positioned (an assignment repeated after an interrupted offset fetch) continues
// where it is.
func (a *Aggregator) adjust(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	names := make([]string, 0, len(offsets))
	for t := range offsets {
		names = append(names, t)
	}
	seekMs := a.cfg.Clock.Now().Add(-a.cfg.MaxWindow - a.cfg.Lateness).UnixMilli()
	a.mu.Lock()
	adm := a.admin
	a.mu.Unlock()
	if adm == nil {
		return nil, fmt.Errorf("aggregator: offsets adjusted before assignment")
	}
	// The end offsets first. Where no record is as recent as seekMs (an empty partition, or
	// one that has only older records), the broker answers the listing by time with none,
	// and kadm asks again for the end offset in a request of its own: a hit written between
	// the two requests is behind the offset it answers. Clamped to the end offsets listed
	// before, the replay starts at or before any such record (TestHitWritten*IsCounted).
	ends, err := adm.ListEndOffsets(ctx, names...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("aggregator: list end offsets: %w", err)
	}
	starts, err := adm.ListOffsetsAfterMilli(ctx, seekMs, names...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("aggregator: list offsets by time: %w", err)
	}
	details, err := adm.ListTopics(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("aggregator: describe hits topics: %w", err)
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	counts := map[int32][]string{}
	for _, t := range names {
		if d, ok := details[t]; ok && d.Err == nil {
			n := int32(len(d.Partitions))
			a.nparts[t] = n
			counts[n] = append(counts[n], t)
		}
	}
	if len(counts) > 1 {
		a.log.Error("hits topics have different partition counts: a key's hits may reach two owners and be counted twice or split; give every hits topic the same partition count", "topics_by_partitions", counts)
	}
	now := time.Now()
	var positioned, records int64
	for t, parts := range offsets {
		for p := range parts {
			k := tp{t, p}
			ps := a.parts[k]
			if ps == nil {
				ps = &partState{fresh: true, assignedAt: now}
				a.parts[k] = ps
			}
			if !ps.fresh {
				parts[p] = kgo.NewOffset().At(ps.next).WithEpoch(-1)
				continue
			}
			start, end := int64(0), int64(0)
			if o, ok := starts.Lookup(t, p); ok {
				start = o.Offset
			}
			if o, ok := ends.Lookup(t, p); ok {
				end = o.Offset
			}
			if start < 0 || start > end {
				start = end
			}
			*ps = partState{next: start, hwm: end, target: end, replaying: start < end, assignedAt: ps.assignedAt}
			parts[p] = kgo.NewOffset().At(start).WithEpoch(-1)
			positioned++
			if ps.replaying {
				a.replayStarted(now, end-start)
			} else {
				ps.replayedAt = now
				a.m.replayDur.Observe(now.Sub(ps.assignedAt).Seconds())
			}
			a.log.Debug("replaying partition", "topic", t, "partition", p, "from", start, "to", end)
			records += end - start
		}
	}
	switch {
	case records > 0:
		a.log.Info("replay started", "partitions", positioned, "records", records, "from_ms", seekMs,
			"replaying_partitions", a.replayingParts)
	case positioned > 0:
		a.log.Info("partitions positioned; nothing to replay", "partitions", positioned, "from_ms", seekMs)
	}
	a.recomputePaused()
	for slot := range a.slotsDone() {
		a.st.markDirty(slot)
	}
	if a.replayingParts == 0 && positioned > 0 {
		a.kickHeartbeat()
	}
	return offsets, nil
}

// replayStarted counts a partition that begins replaying n records at now. The caller holds
// a.mu.
func (a *Aggregator) replayStarted(now time.Time, n int64) {
	if a.replayingParts == 0 {
		a.replayFrom, a.replayRecords = now, 0
	}
	a.replayingParts++
	a.replayRecords += n
	a.m.replaying.Set(float64(a.replayingParts))
}

// replayDone counts the end of a partition's replay of slot, and logs the end of a batch of
// replays (none left). The caller holds a.mu.
func (a *Aggregator) replayDone(slot int32, ps *partState) {
	a.replayingParts--
	a.m.replaying.Set(float64(a.replayingParts))
	a.log.Debug("partition replayed", "slot", slot, "took", ps.replayedAt.Sub(ps.assignedAt))
	if a.replayingParts == 0 {
		a.log.Info("replay finished", "took", time.Since(a.replayFrom).Round(time.Millisecond), "records", a.replayRecords)
		a.kickHeartbeat()
	}
}

// kickHeartbeat asks for a heartbeat round now: the partitions that finished replaying
// should say so at once rather than at the next tick.
func (a *Aggregator) kickHeartbeat() {
	select {
	case a.hbNow <- struct{}{}:
	default:
	}
}

// slotsDone returns the slots whose every partition is positioned and not replaying.
func (a *Aggregator) slotsDone() map[int32]bool {
	out := map[int32]bool{}
	for k := range a.parts {
		if !a.st.paused[k.part] {
			out[k.part] = true
		}
	}
	return out
}

// onRevoked hands partitions over: the cooperative balancer gives them to another member
// once this one has given them up and joined again. Before dropping them it publishes what
// is due and a last heartbeat, so that the counts topic holds its state as of now, and after
// dropping them it flushes everything it wrote, so that no count of theirs from this member
// can land after the next owner's.
//
// When Run is leaving the group it has published and flushed already (leave), and the
// partitions are only dropped.
func (a *Aggregator) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	n := 0
	for _, ps := range revoked {
		n += len(ps)
	}
	if n == 0 {
		return
	}
	start := time.Now()
	a.mu.Lock()
	stopping := a.stopping
	a.mu.Unlock()
	if !stopping {
		var sc emitScratch
		a.emitRound(ctx, cl, &sc, true)
	}
	a.mu.Lock()
	dropped := a.dropPartitions(revoked)
	a.mu.Unlock()
	// Every round that chose records of the dropped slots has handed them to the client once
	// the write lock is had.
	a.pubMu.Lock()
	//lint:ignore SA2001 an empty critical section is the barrier
	a.pubMu.Unlock()
	var flushErr error
	if !stopping {
		fctx, cancel := context.WithTimeout(ctx, handoverFlush)
		flushErr = cl.Flush(fctx)
		cancel()
	}
	a.m.groupEvents.WithLabelValues(eventRevoked).Inc()
	a.m.groupPartitions.WithLabelValues(eventRevoked).Add(float64(n))
	a.log.Info("partitions revoked", "slots", slotsOf(revoked), "partitions", n, "dropped_slots", dropped,
		"handover", time.Since(start).Round(time.Millisecond), "flush_err", flushErr, "stopping", stopping)
}

// handoverFlush bounds the flush of a revocation: the rebalance waits for it.
const handoverFlush = 2 * time.Second

// dropPartitions forgets the given partitions, and the state of every slot left without a
// partition (the next owner rebuilds it from the log), and returns those slots. A slot that
// keeps some partitions (a hits topic no member consumes any more) keeps its counters:
// the hits already counted from the topic it lost were real. The caller holds a.mu.
func (a *Aggregator) dropPartitions(parts map[string][]int32) []int32 {
	var dropped []int32
	for t, ps := range parts {
		for _, p := range ps {
			k := tp{t, p}
			if s := a.parts[k]; s != nil && s.replaying {
				a.replayingParts--
				a.m.replaying.Set(float64(a.replayingParts))
			}
			delete(a.parts, k)
			// What this source heard of the sites is the next owner's to tell now; left
			// here, its frozen times would read as every site of it going silent.
			delete(a.st.heard, k)
			a.m.lag.DeleteLabelValues(t, strconv.Itoa(int(p)))
			if !slices.Contains(dropped, p) {
				dropped = append(dropped, p)
			}
		}
	}
	kept := dropped[:0]
	for _, slot := range dropped {
		held := false
		for k := range a.parts {
			held = held || k.part == slot
		}
		if !held {
			a.st.dropSlot(slot)
			a.hold.dropSlot(slot)
			a.skew.dropSlot(slot)
			kept = append(kept, slot)
		}
	}
	slices.Sort(kept)
	a.recomputePaused()
	return kept
}

// onLost drops the lost partitions' slots at once: another member may already own them
// (this member's session expired, or it was fenced), so nothing of theirs is published
// any more.
//
// franz-go calls it after every failed attempt of its group loop, so while the brokers are
// unreachable it comes back every retry backoff with nothing left to lose: only a loss of
// held partitions is worth a warning (and the aggregator is not in the group until the
// next assignment; see sessionError for the retries).
func (a *Aggregator) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.joined = false
	n := 0
	for _, ps := range lost {
		n += len(ps)
	}
	if n == 0 {
		a.recomputePaused()
		a.log.Debug("group session failed again; no partitions held")
		return
	}
	dropped := a.dropPartitions(lost)
	a.m.groupEvents.WithLabelValues(eventLost).Inc()
	a.m.groupPartitions.WithLabelValues(eventLost).Add(float64(n))
	a.log.Warn("partitions lost: the group took them away without a handover (this member's session expired or it was fenced); another member replays them",
		"slots", slotsOf(lost), "partitions", n, "dropped_slots", dropped)
}

// leave ends Run's part in the group at once, before anything else can make it wait: it
// publishes the counts due and a heartbeat of every partition it owns and flushes them (its
// state as of now; nothing to commit, since recovery seeks by time), then leaves the group
// with a LeaveGroup of its own. The client's own leave waits for a rebalance in progress to
// end, which can last until a dead member's session times out, and a static member does not
// send one at all: both would keep its slots unpublished for that long. The group then
// gives its slots to the others at once.
func (a *Aggregator) leave(cl *kgo.Client) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	var sc emitScratch
	a.emitRound(ctx, cl, &sc, true)
	a.mu.Lock()
	a.stopping = true
	owned := len(a.parts)
	a.mu.Unlock()
	if err := cl.Flush(ctx); err != nil {
		a.log.Warn("flush on shutdown", "err", err)
	}
	member, _ := cl.GroupMetadata()
	// Stop the client's group loop first: once the broker has removed this member, its next
	// heartbeat would fail and the loop would join again as a new member.
	//lint:ignore SA1012 nil: trigger the leave, do not wait for it
	_ = cl.LeaveGroupContext(nil)
	if member == "" {
		a.log.Info("not in the group; nothing to leave", "took", time.Since(start).Round(time.Millisecond))
		return
	}
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = a.cfg.Group
	req.MemberID = member
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID = member
	if a.static {
		m.InstanceID = &a.cfg.InstanceID
	}
	m.Reason = kmsg.StringPtr("streamlimit aggregator shutting down")
	req.Members = append(req.Members, m)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
		for _, r := range resp.Members {
			if err == nil {
				err = kerr.ErrorForCode(r.ErrorCode)
			}
		}
	}
	if err != nil {
		a.log.Warn("leaving the group", "member", member, "err", err, "took", time.Since(start).Round(time.Millisecond))
		return
	}
	a.m.groupEvents.WithLabelValues(eventLeft).Inc()
	a.log.Info("left the group", "member", member, "partitions", owned, "took", time.Since(start).Round(time.Millisecond))
}

// leaveTimeout bounds leave: the final publication and the LeaveGroup.
const leaveTimeout = 5 * time.Second

// joinWatch times the client's JoinGroup requests (a kgo hook): the broker answers one
// when every member of the group has joined, so a long one means that the group waits for a
// member, which the aggregator logs (and shows in group_rebalance_waiting) while it lasts.
type joinWatch struct {
	a     *Aggregator
	after time.Duration

	mu      sync.Mutex
	timer   *time.Timer
	sent    time.Time
	waiting bool
}

// OnBrokerWrite implements kgo.HookBrokerWrite: a JoinGroup was sent.
func (w *joinWatch) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key != kmsg.JoinGroup.Int16() || err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timer != nil {
		w.timer.Stop()
	}
	w.sent = time.Now()
	sent := w.sent
	w.timer = time.AfterFunc(w.after, func() { w.waited(sent) })
}

// waited runs when the JoinGroup sent at sent has had no answer for w.after.
func (w *joinWatch) waited(sent time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.sent.Equal(sent) || w.waiting {
		return
	}
	w.waiting = true
	w.a.m.joinWaiting.Set(1)
	w.a.m.groupEvents.WithLabelValues(eventWaiting).Inc()
	w.a.log.Warn("rebalance waiting for group members: every member must join before the group assigns anything; a member that died without leaving is waited for until its session times out, while the members that joined go on counting the slots they keep",
		"waited", time.Since(sent).Round(time.Millisecond), "session_timeout", w.a.cfg.SessionTimeout)
}

// OnBrokerE2E implements kgo.HookBrokerE2E: the answer to a JoinGroup came (or it failed).
func (w *joinWatch) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if key != kmsg.JoinGroup.Int16() {
		return
	}
	d := e2e.DurationE2E()
	w.a.m.joinDur.Observe(d.Seconds())
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	if w.waiting {
		w.waiting = false
		w.a.m.joinWaiting.Set(0)
		w.a.log.Info("rebalance wait over", "waited", d.Round(time.Millisecond), "err", e2e.Err())
	}
}

// partitioner places counts and re-routed hits by topics.Partition (Kafka's default
// placement, so that any reader can find a key), and heartbeats — keys under
// topics.ReservedPrefix — on the partition set in Record.Partition, because each heartbeat
// is written to every counts partition (and each lag report to the hits partitions its
// writer owns).
func partitioner() kgo.Partitioner {
	return kgo.BasicConsistentPartitioner(func(string) func(*kgo.Record, int) int {
		return func(r *kgo.Record, n int) int {
			if topics.IsReservedKey(r.Key) {
				return int(r.Partition)
			}
			return int(topics.Partition(r.Key, int32(n)))
		}
	})
}
