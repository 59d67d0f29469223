package sitestore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Concurrent callers share round trips: every decision goes through a batcher, which
// sends the requests that are waiting as one call of the batch script (batch.lua), each
// request decided by its own script's code in turn, in one atomic step. A request that
// finds no batch in flight is sent at once, by its own goroutine, so a lone request waits
// for nothing; requests that arrive while a batch is in flight wait for the next one, so
// the batches grow with the load, and so do the requests each round trip, script call and
// system call carry. A further lane (a batch in flight beside the others) opens only when
// a full batch (MaxBatch) waits: a second lane that opened whenever one was busy would
// halve the batches, and each costs the enforcer a round trip (system calls, a goroutine
// woken by the network) and Redis a script call, which on a loaded enforcer's core cost
// more than the wait they save. This is implicit pipelining (as envoyproxy/ratelimit's
// Redis client does with its write buffering), taken one step further: Redis runs one
// script call per batch instead of one per request.
//
// On a Redis Cluster a script call holds the keys of one hash slot: a batch's requests
// are grouped by hash tag, one script call per tag, sent together in one pipeline.

//go:embed batch.lua
var batchSrc string

// batchScript is the batch script: script.lua (with its algorithms) and counter.lua
// without their closing calls, then batch.lua.
var batchScript = withoutRun(siteScript) + withoutRun(counterSrc) + batchSrc

// withoutRun returns a request script without its closing call (the "-- RUN" line on).
func withoutRun(src string) string {
	i := strings.LastIndex(src, "-- RUN\n")
	if i < 0 {
		panic("sitestore: a request script has no -- RUN line")
	}
	return src[:i]
}

// Defaults of the batching (Config.Lanes, Config.MaxBatch).
const (
	// DefaultLanes is Config.Lanes when zero: the most batches in flight at once. The
	// second opens only when a full batch waits (see the top of this file): under a load
	// that fills batches, one batch is built and sent while the previous one is in Redis.
	DefaultLanes = 2
	// DefaultMaxBatch is Config.MaxBatch when zero: requests in one batch. A batch holds
	// Redis for the time of its requests (a few microseconds each).
	DefaultMaxBatch = 128
)

// Request kinds in a batch (batch.lua).
const (
	kindSite    = "s"
	kindCounter = "c"
	// kindJoint is a request's global site counts and site-scope limits together
	// (Counter.CommitWithSite).
	kindJoint = "j"
)

// call is one request in a batch: its kind, keys and arguments as its own script takes
// them, its hash tag (Cluster), and, once done is closed, its reply or error.
type call struct {
	ctx   context.Context
	kind  string
	tag   string
	keys  []string
	args  []any
	reply []any
	err   error
	done  chan struct{}
}

// batcher sends calls in batches (see the top of this file). It is safe for simultaneous
// use by multiple goroutines.
type batcher struct {
	client  redis.UniversalClient
	script  *redis.Script
	cluster bool
	timeout time.Duration
	lanes   int
	max     int
	batches prometheus.Counter // script calls sent

	mu    sync.Mutex
	queue []*call
	busy  int // lanes sending
}

// do sends c (in a batch) and waits for its reply or for ctx to end.
func (b *batcher) do(ctx context.Context, c *call) ([]any, error) {
	c.ctx, c.done = ctx, make(chan struct{})
	b.mu.Lock()
	b.queue = append(b.queue, c)
	lead := b.busy == 0 || (b.busy < b.lanes && len(b.queue) >= b.max)
	if lead {
		b.busy++
	}
	b.mu.Unlock()
	if lead {
		b.serve(c)
	}
	// An answer that is there wins over a deadline that passed meanwhile (a lane's
	// goroutine may have sent others' batches first): Redis has decided the request, and
	// deciding it again in process would count it twice.
	if answered(c) {
		return c.reply, c.err
	}
	select {
	case <-c.done:
		return c.reply, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// serve sends batches from the queue on a lane until own (nil: none) is answered, then
// hands the lane to a new goroutine if calls are still waiting, or frees it.
func (b *batcher) serve(own *call) {
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.busy--
			b.mu.Unlock()
			return
		}
		if own != nil && answered(own) {
			b.mu.Unlock()
			go b.serve(nil)
			return
		}
		n := min(len(b.queue), b.max)
		batch := make([]*call, n)
		copy(batch, b.queue)
		k := copy(b.queue, b.queue[n:])
		clear(b.queue[k:])
		b.queue = b.queue[:k]
		b.mu.Unlock()
		b.send(batch)
	}
}

func answered(c *call) bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// send runs one batch and answers each of its calls.
func (b *batcher) send(batch []*call) {
	live := batch[:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			// Its caller gave up before it was sent: it must not count.
			c.err = err
			close(c.done)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	// The batch lasts as long as its last caller waits (each waits up to the Store's
	// timeout, or less when its own context says so); a batch of one is its caller's call.
	// When the callers give up, go-redis drops the connection, and a Redis that has not
	// read the batch yet never runs it.
	ctx := live[0].ctx
	if len(live) > 1 {
		end := time.Now().Add(b.timeout)
		for _, c := range live {
			if d, ok := c.ctx.Deadline(); ok && d.After(end) {
				end = d
			}
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(context.Background(), end)
		defer cancel()
	}
	if !b.cluster {
		keys, args := batchArgs(live)
		b.batches.Inc()
		answer(live, b.script.Run(ctx, b.client, keys, args...))
		return
	}
	groups := groupByTag(len(live), func(i int) string { return live[i].tag })
	if len(groups) == 1 {
		keys, args := batchArgs(live)
		b.batches.Inc()
		answer(live, b.script.Run(ctx, b.client, keys, args...))
		return
	}
	b.batches.Add(float64(len(groups)))
	calls := make([][]*call, len(groups))
	cmds := make([]*redis.Cmd, len(groups))
	pipe := b.client.Pipeline()
	for g, idx := range groups {
		calls[g] = make([]*call, len(idx))
		for k, i := range idx {
			calls[g][k] = live[i]
		}
		keys, args := batchArgs(calls[g])
		cmds[g] = b.script.EvalSha(ctx, pipe, keys, args...)
	}
	_, _ = pipe.Exec(ctx)
	for g, cmd := range cmds {
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			keys, args := batchArgs(calls[g])
			cmd = b.script.Run(ctx, b.client, keys, args...)
		}
		answer(calls[g], cmd)
	}
}

// batchArgs returns the batch script's keys and arguments for calls.
func batchArgs(calls []*call) ([]string, []any) {
	nk, na := 0, 1+len(calls)
	for _, c := range calls {
		nk += len(c.keys)
		na += len(c.args)
	}
	keys := make([]string, 0, nk)
	args := make([]any, 0, na)
	args = append(args, len(calls))
	for _, c := range calls {
		args = append(args, c.kind)
	}
	for _, c := range calls {
		keys = append(keys, c.keys...)
		args = append(args, c.args...)
	}
	return keys, args
}

// answer hands each call its part of the batch's reply, or the batch's error.
func answer(calls []*call, cmd *redis.Cmd) {
	replies, err := cmd.Slice()
	if err == nil && len(replies) != len(calls) {
		err = fmt.Errorf("batch script returned %d replies for %d requests", len(replies), len(calls))
	}
	for i, c := range calls {
		if err != nil {
			c.err = err
		} else if r, ok := replies[i].([]any); ok {
			c.reply = r
		} else {
			c.err = errors.New("batch script returned a reply that is not a list")
		}
		close(c.done)
	}
}
