package sitestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
)

var _ sitecount.SiteCommitter = (*Counter)(nil)

// CommitWithSite implements sitecount.SiteCommitter: a request with global limits and
// site-scope limits is decided in one script call (a 'j' request of batch.lua) when site is
// the Counter's own Store. The counts are checked against their caps; only if every one
// fits are the site limits decided, as AllowAll decides them; only if those are taken are
// the counts added. counts (len ≥ len(ops)) receives the counts before the request.
//
// It does nothing (Done false), and the caller decides the two apart, when the step
// cannot be one script call: a site op outside the exact range (decided in process), on a
// Redis Cluster ops of more than one hash tag, or every site op known over its limit (the
// over-limit cache refuses it without a round trip).
//
// When Redis fails the request is decided in process in the same order, each half as it
// would be on its own: the counts on the fallback counter checked against this process's
// share of their caps, the site limits on the fallback store, then the counts committed. If
// a concurrent request took the counts' room meanwhile, the request is refused with its site
// hits taken in process, an error toward refusing.
func (c *Counter) CommitWithSite(ctx context.Context, now time.Time, site any, ops []sitecount.Op, counts []float64, siteOps []algo.Op, siteOut []algo.Decision) sitecount.Joint {
	s := c.s
	if st, _ := site.(*Store); st != s || len(ops) == 0 || len(siteOps) == 0 {
		return sitecount.Joint{}
	}
	siteOut = siteOut[:len(siteOps)]
	if s.usable(now, siteOps) != "" || !c.oneTag(ops, siteOps) || s.overLimit(now, siteOps, siteOut) {
		return sitecount.Joint{}
	}
	keys, args := c.args(now, ops, true)
	sc := s.siteCall(now, siteOps, true)
	keys = append(keys, sc.keys...)
	args = append(args, sc.args...)
	var j sitecount.Joint
	var states []opState
	start := s.clk.Now()
	reason := s.run(ctx, now, &call{kind: kindJoint, tag: sc.tag, keys: keys, args: args}, func(res []any) error {
		if len(res) != 2 {
			return fmt.Errorf("batch script returned %d parts for a joint request", len(res))
		}
		cres, ok1 := res[0].([]any)
		sres, ok2 := res[1].([]any)
		if !ok1 || !ok2 {
			return errors.New("batch script returned a joint reply that is not two lists")
		}
		fits, err := parseCounts(cres, len(ops), counts)
		if err != nil || !fits {
			return err
		}
		states, err = parseStates(sres, len(siteOps))
		return err
	})
	switch reason {
	case "":
		j.Done = true
		if states != nil {
			j.SiteRan = true
			j.SiteOK = s.fill(now, siteOps, states, siteOut)
			s.noteAll(now, siteOps, siteOut)
		}
		j.Taken = j.SiteOK
		c.noteCounts(now, ops, counts, j.Taken)
		if s.decided != nil {
			s.decided(now, j.Taken, false)
		}
		return j
	case reasonCanceled:
		// Nobody will receive the answer: refuse, take nothing.
		s.m.canceled.Inc()
		_ = c.fallback.Counts(ctx, now, ops, counts)
		return sitecount.Joint{Done: true}
	}
	s.m.fallback.WithLabelValues(reason).Inc()
	s.m.counterFB.WithLabelValues("commit", reason).Inc()
	now = s.after(now, start)
	j = sitecount.Joint{Done: true, GlobalFellBack: true, SiteFellBack: true}
	c.seedCounter(ctx, now, ops)
	_ = c.fallback.Counts(ctx, now, ops, counts)
	if !c.fitsShare(ops, counts) {
		return j
	}
	j.SiteRan = true
	if j.SiteOK = s.fallbackAllowAll(now, siteOps, siteOut, true); !j.SiteOK {
		return j
	}
	j.Taken, _ = c.fallbackCommit(ctx, now, ops, counts)
	if j.Taken {
		c.pendCounts(now, ops)
		if s.decided != nil {
			s.decided(now, true, true)
		}
	}
	return j
}

// fitsShare reports whether every op fits its cap scaled to this process's FallbackShare,
// given the counts before the request, with the earlier ops of the request on the same key
// added as if taken: the check fallbackCommit makes before it adds.
func (c *Counter) fitsShare(ops []sitecount.Op, counts []float64) bool {
	for i := range ops {
		cur := counts[i]
		for k := range i {
			if ops[k].Key == ops[i].Key {
				cur += float64(ops[k].N)
			}
		}
		// A NaN cap always fits, as in sitecount.Local.
		if cur+float64(ops[i].N) > ops[i].Cap*c.share {
			return false
		}
	}
	return true
}

// oneTag reports whether the keys of ops and siteOps can go to one script call: always,
// but on a Redis Cluster only when they share one hash tag (one slot).
func (c *Counter) oneTag(ops []sitecount.Op, siteOps []algo.Op) bool {
	if !c.s.cluster {
		return true
	}
	tag := c.s.tag(siteOps[0].Key)
	for i := range siteOps {
		if c.s.tag(siteOps[i].Key) != tag {
			return false
		}
	}
	for i := range ops {
		if c.s.tag(ops[i].Key) != tag {
			return false
		}
	}
	return true
}
