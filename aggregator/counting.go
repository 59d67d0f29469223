package aggregator

// counting is what an Aggregator and a Memory both do with the records they read and the
// counts they publish: the counters and sites (state), this data center's own records
// held back behind replication (hold.go), and the metrics. Its methods are the one
// implementation of taking a record in and of choosing what goes out; an Aggregator adds
// Kafka around them (ownership, re-routing, replay, publishing), a Memory explicit time —
// so the simulator, which runs a Memory, counts as the service does.
type counting struct {
	m  *metrics
	st *state
	// hold keeps local records back; heldBuf is release's scratch.
	hold    holder
	heldBuf []held
	// skew estimates the remote sites' clock offsets and re-dates their records (skew.go).
	skew skews
}

// newCounting returns the counting of cfg, reporting to m.
func newCounting(cfg *Config, m *metrics) counting {
	return counting{m: m, st: newState(cfg.stateConfig()), hold: holder{max: max(cfg.MaxLocalHold.Milliseconds(), 0)},
		skew: newSkews(cfg.LocalTopic)}
}

// take counts record it, consumed at now from topic, remote (replicated) or the local hits
// topic. It is first re-dated by its site's estimated clock offset (skew.go, measured on
// the site records as dated), or parked until there is one, for a second at most; then
// held back when it is local and the local records are ahead of the replicated ones. A
// replayed record is neither sampled, parked nor held: it is old by nature and says
// nothing of the lags. It returns what counting it did (added when parked or held).
func (c *counting) take(now int64, topic string, remote, replaying bool, it held) addResult {
	if it.site && !replaying {
		c.skew.sample(now, topic, string(it.h.site), it.h.bucketStart)
	}
	// One lookup of the site's shift serves both the park and the re-dating.
	d, known := c.skew.of(topic, it.h.site)
	if !replaying && !known && c.skew.park(now, topic, remote, it) {
		return added
	}
	return c.count(now, now, topic, remote, replaying, d, it)
}

// count re-dates record it by d (skews.of of its site) and counts (or holds back) it,
// consumed at arrived from topic and counted at now.
func (c *counting) count(now, arrived int64, topic string, remote, replaying bool, d int64, it held) addResult {
	if d != 0 && (remote || !it.site) {
		// This data center's site records keep their sites' dates: an enforcer compares
		// the time its own site is counted up to with its clock (the clock skew meter).
		it.h.bucketStart += d
		if it.expiry != 0 {
			it.expiry += d
		}
	}
	if !replaying {
		c.hold.sample(arrived, it.h.bucketStart, remote)
		if !remote && c.hold.delay() > 0 {
			c.hold.push(now, it)
			return added
		}
	}
	return c.apply(now, &it)
}

// release counts the parked records whose site has an estimate, or that waited long
// enough, and the held local records whose time has come at now.
func (c *counting) release(now int64) {
	if len(c.skew.parked) > 0 {
		for _, p := range c.skew.unpark(now) {
			d, _ := c.skew.of(p.topic, p.it.h.site)
			c.count(now, p.at, p.topic, p.remote, false, d, p.it)
		}
	}
	c.heldBuf = c.hold.due(now, c.heldBuf[:0])
	for i := range c.heldBuf {
		c.apply(now, &c.heldBuf[i])
	}
	clear(c.heldBuf)
}

// apply counts one record: a site record into the sites, a hit into its counter.
func (c *counting) apply(now int64, it *held) addResult {
	if it.site {
		src := tp{topic: it.topic, part: it.slot}
		if it.leave {
			c.m.siteLeaves.Inc()
			if _, stranger := c.st.leftFrom(now, src, string(it.h.site), it.inst, it.h.bucketStart); stranger {
				c.m.bad.WithLabelValues(ReasonStrangerLeave).Inc()
			}
			return added
		}
		c.m.siteHeartbeats.Inc()
		replay, undone := c.st.heardFrom(src, string(it.h.site), it.inst, it.h.bucketStart)
		if undone {
			c.m.bad.WithLabelValues(ReasonUndoneLeave).Inc()
		}
		if replay {
			c.m.bad.WithLabelValues(ReasonReplayedHeartbeat).Inc()
			return added
		}
		c.st.sawInstance(now, it.h.bucketStart, string(it.h.site), it.inst, it.counter)
		return added
	}
	r := c.st.addRaw(now, it.slot, it.h, it.origin, it.expiry)
	switch r {
	case addedEvicting:
		c.m.evicted.Inc()
	case refusedKey:
		c.m.refused.Inc()
	case duplicate:
		c.m.duplicates.Inc()
	}
	return r
}

// collect releases what is due and returns the counts and tombstones of one emission
// round at now (docs/aggregator.md), at most budget of them, in sc.outs.
func (c *counting) collect(now int64, budget int, sc *emitScratch) {
	c.release(now)
	sc.cands, sc.outs = c.st.collect(now, budget, sc.cands, sc.outs[:0])
	c.m.keys.Set(float64(c.st.size()))
}

// encode appends the value that publishes e to dst — its count in cfg's format, or
// nothing for a tombstone — and counts it in the metrics.
func (c *counting) encode(cfg *Config, dst []byte, e *emission) ([]byte, error) {
	if e.count == nil {
		c.m.tombstones.Inc()
		c.m.countsOut.Inc()
		return dst, nil
	}
	dst, err := cfg.appendCount(dst, e.count)
	if err == nil {
		c.m.countsOut.Inc()
	}
	return dst, err
}
