package aggregator

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// onAssigned runs when the group hands this member its partitions (before adjust). With the
// eager range balancer every rebalance revokes everything first, so the new assignment is
// complete: partitions held before and not now are gone, and their slots' state with them.
func (a *Aggregator) onAssigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.admin == nil {
		a.admin = kadm.NewClient(cl)
	}
	now := time.Now()
	in := map[tp]bool{}
	for t, ps := range assigned {
		for _, p := range ps {
			in[tp{t, p}] = true
		}
	}
	dropped := map[int32]bool{}
	for k := range a.parts {
		if !in[k] {
			dropped[k.part] = true
			delete(a.parts, k)
			a.m.lag.DeleteLabelValues(k.topic, strconv.Itoa(int(k.part)))
		}
	}
	for slot := range dropped {
		a.st.dropSlot(slot)
		a.hold.dropSlot(slot)
	}
	for k := range in {
		ps := a.parts[k]
		if ps == nil {
			a.parts[k] = &partState{fresh: true, assignedAt: now}
			continue
		}
		if dropped[k.part] {
			ps.reseek = true
		}
	}
	a.joined = true
	a.recomputePaused()
	if a.sessionErrs > 0 {
		a.log.Info("rejoined the group", "failed_attempts", a.sessionErrs)
		a.sessionErrs = 0
	}
	a.log.Info("partitions assigned", "assigned", assigned, "dropped_slots", len(dropped))
}

// adjust positions every assigned partition: a partition held without interruption
// continues where it was; any other seeks to the first offset at or after
// now − MaxWindow − Lateness and replays up to the high watermark listed now.
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
	starts, err := adm.ListOffsetsAfterMilli(ctx, seekMs, names...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("aggregator: list offsets by time: %w", err)
	}
	ends, err := adm.ListEndOffsets(ctx, names...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("aggregator: list end offsets: %w", err)
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
	for t, parts := range offsets {
		for p := range parts {
			k := tp{t, p}
			ps := a.parts[k]
			if ps == nil {
				ps = &partState{fresh: true, assignedAt: now}
				a.parts[k] = ps
			}
			if !ps.fresh && !ps.reseek && ps.suspended {
				parts[p] = kgo.NewOffset().At(ps.next).WithEpoch(-1)
				ps.suspended = false
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
			*ps = partState{next: start, hwm: end, target: end, replaying: start < end, assignedAt: now}
			parts[p] = kgo.NewOffset().At(start).WithEpoch(-1)
			a.log.Info("replaying partition", "topic", t, "partition", p, "from", start, "to", end)
		}
	}
	a.recomputePaused()
	for slot := range a.slotsDone() {
		a.st.markDirty(slot)
	}
	return offsets, nil
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

// onRevoked pauses the revoked partitions' slots. The state is kept: with the eager
// protocol a revoked partition is often assigned straight back, and then it continues
// from where it was; onAssigned drops what does not come back.
func (a *Aggregator) onRevoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for t, ps := range revoked {
		for _, p := range ps {
			if s := a.parts[tp{t, p}]; s != nil {
				s.suspended = true
			}
		}
	}
	a.recomputePaused()
}

// onLost drops the lost partitions' slots at once: another member may already own them.
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
	for t, ps := range lost {
		for _, p := range ps {
			delete(a.parts, tp{t, p})
			a.m.lag.DeleteLabelValues(t, strconv.Itoa(int(p)))
			a.st.dropSlot(p)
			a.hold.dropSlot(p)
		}
	}
	// Partitions of a dropped slot that are still held must be positioned by time again.
	for t, ps := range lost {
		for _, p := range ps {
			for k, s := range a.parts {
				if k.part == p {
					s.reseek, s.suspended = true, true
				}
			}
			_ = t
		}
	}
	a.recomputePaused()
	a.log.Warn("partitions lost", "lost", lost)
}

// partitioner places counts and re-routed hits by Kafka's default murmur2 key hash (what
// the Java client does, so that any reader can find a key), and heartbeats — keys under
// topics.ReservedPrefix — on the partition set in Record.Partition, because each heartbeat
// is written to every counts partition.
func partitioner() kgo.Partitioner {
	return kgo.BasicConsistentPartitioner(func(string) func(*kgo.Record, int) int {
		return func(r *kgo.Record, n int) int {
			if topics.IsReservedKey(r.Key) {
				return int(r.Partition)
			}
			return int(kafkaPartition(r.Key, int32(n)))
		}
	})
}

// kafkaPartition is Kafka's default partition of key among n partitions:
// toPositive(murmur2(key)) % n.
func kafkaPartition(key []byte, n int32) int32 {
	return partitionOf(murmur2(key), n)
}

// partitionOf is kafkaPartition for a key whose murmur2 hash is h.
func partitionOf(h uint32, n int32) int32 {
	return int32((h & 0x7fffffff) % uint32(n))
}

// murmur2 is Kafka's murmur2 hash (org.apache.kafka.common.utils.Utils.murmur2).
func murmur2(b []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(b))
	for len(b) >= 4 {
		k := uint32(b[3])<<24 | uint32(b[2])<<16 | uint32(b[1])<<8 | uint32(b[0])
		b = b[4:]
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
