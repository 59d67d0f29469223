package aggregator

import (
	"log/slog"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// BalancerProtocol is the name under which the aggregators' group balancer joins the group.
// Every member of one group must offer it: a member that offers only another protocol (an
// aggregator from before cooperative rebalancing, which used "range") is refused by the
// group until every member offering the old one has gone, and retries until then.
const BalancerProtocol = "streamlimit-cooperative-slots"

// slotBalancer is the aggregators' group balancer. It hands out slots, not partitions: slot
// s is partition s of every hits topic, and the member that owns a slot is assigned
// partition s of every hits topic it subscribes to, so that all hits of a key are counted
// by one member (one key, one owner: docs/architecture.md, invariant 2). Kafka's range
// balancer has that property only because it restarts from nothing at every rebalance
// (eager: every member stops everything); franz-go's cooperative-sticky balancer keeps
// partitions where they are but balances each partition on its own, so partition s of two
// topics can end up with two members.
//
// It is cooperative (KIP-429): a rebalance moves only the slots that change hands, and the
// members keep counting and publishing every other slot throughout. A slot that moves is
// first taken from its owner (which revokes it and joins again) and given to its new owner
// only in the next round, once no other member claims any partition of it: a slot is never
// held by two members, not even for a moment.
//
// The balance is sticky: a member keeps the slots it owns up to its share (the slot count
// over the number of members, give or take one), and only the excess and the slots of
// departed members move, to the members below their share.
type slotBalancer struct {
	log *slog.Logger
}

// ProtocolName implements kgo.GroupBalancer.
func (*slotBalancer) ProtocolName() string { return BalancerProtocol }

// IsCooperative implements kgo.GroupBalancer: members keep their partitions across
// rebalances and give up only those that move.
func (*slotBalancer) IsCooperative() bool { return true }

// JoinGroupMetadata implements kgo.GroupBalancer: the consumer protocol's member metadata
// with the partitions the member owns and the generation it owned them in, which the
// leader needs to keep slots where they are and to move a slot only once it is free.
func (*slotBalancer) JoinGroupMetadata(interests []string, current map[string][]int32, generation int32) []byte {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 3
	meta.Topics = interests
	meta.Generation = generation
	for t, ps := range current {
		o := kmsg.NewConsumerMemberMetadataOwnedPartition()
		o.Topic, o.Partitions = t, ps
		meta.OwnedPartitions = append(meta.OwnedPartitions, o)
	}
	// Deterministic bytes: the broker compares metadata to decide whether a rejoin changes
	// anything.
	slices.SortFunc(meta.OwnedPartitions, func(a, b kmsg.ConsumerMemberMetadataOwnedPartition) int {
		return strings.Compare(a.Topic, b.Topic)
	})
	return meta.AppendTo(nil)
}

// ParseSyncAssignment implements kgo.GroupBalancer.
func (*slotBalancer) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	return kgo.ParseConsumerSyncAssignment(assignment)
}

// MemberBalancer implements kgo.GroupBalancer.
func (b *slotBalancer) MemberBalancer(members []kmsg.JoinGroupResponseMember) (kgo.GroupMemberBalancer, map[string]struct{}, error) {
	cb, err := kgo.NewConsumerBalancer(b, members)
	if err != nil {
		return nil, nil, err
	}
	return cb, cb.MemberTopics(), nil
}

// Balance implements kgo.ConsumerBalancerBalance. It runs on the group's leader only.
func (b *slotBalancer) Balance(cb *kgo.ConsumerBalancer, topics map[string]int32) kgo.IntoSyncAssignment {
	var (
		joined []*kmsg.JoinGroupResponseMember
		in     []slotMember
	)
	cb.EachMember(func(m *kmsg.JoinGroupResponseMember, meta *kmsg.ConsumerMemberMetadata) {
		sm := slotMember{id: m.MemberID, topics: meta.Topics, gen: meta.Generation, owned: map[string][]int32{}}
		if m.InstanceID != nil {
			sm.instance = *m.InstanceID
		}
		for _, o := range meta.OwnedPartitions {
			sm.owned[o.Topic] = append(sm.owned[o.Topic], o.Partitions...)
		}
		joined = append(joined, m)
		in = append(in, sm)
	})
	p := planSlots(in, topics)
	plan := cb.NewPlan()
	for i, give := range p.give {
		for t, ps := range give {
			plan.AddPartitions(joined[i], t, ps)
		}
	}
	if b.log != nil {
		owners := make(map[string]int, len(in))
		for i, n := range p.slotsOf() {
			owners[in[i].name()] = n
		}
		b.log.Info("group balanced (this member leads the group)", "members", len(in), "slots", p.slots,
			"slots_by_member", owners, "moving", p.moving, "unassigned_partitions", p.unsubscribed)
	}
	return plan
}

// slotMember is one member as the balancer sees it.
type slotMember struct {
	id, instance string
	topics       []string           // subscribed hits topics
	owned        map[string][]int32 // partitions it claims to own
	gen          int32              // the generation it owned them in
}

func (m *slotMember) name() string {
	if m.instance != "" {
		return m.instance
	}
	return m.id
}

// slotPlan is the result of planSlots.
type slotPlan struct {
	slots int
	// owner[s] is the index of the member that owns slot s after the rebalance, or -1.
	owner []int
	// give[i] is what member i is assigned in this round: every partition of its slots,
	// except those of a slot another member still claims (it gets them next round).
	give []map[string][]int32
	// moving counts the slots withheld this round because another member still claims them.
	moving int
	// unsubscribed counts partitions left unassigned because their slot's owner does not
	// subscribe to their topic (yet: a topic that matches the pattern since a moment, which
	// the member's metadata has not shown it; it joins again when it does).
	unsubscribed int
}

// slotsOf returns the number of slots each member owns after the rebalance.
func (p *slotPlan) slotsOf() []int {
	n := make([]int, len(p.give))
	for _, i := range p.owner {
		if i >= 0 {
			n[i]++
		}
	}
	return n
}

// planSlots balances the slots of topics (name → partition count) over members, which are
// sorted as the group gives them (by instance id, then member id), so that every leader
// plans alike. It is a pure function, the whole of the balancing rule.
func planSlots(members []slotMember, topics map[string]int32) slotPlan {
	var slots int32
	for _, n := range topics {
		slots = max(slots, n)
	}
	p := slotPlan{slots: int(slots), owner: make([]int, slots), give: make([]map[string][]int32, len(members))}
	for i := range p.give {
		p.give[i] = map[string][]int32{}
	}
	for s := range p.owner {
		p.owner[s] = -1
	}
	// Members that subscribe to none of the topics (none yet known) get nothing.
	var active []int
	for i, m := range members {
		for _, t := range m.topics {
			if topics[t] > 0 {
				active = append(active, i)
				break
			}
		}
	}
	if len(active) == 0 || slots == 0 {
		return p
	}

	// Who claims each slot, and who keeps it: of its claimants, the one that owned it in the
	// latest generation (a member that missed rebalances may still claim what has since
	// moved on), the first in the group's order among equals.
	claimed := make([][]int, slots)
	keeper := make([]int, slots)
	for s := range keeper {
		keeper[s] = -1
	}
	isActive := make([]bool, len(members))
	for _, i := range active {
		isActive[i] = true
	}
	for i, m := range members {
		for _, ps := range m.owned {
			for _, s := range ps {
				if s < 0 || s >= slots || slices.Contains(claimed[s], i) {
					continue
				}
				claimed[s] = append(claimed[s], i)
				if !isActive[i] {
					continue
				}
				if k := keeper[s]; k < 0 || m.gen > members[k].gen {
					keeper[s] = i
				}
			}
		}
	}
	kept := make([][]int32, len(members))
	for s, k := range keeper {
		if k >= 0 {
			kept[k] = append(kept[k], int32(s))
		}
	}

	// Shares: slots / members each, and one more for as many members as the remainder,
	// chosen among those that keep the most already (fewer moves), then in group order.
	base, extra := int(slots)/len(active), int(slots)%len(active)
	byKept := slices.Clone(active)
	slices.SortStableFunc(byKept, func(a, b int) int { return len(kept[b]) - len(kept[a]) })
	share := make([]int, len(members))
	for rank, i := range byKept {
		share[i] = base
		if rank < extra {
			share[i]++
		}
	}
	// Each keeps its lowest slots up to its share; the rest are free.
	for _, i := range active {
		for n, s := range kept[i] {
			if n < share[i] {
				p.owner[s] = i
			}
		}
	}
	have := make([]int, len(members))
	for _, i := range p.owner {
		if i >= 0 {
			have[i]++
		}
	}
	next := 0 // the next active member, in group order, that may be below its share
	for s := range p.owner {
		if p.owner[s] >= 0 {
			continue
		}
		for have[active[next]] >= share[active[next]] {
			next++
		}
		p.owner[s] = active[next]
		have[active[next]]++
	}

	// What each owner is given now: the partitions of its slot on every topic it
	// subscribes to, unless another member still claims some partition of the slot, in
	// which case only what it already holds (the others give theirs up, join again, and the
	// next round gives it the rest).
	for s, i := range p.owner {
		m := &members[i]
		contested := false
		for _, j := range claimed[s] {
			contested = contested || j != i
		}
		if contested {
			p.moving++
		}
		for t, n := range topics {
			if int32(s) >= n {
				continue
			}
			if !slices.Contains(m.topics, t) {
				p.unsubscribed++
				continue
			}
			if contested && !slices.Contains(m.owned[t], int32(s)) {
				continue
			}
			p.give[i][t] = append(p.give[i][t], int32(s))
		}
	}
	for _, g := range p.give {
		for t := range g {
			slices.Sort(g[t])
		}
	}
	return p
}
