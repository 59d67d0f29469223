package aggregator

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// simMember is a group member in simGroup: what it subscribes to and what it holds.
type simMember struct {
	id     string
	topics []string
	owned  map[string][]int32
	gen    int32
}

// simGroup plays the classic cooperative protocol over planSlots, as Kafka and franz-go do:
// at each rebalance every member joins with what it holds; each is given its part of the
// plan; a member that lost partitions revokes them and joins again, which starts another
// round; rounds repeat until no member loses any.
type simGroup struct {
	t       *testing.T
	topics  map[string]int32
	members []*simMember // sorted by id, as the group sorts them
	gen     int32
}

func (g *simGroup) join(id string, topics ...string) {
	g.members = append(g.members, &simMember{id: id, topics: topics, owned: map[string][]int32{}})
	slices.SortFunc(g.members, func(a, b *simMember) int {
		switch {
		case a.id < b.id:
			return -1
		case a.id > b.id:
			return 1
		}
		return 0
	})
}

func (g *simGroup) leave(id string) {
	g.members = slices.DeleteFunc(g.members, func(m *simMember) bool { return m.id == id })
}

// slotOwners returns, per slot, every member holding some partition of it.
func slotOwners(ms []*simMember, give func(i int) map[string][]int32) map[int32][]string {
	out := map[int32][]string{}
	for i, m := range ms {
		for _, ps := range give(i) {
			for _, p := range ps {
				if !slices.Contains(out[p], m.id) {
					out[p] = append(out[p], m.id)
				}
			}
		}
	}
	return out
}

// rebalance runs rounds until the group is stable and returns how many it took and the
// slots each member gained.
func (g *simGroup) rebalance() (rounds int, gained map[string]int) {
	g.t.Helper()
	before := map[string][]int32{}
	for _, m := range g.members {
		before[m.id] = slotsOf(m.owned)
	}
	for rounds = 1; rounds <= 4; rounds++ {
		g.gen++
		in := make([]slotMember, len(g.members))
		for i, m := range g.members {
			in[i] = slotMember{id: m.id, topics: m.topics, owned: m.owned, gen: m.gen}
		}
		p := planSlots(in, g.topics)
		// Members take their new assignment at different moments: at any moment some hold
		// the old one and some the new. One key, one owner in every mix: a slot is never
		// held by two members, old or new.
		owners := slotOwners(g.members, func(i int) map[string][]int32 { return g.members[i].owned })
		for s, ids := range slotOwners(g.members, func(i int) map[string][]int32 { return p.give[i] }) {
			for _, id := range ids {
				if !slices.Contains(owners[s], id) {
					owners[s] = append(owners[s], id)
				}
			}
		}
		for s, ids := range owners {
			if len(ids) > 1 {
				g.t.Fatalf("round %d: slot %d held by %v at once", rounds, s, ids)
			}
		}
		lost := false
		for i, m := range g.members {
			for t, ps := range m.owned {
				for _, q := range ps {
					lost = lost || !slices.Contains(p.give[i][t], q)
				}
			}
			m.owned, m.gen = p.give[i], g.gen
		}
		if !lost {
			gained = map[string]int{}
			for _, m := range g.members {
				for _, s := range slotsOf(m.owned) {
					if !slices.Contains(before[m.id], s) {
						gained[m.id]++
					}
				}
			}
			return rounds, gained
		}
	}
	g.t.Fatalf("no stable assignment after %d rounds", rounds-1)
	return 0, nil
}

// check asserts what a stable assignment must be: every slot owned, each by one member
// that holds its partition of every topic it subscribes to, and the members' slot counts
// within one of each other.
func (g *simGroup) check() {
	g.t.Helper()
	var slots int32
	for _, n := range g.topics {
		slots = max(slots, n)
	}
	owners := slotOwners(g.members, func(i int) map[string][]int32 { return g.members[i].owned })
	lo, hi := int(slots), 0
	for _, m := range g.members {
		mine := slotsOf(m.owned)
		lo, hi = min(lo, len(mine)), max(hi, len(mine))
		for _, s := range mine {
			for _, t := range m.topics {
				if s < g.topics[t] && !slices.Contains(m.owned[t], s) {
					g.t.Fatalf("%s owns slot %d but not partition %d of %s: %v", m.id, s, s, t, m.owned)
				}
			}
		}
	}
	if len(g.members) > 0 {
		for s := range slots {
			if len(owners[s]) != 1 {
				g.t.Fatalf("slot %d owned by %v", s, owners[s])
			}
		}
		if hi-lo > 1 {
			g.t.Fatalf("unbalanced: %d to %d slots per member", lo, hi)
		}
	}
}

// Members join and leave a group over three co-partitioned topics: every slot is always
// held by one member, all its partitions together; a join moves only the slots the
// newcomer takes, a departure only the departed member's, in at most two rounds (the
// second gives what the first took away).
func TestSlotBalancerCooperative(t *testing.T) {
	tops := []string{"ap.hits", "hits", "us.hits"}
	g := &simGroup{t: t, topics: map[string]int32{"hits": 12, "us.hits": 12, "ap.hits": 12}}
	g.join("a", tops...)
	if r, _ := g.rebalance(); r != 1 {
		t.Fatalf("first member: %d rounds", r)
	}
	g.check()
	for m, id := range []string{"b", "c", "d", "e"} {
		g.join(id, tops...)
		rounds, gained := g.rebalance()
		g.check()
		moved := 0
		for who, n := range gained {
			if who != id {
				t.Fatalf("%s joined, but %s gained %d slots", id, who, n)
			}
			moved += n
		}
		if want := 12 / (m + 2); moved < want || moved > want+1 || rounds != 2 {
			t.Fatalf("%s joined %d members: %d slots moved in %d rounds, want %d or %d in 2", id, m+1, moved, rounds, want, want+1)
		}
	}
	for _, id := range []string{"b", "e", "a", "c"} {
		var had int
		for _, m := range g.members {
			if m.id == id {
				had = len(slotsOf(m.owned))
			}
		}
		g.leave(id)
		rounds, gained := g.rebalance()
		g.check()
		moved := 0
		for _, n := range gained {
			moved += n
		}
		if moved != had || rounds != 1 {
			t.Fatalf("%s left with %d slots: %d moved in %d rounds", id, had, moved, rounds)
		}
	}
}

// A member that missed rebalances rejoins claiming slots that have moved on: the claim of
// the latest generation wins, and the stale claimant is given none of them.
func TestSlotBalancerStaleClaim(t *testing.T) {
	tops := map[string]int32{"hits": 4, "us.hits": 4}
	in := []slotMember{
		{id: "a", topics: []string{"hits", "us.hits"}, gen: 7, owned: map[string][]int32{"hits": {0, 1}, "us.hits": {0, 1}}},
		{id: "b", topics: []string{"hits", "us.hits"}, gen: 3, owned: map[string][]int32{"hits": {0, 1, 2, 3}, "us.hits": {0, 1, 2, 3}}},
	}
	p := planSlots(in, tops)
	if !slices.Equal(p.give[0]["hits"], []int32{0, 1}) || !slices.Equal(p.give[0]["us.hits"], []int32{0, 1}) {
		t.Fatalf("a, the latest owner of slots 0 and 1, is given %v", p.give[0])
	}
	if len(p.give[1]) != 2 || !slices.Equal(p.give[1]["hits"], []int32{2, 3}) {
		t.Fatalf("b is given %v, want slots 2 and 3 only", p.give[1])
	}
}

// A member whose metadata does not show a new topic yet is not given that topic's
// partitions of its slots, and neither is anyone else: they wait until it joins again with
// the topic.
func TestSlotBalancerSubscriptionLag(t *testing.T) {
	tops := map[string]int32{"hits": 4, "us.hits": 4, "ap.hits": 4}
	in := []slotMember{
		{id: "a", topics: []string{"ap.hits", "hits", "us.hits"}, owned: map[string][]int32{}},
		{id: "b", topics: []string{"hits", "us.hits"}, owned: map[string][]int32{}},
	}
	p := planSlots(in, tops)
	bSlots := slotsOf(p.give[1])
	if len(bSlots) != 2 || len(p.give[1]["ap.hits"]) != 0 {
		t.Fatalf("b is given %v", p.give[1])
	}
	for _, s := range bSlots {
		if slices.Contains(p.give[0]["ap.hits"], s) {
			t.Fatalf("a is given ap.hits/%d of b's slot %d", s, s)
		}
	}
	if p.unsubscribed != 2 {
		t.Fatalf("%d partitions left unassigned, want 2", p.unsubscribed)
	}
}

// Random joins, departures, new topics and lagging subscriptions: one key, one owner at
// every moment, and a stable, balanced, co-partitioned assignment after every change.
func TestSlotBalancerRandom(t *testing.T) {
	for seed := range uint64(200) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			slots := int32(1 + rng.IntN(16))
			all := []string{"hits", "us.hits", "ap.hits", "eu.hits"}
			g := &simGroup{t: t, topics: map[string]int32{"hits": slots}}
			known := 1
			next := 0
			for range 30 {
				switch r := rng.IntN(10); {
				case r < 4 || len(g.members) == 0:
					next++
					g.join(fmt.Sprintf("m%02d", next), all[:known]...)
				case r < 7:
					g.leave(g.members[rng.IntN(len(g.members))].id)
				case known < len(all):
					g.topics[all[known]] = slots
					known++
					// Members see the new topic one after the other: rebalance at each.
					for _, m := range g.members {
						m.topics = all[:known]
						g.rebalance()
					}
				}
				g.rebalance()
				g.check()
			}
		})
	}
}
