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
}

// newCounting returns the counting of cfg, reporting to m.
func newCounting(cfg *Config, m *metrics) counting {
	return counting{m: m, st: newState(cfg.stateConfig()), hold: holder{max: max(cfg.MaxLocalHold.Milliseconds(), 0)}}
}

// take counts record it, consumed at now from a remote (replicated) or the local hits
// topic, or holds it back when it is local and the local records are ahead of the
// replicated ones. A replayed record is neither sampled nor held: it is old by nature and
// says nothing of the lags. It returns what counting it did (added when held).
func (c *counting) take(now int64, remote, replaying bool, it held) addResult {
	if !replaying {
		c.hold.sample(now, it.h.bucketStart, remote)
		if !remote && c.hold.delay() > 0 {
			c.hold.push(now, it)
			return added
		}
	}
	return c.apply(now, &it)
}

// release counts the held local records whose time has come at now.
func (c *counting) release(now int64) {
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
