package snapshot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// errLogEvery limits how often the follower logs consume errors, which kgo may report on
// every poll while a broker is down.
const errLogEvery = 5 * time.Second

// Run follows the counts topic until ctx is done, then returns nil. It reads every
// partition from its log start, without a consumer group (every enforcer needs the whole
// topic), applies each record with Apply, marks the snapshot ready once it has applied
// every record below the end offsets listed when it started, and then keeps following. It
// also removes idle entries every Config.SweepInterval.
//
// Run does not give up when Kafka is unreachable or the topic does not exist yet: it logs,
// retries, and meanwhile the snapshot serves what it has while Age grows. It returns an
// error only when it cannot start: a Snapshot from NewMemory, a second concurrent Run, or
// client options that kgo rejects.
func (s *Snapshot) Run(ctx context.Context) error {
	if len(s.cfg.Brokers) == 0 {
		return errors.New("snapshot: Run needs Brokers (a NewMemory snapshot is fed with Apply)")
	}
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("snapshot: Run is already running")
	}
	defer s.running.Store(false)

	opts := append([]kgo.Opt{kgo.SeedBrokers(s.cfg.Brokers...)}, fetchOpts(s.cfg.MaxBytes)...)
	opts = append(opts, s.cfg.KafkaOpts...)
	opts = append(opts,
		kgo.ConsumeTopics(s.cfg.Topic),
		kgo.ConsumeStartOffset(kgo.NewOffset().AtStart()),
		// A compacted topic holds absolute values: rereading it from the start after an
		// out-of-range offset is always correct.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Transaction markers occupy offsets; seeing them lets the catch-up check reach the
		// end offset even when the last record of a partition is a marker.
		kgo.KeepControlRecords(),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("snapshot: kafka client: %w", err)
	}
	defer cl.Close()

	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { s.sweepLoop(ctx) })

	log := s.cfg.Logger.With("topic", s.cfg.Topic)
	pending, err := s.catchUpTargets(ctx, kadm.NewClient(cl))
	if err != nil {
		return nil // ctx is done
	}
	if len(pending) == 0 {
		s.markReady()
		log.Info("snapshot ready: counts topic is empty")
	} else {
		log.Info("snapshot restoring", "partitions", len(pending))
	}

	var lastErrLog time.Time
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return nil
		}
		fs.EachError(func(topic string, p int32, err error) {
			if now := s.cfg.Clock.Now(); now.Sub(lastErrLog) >= errLogEvery || now.Before(lastErrLog) {
				lastErrLog = now
				log.Warn("snapshot consume error", "partition", p, "err", err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() && !s.knownWriter(r) {
				s.met.bad(ReasonUnknownInstance)
				log.Debug("snapshot skipped a record of an unknown writer", "partition", r.Partition, "offset", r.Offset)
			} else if !r.Attrs.IsControl() {
				if err := s.Apply(r.Key, r.Value); err != nil {
					log.Debug("snapshot skipped record", "partition", r.Partition, "offset", r.Offset, "err", err)
				}
			}
			if pending == nil {
				return
			}
			if end, ok := pending[r.Partition]; ok && r.Offset+1 >= end {
				delete(pending, r.Partition)
				if len(pending) == 0 {
					pending = nil
					s.markReady()
					log.Info("snapshot ready", "keys", s.Len())
				}
			}
		})
	}
}

// catchUpTargets lists the counts topic's start and end offsets, retrying until it succeeds
// or ctx is done, and returns the end offset of every partition that holds records: the
// snapshot is ready once it has consumed up to each.
func (s *Snapshot) catchUpTargets(ctx context.Context, adm *kadm.Client) (map[int32]int64, error) {
	backoff := 100 * time.Millisecond
	for {
		pending, err := s.listTargets(ctx, adm)
		if err == nil {
			return pending, nil
		}
		s.cfg.Logger.Warn("snapshot: listing counts topic offsets", "topic", s.cfg.Topic, "err", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (s *Snapshot) listTargets(ctx context.Context, adm *kadm.Client) (map[int32]int64, error) {
	ends, err := adm.ListEndOffsets(ctx, s.cfg.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("end offsets: %w", err)
	}
	starts, err := adm.ListStartOffsets(ctx, s.cfg.Topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("start offsets: %w", err)
	}
	ps, ok := ends[s.cfg.Topic]
	if !ok || len(ps) == 0 {
		return nil, fmt.Errorf("topic %q not found", s.cfg.Topic)
	}
	pending := make(map[int32]int64, len(ps))
	for p, end := range ps {
		start, ok := starts.Lookup(s.cfg.Topic, p)
		if !ok || end.Offset > start.Offset {
			pending[p] = end.Offset
		}
	}
	return pending, nil
}

func (s *Snapshot) sweepLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n := s.Sweep(s.cfg.Clock.Now()); n > 0 {
				s.cfg.Logger.Debug("snapshot swept idle keys", "removed", n, "keys", s.Len())
			}
		}
	}
}

// fetchOpts bound what the follower fetches at once by the snapshot's byte budget: a
// sixteenth of it (at least 1 MiB, at most kgo's default of 50 MiB) per fetch, one fetch
// in flight. A fetch is held in memory as records (their structs, keys and values, a few
// times the bytes fetched) until it is applied, and at kgo's defaults a restore of a
// million keys held more than the whole memory target in fetched records. Following the
// topic after the restore needs far less.
func fetchOpts(maxBytes int64) []kgo.Opt {
	if maxBytes <= 0 {
		return nil
	}
	n := int32(min(max(maxBytes/16, 1<<20), 50<<20))
	return []kgo.Opt{kgo.FetchMaxBytes(n), kgo.FetchMaxPartitionBytes(n), kgo.MaxConcurrentFetches(1)}
}

// knownWriter reports whether r was written by one of Config.Aggregators (always, when
// none is configured).
func (s *Snapshot) knownWriter(r *kgo.Record) bool {
	if len(s.cfg.Aggregators) == 0 {
		return true
	}
	for _, h := range r.Headers {
		if h.Key == topics.InstanceHeader {
			return slices.Contains(s.cfg.Aggregators, string(h.Value))
		}
	}
	return false
}
