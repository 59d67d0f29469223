// Package history rebuilds past usage from the hits topics: it replays the hit records of
// a time range (found by record timestamp), adds them up per step, counter key, window and
// site, and writes the result as CSV, JSON lines or an SVG plot of one key, for
// `streamlimit counts export` and `streamlimit counts plot`.
//
// The counts topic only holds the present; the hits topics are the facts, kept for their
// retention. Nothing here is on the request path.
package history

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// Defaults for the zero fields of Options.
const (
	// DefaultStep is the width of one row's time bucket.
	DefaultStep = time.Minute
	// DefaultSlack is how far outside [From, To) record timestamps are read. A hit record's
	// timestamp is when its producer handed it to Kafka, a little after its bucket starts
	// (the bucket's end plus the flush), or later when Kafka was away; hits are then kept or
	// dropped by their bucket start, so a wider slack only costs reading time.
	DefaultSlack = 5 * time.Minute
	// DefaultMaxRows bounds the rows Replay holds in memory.
	DefaultMaxRows = 1_000_000
)

// ErrTooManyRows is returned by Replay when the range holds more rows than Options.MaxRows.
var ErrTooManyRows = errors.New("history: too many rows")

// Options selects what Replay reads. Kafka, From and To are required.
type Options struct {
	// Kafka are the client options: seed brokers, TLS, SASL. Consumer options are added by
	// Replay.
	Kafka []kgo.Opt
	// HitsTopic is the local hits topic; it and every MirrorMaker-2 copy of it
	// ("<dc>.<HitsTopic>", see topics.HitsPattern) found on the cluster are read, so that
	// every site's hits are counted once. Default topics.DefaultHitsTopic.
	HitsTopic string
	// Topics, when set, are read instead of HitsTopic and its copies.
	Topics []string
	// From and To bound the range: a hit belongs to it when its bucket starts in [From, To).
	From, To time.Time
	// Step is the width of a row's bucket, a whole number of milliseconds; buckets are
	// multiples of Step since the Unix epoch. Default DefaultStep.
	Step time.Duration
	// Slack widens the range of record timestamps read. Default DefaultSlack.
	Slack time.Duration
	// Keep, when not nil, selects the counter keys to count.
	Keep func(key string) bool
	// MaxRows bounds the rows held in memory; more make Replay fail with ErrTooManyRows.
	// Default DefaultMaxRows.
	MaxRows int
}

func (o Options) normalize() (Options, error) {
	if o.HitsTopic == "" {
		o.HitsTopic = topics.DefaultHitsTopic
	}
	if o.Step == 0 {
		o.Step = DefaultStep
	}
	if o.Slack == 0 {
		o.Slack = DefaultSlack
	}
	if o.MaxRows <= 0 {
		o.MaxRows = DefaultMaxRows
	}
	switch {
	case o.From.IsZero() || o.To.IsZero():
		return o, errors.New("history: from and to are required")
	case !o.From.Before(o.To):
		return o, fmt.Errorf("history: from %s is not before to %s", o.From.Format(time.RFC3339), o.To.Format(time.RFC3339))
	case o.Step < time.Millisecond || o.Step%time.Millisecond != 0:
		return o, fmt.Errorf("history: step %s is not a whole number of milliseconds", o.Step)
	case o.Slack < 0:
		return o, fmt.Errorf("history: negative slack %s", o.Slack)
	}
	return o, nil
}

// Row is the usage of one counter at one site during one step.
type Row struct {
	// Start is the step's start, in unix milliseconds.
	Start int64
	// Key is the counter key.
	Key string
	// Window is the counter's window in milliseconds (0: a JSON hit that left it to the
	// aggregator's default).
	Window int64
	// Site is the site that counted the hits.
	Site string
	// Admitted is the number of admitted hits; Denied the requests the site refused.
	Admitted, Denied int64
}

// StartTime returns Start as a time.Time in UTC.
func (r Row) StartTime() time.Time { return time.UnixMilli(r.Start).UTC() }

// Result is what Replay found.
type Result struct {
	// Rows are sorted by Start, Key, Window and Site.
	Rows []Row
	// Topics are the topics read, sorted.
	Topics []string
	// Records counts the Kafka records read (within the offsets of the range); a hit batch is
	// one, and its hits are counted below one by one.
	Records int64
	// Hits counts the hit records added to Rows.
	Hits int64
	// Outside counts the hit records read whose bucket starts outside [From, To) (read
	// because their Kafka timestamps fall within the slack).
	Outside int64
	// OtherKeys counts the hit records within [From, To) whose key Keep left out.
	OtherKeys int64
	// SiteRecords counts the site heartbeats and leave records skipped.
	SiteRecords int64
	// Rerouted counts the aggregator's re-routed copies skipped: their originals, on the
	// partition they were first written to, are counted instead.
	Rerouted int64
	// Bad counts the records that are not valid hits, skipped; BadReasons by topics.Reason.
	Bad        int64
	BadReasons map[string]int64
	// Truncated lists "topic/partition" whose oldest records were deleted by retention after
	// From − Slack: the range may lack hits there.
	Truncated []string
}

type rowKey struct {
	start  int64
	key    string
	window int64
	site   string
}

// Replay reads the hit records of o's range from every hits topic, from the first offset
// whose timestamp is at or after From − Slack up to the first at or after To + Slack (or
// the end), and adds them up. Malformed records are skipped and counted, never fatal.
func Replay(ctx context.Context, o Options) (*Result, error) {
	o, err := o.normalize()
	if err != nil {
		return nil, err
	}
	res := &Result{BadReasons: make(map[string]int64)}
	from, want, err := plan(ctx, o, res)
	if err != nil {
		return nil, err
	}
	sums := make(map[rowKey]*Row)
	if len(want) > 0 {
		if err := consume(ctx, o, from, want, func(r *kgo.Record) error {
			res.add(o, r, sums)
			if len(sums) > o.MaxRows {
				return fmt.Errorf("%w: more than %d (narrow the range or the keys, or widen the step)", ErrTooManyRows, o.MaxRows)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	res.Rows = make([]Row, 0, len(sums))
	for _, r := range sums {
		res.Rows = append(res.Rows, *r)
	}
	slices.SortFunc(res.Rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.Start, b.Start), strings.Compare(a.Key, b.Key),
			cmp.Compare(a.Window, b.Window), strings.Compare(a.Site, b.Site))
	})
	return res, nil
}

// add counts one record into sums.
func (res *Result) add(o Options, r *kgo.Record, sums map[rowKey]*Row) {
	res.Records++
	for _, h := range r.Headers {
		if h.Key == topics.HeaderRerouted {
			res.Rerouted++
			return
		}
	}
	hs, err := topics.DecodeHits(r.Value) // one hit, a site record, or a hit batch
	if err != nil {
		res.Bad++
		res.BadReasons[topics.Reason(err)]++
		return
	}
	for _, h := range hs {
		res.addHit(o, h, sums)
	}
}

// addHit counts hit h into sums.
func (res *Result) addHit(o Options, h topics.Hit, sums map[rowKey]*Row) {
	if h.IsSiteRecord() {
		res.SiteRecords++
		return
	}
	if h.BucketStart < o.From.UnixMilli() || h.BucketStart >= o.To.UnixMilli() {
		res.Outside++
		return
	}
	if o.Keep != nil && !o.Keep(h.Key) {
		res.OtherKeys++
		return
	}
	res.Hits++
	step := o.Step.Milliseconds()
	k := rowKey{start: h.BucketStart - floorMod(h.BucketStart, step), key: h.Key, window: h.Window, site: h.Site}
	row := sums[k]
	if row == nil {
		row = &Row{Start: k.start, Key: k.key, Window: k.window, Site: k.site}
		sums[k] = row
	}
	row.Admitted += h.Count
	row.Denied += h.Denied
}

func floorMod(a, m int64) int64 {
	r := a % m
	if r < 0 {
		r += m
	}
	return r
}

// plan finds the topics and, per partition, the first offset to read and the offset to stop
// before. Partitions with nothing in the range are left out of want.
func plan(ctx context.Context, o Options, res *Result) (from map[string]map[int32]kgo.Offset, want map[string]map[int32]int64, err error) {
	cl, err := kgo.NewClient(o.Kafka...)
	if err != nil {
		return nil, nil, fmt.Errorf("history: kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	names := o.Topics
	if len(names) == 0 {
		td, err := adm.ListTopics(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("history: listing topics: %w", err)
		}
		re := regexp.MustCompile(topics.HitsPattern(o.HitsTopic))
		for _, n := range td.Names() {
			if re.MatchString(n) {
				names = append(names, n)
			}
		}
		if len(names) == 0 {
			return nil, nil, fmt.Errorf("history: no hits topic %q (nor a copy of it) on the cluster", o.HitsTopic)
		}
	}
	slices.Sort(names)
	res.Topics = names
	list := func(what string, f func() (kadm.ListedOffsets, error)) (kadm.ListedOffsets, error) {
		l, err := f()
		if err == nil {
			err = l.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("history: listing %s offsets of %s: %w", what, strings.Join(names, ", "), err)
		}
		return l, nil
	}
	starts, err := list("start", func() (kadm.ListedOffsets, error) { return adm.ListStartOffsets(ctx, names...) })
	if err != nil {
		return nil, nil, err
	}
	firsts, err := list("first", func() (kadm.ListedOffsets, error) {
		return adm.ListOffsetsAfterMilli(ctx, o.From.Add(-o.Slack).UnixMilli(), names...)
	})
	if err != nil {
		return nil, nil, err
	}
	lasts, err := list("last", func() (kadm.ListedOffsets, error) {
		return adm.ListOffsetsAfterMilli(ctx, o.To.Add(o.Slack).UnixMilli(), names...)
	})
	if err != nil {
		return nil, nil, err
	}
	from = make(map[string]map[int32]kgo.Offset)
	want = make(map[string]map[int32]int64)
	for _, t := range names {
		ps, ok := firsts[t]
		if !ok {
			return nil, nil, fmt.Errorf("history: topic %s not found", t)
		}
		for p, first := range ps {
			if s, ok := starts.Lookup(t, p); ok && s.Offset > 0 && s.Offset == first.Offset && first.Timestamp > o.From.Add(-o.Slack).UnixMilli() {
				res.Truncated = append(res.Truncated, fmt.Sprintf("%s/%d", t, p))
			}
			last, ok := lasts.Lookup(t, p)
			if !ok || last.Offset <= first.Offset {
				continue
			}
			if from[t] == nil {
				from[t], want[t] = make(map[int32]kgo.Offset), make(map[int32]int64)
			}
			from[t][p] = kgo.NewOffset().At(first.Offset)
			want[t][p] = last.Offset
		}
	}
	slices.Sort(res.Truncated)
	return from, want, nil
}

// consume reads every partition of want from its offset in from up to (not including) its
// offset in want, handing each record to f.
func consume(ctx context.Context, o Options, from map[string]map[int32]kgo.Offset, want map[string]map[int32]int64, f func(*kgo.Record) error) error {
	cl, err := kgo.NewClient(append(slices.Clone(o.Kafka), kgo.ConsumePartitions(from))...)
	if err != nil {
		return fmt.Errorf("history: kafka client: %w", err)
	}
	defer cl.Close()
	left := 0
	for _, ps := range want {
		left += len(ps)
	}
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("history: reading the hits topics: %w", err)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			ferr = errors.Join(ferr, fmt.Errorf("history: fetching %s/%d: %w", t, p, err))
		})
		if ferr != nil {
			return ferr
		}
		var stop error
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			end, ok := want[fp.Topic][fp.Partition]
			if !ok {
				return
			}
			for _, r := range fp.Records {
				if r.Offset >= end || stop != nil {
					break
				}
				stop = f(r)
			}
			// The partition is done once the record just before the stop offset has been
			// seen. (Hits topics are not compacted nor written in transactions, so offsets
			// have no gaps; the caller's deadline ends a read that waits for one anyway.)
			if n := len(fp.Records); n > 0 && fp.Records[n-1].Offset >= end-1 {
				delete(want[fp.Topic], fp.Partition)
				left--
			}
		})
		if stop != nil {
			return stop
		}
	}
	return nil
}
