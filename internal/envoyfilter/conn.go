package envoyfilter

import (
	"context"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"

	"github.com/streamlimit/streamlimit/clock"
)

// Conn runs a Filter against an RLQS server over one gRPC connection, as Envoy's global
// RLQS client does (global_client_impl.cc): the stream starts with the first bucket; a new
// bucket's report goes out at once on the open stream (dropped when there is none); every
// interval all buckets are reported, the stream started again first when the server
// closed it (a stream that cannot start drops that tick's reports); responses are applied
// as they arrive.
type Conn struct {
	f      *Filter
	client rlqsv3.RateLimitQuotaServiceClient
	clk    clock.Clock

	mu      sync.Mutex
	stream  grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	cancel  context.CancelFunc
	ctx     context.Context
	started chan struct{} // closed with the first bucket
	once    sync.Once
	stats   ConnStats
}

// ConnStats counts what a Conn sent and lost.
type ConnStats struct {
	// Reports counts the messages sent; Dropped those lost because no stream could be
	// started or the send failed.
	Reports, Dropped int
	// Streams counts the streams started; Responses the responses applied, the last at
	// LastResponse.
	Streams, Responses int
	LastResponse       time.Time
}

// NewConn returns a Conn of f over cc, whose streams live until ctx ends; clk defaults to
// the wall clock. Run drives its report timer; Decide decides requests.
func NewConn(ctx context.Context, f *Filter, cc grpc.ClientConnInterface, clk clock.Clock) *Conn {
	return &Conn{f: f, client: rlqsv3.NewRateLimitQuotaServiceClient(cc), clk: clock.Or(clk), ctx: ctx, started: make(chan struct{})}
}

// Filter returns the Conn's Filter.
func (c *Conn) Filter() *Filter { return c.f }

// Stats returns what the Conn sent and lost so far.
func (c *Conn) Stats() ConnStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Decide decides one request of bucket id, sending the new bucket's report when it is new.
func (c *Conn) Decide(id map[string]string, s Settings) bool {
	allowed, initial := c.f.Decide(c.clk.Now(), id, s)
	if initial != nil {
		c.once.Do(func() { close(c.started) })
		c.mu.Lock()
		if c.stream == nil && c.stats.Streams == 0 {
			c.startLocked() // createBucketImpl starts the stream with the first bucket
		}
		c.sendLocked(initial)
		c.mu.Unlock()
	}
	return allowed
}

// Run reports every interval from the first bucket on, until ctx ends, and then closes the
// stream. It returns nil.
func (c *Conn) Run(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-c.started:
	}
	c.mu.Lock()
	if c.stream == nil && c.stats.Streams == 0 {
		c.startLocked()
	}
	c.mu.Unlock()
	iv := c.f.Interval()
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c.mu.Lock()
			if c.cancel != nil {
				c.cancel()
			}
			c.stream = nil
			c.mu.Unlock()
			return nil
		case <-t.C:
			c.tick()
		}
	}
}

// tick is onSendReportsTimer: build the reports (resetting the counters), start the stream
// when there is none, send.
func (c *Conn) tick() {
	r := c.f.Reports(c.clk.Now())
	if r == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stream == nil && !c.startLocked() {
		c.stats.Dropped++
		return
	}
	c.sendLocked(r)
}

// startLocked starts a stream and its receiver; c.mu is held.
func (c *Conn) startLocked() bool {
	if c.ctx.Err() != nil {
		return false
	}
	ctx, cancel := context.WithCancel(c.ctx)
	st, err := c.client.StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		return false
	}
	c.stream, c.cancel = st, cancel
	c.stats.Streams++
	go c.receive(st, cancel)
	return true
}

// sendLocked sends r on the open stream, or drops it; c.mu is held.
func (c *Conn) sendLocked(r *rlqsv3.RateLimitQuotaUsageReports) {
	if c.stream == nil {
		c.stats.Dropped++
		return
	}
	if err := c.stream.Send(r); err != nil {
		c.stats.Dropped++
		return
	}
	c.stats.Reports++
}

// receive applies the stream's responses until it ends (onReceiveMessage), then forgets
// the stream (onRemoteClose).
func (c *Conn) receive(st grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse], cancel context.CancelFunc) {
	defer cancel()
	for {
		resp, err := st.Recv()
		if err != nil {
			c.mu.Lock()
			if c.stream == st {
				c.stream = nil
			}
			c.mu.Unlock()
			return
		}
		now := c.clk.Now()
		c.f.Apply(now, resp)
		c.mu.Lock()
		c.stats.Responses++
		c.stats.LastResponse = now
		c.mu.Unlock()
	}
}
