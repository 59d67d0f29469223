package countsview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// Change is one counter record of the counts topic as Tail delivers it.
type Change struct {
	// Key is the counter key.
	Key string
	// Count is the new count; nil when the record is a tombstone (the key was deleted).
	Count *topics.Count
	// Time is the record's timestamp.
	Time time.Time
	// Partition and Offset locate the record.
	Partition int32
	Offset    int64
}

// TailOptions says where Tail starts and when it stops. The zero value starts at the end
// and follows until ctx is done.
type TailOptions struct {
	// FromBeginning starts at the start of every partition instead of its end.
	FromBeginning bool
	// NoFollow stops at the end offsets listed when Tail starts instead of waiting for
	// more.
	NoFollow bool
}

// Tail delivers counter changes (heartbeats and other reserved keys are skipped) to fn, in
// offset order within each partition, until ctx is done (then it returns nil), fn returns
// an error (returned as is; return ErrStop to end without error), or, with NoFollow, the
// end offsets are reached. Undecodable records are passed to bad, if not nil, and skipped.
// Partitions added while Tail runs are not read.
func Tail(ctx context.Context, o Options, to TailOptions, fn func(Change) error, bad func(key []byte, err error)) error {
	o = o.normalize()
	starts, ends, err := offsets(ctx, o)
	if err != nil {
		return err
	}
	from := make(map[int32]kgo.Offset, len(ends))
	want := make(map[int32]int64)
	for p, end := range ends {
		start := end
		if to.FromBeginning {
			start = starts[p]
		}
		from[p] = kgo.NewOffset().At(start)
		if end > start {
			want[p] = end
		}
	}
	if to.NoFollow && len(want) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(append(slices.Clone(o.Kafka),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{o.Topic: from}))...)
	if err != nil {
		return fmt.Errorf("countsview: kafka client: %w", err)
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			ferr = errors.Join(ferr, fmt.Errorf("countsview: fetching %s/%d: %w", t, p, err))
		})
		if ferr != nil {
			return ferr
		}
		for it := fs.RecordIter(); !it.Done(); {
			r := it.Next()
			if to.NoFollow {
				end, ok := want[r.Partition]
				if !ok || r.Offset >= end {
					continue
				}
				if r.Offset >= end-1 {
					delete(want, r.Partition)
				}
			}
			if topics.IsReservedKey(r.Key) {
				continue
			}
			ch := Change{Key: string(r.Key), Time: r.Timestamp, Partition: r.Partition, Offset: r.Offset}
			if len(r.Value) > 0 {
				c, err := topics.DecodeCount(r.Value)
				if err == nil && c.Key != ch.Key {
					err = fmt.Errorf("record key %q differs from count key %q", truncate(ch.Key), truncate(c.Key))
				}
				if err != nil {
					if bad != nil {
						bad(r.Key, err)
					}
					continue
				}
				ch.Count = &c
			}
			if err := fn(ch); err != nil {
				if errors.Is(err, ErrStop) {
					return nil
				}
				return err
			}
		}
		if to.NoFollow && len(want) == 0 {
			return nil
		}
	}
}

// ErrStop, returned by a Tail callback, ends Tail without an error.
var ErrStop = errors.New("countsview: stop")
