// Package countsview reads the compacted counts topic for people and scripts: it restores
// the topic's current state into memory (the last record per key), ranks counters, follows
// changes as they arrive, and formats counts, ages and tables for `streamlimit counts`.
//
// It is a read-only client of the contract in package topics; nothing here is on the
// request path.
package countsview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/topics"
)

// ErrTooManyKeys is returned by Read when the topic holds more matching counters than
// Options.MaxKeys.
var ErrTooManyKeys = errors.New("countsview: too many counter keys")

// DefaultMaxKeys is Options.MaxKeys when zero.
const DefaultMaxKeys = 1 << 20

// Options says where the counts topic is and how much of it to keep. The zero value is not
// usable: Kafka must hold at least the seed brokers.
type Options struct {
	// Kafka are the client options: seed brokers, TLS, SASL. Consumer options are added by
	// the reader.
	Kafka []kgo.Opt
	// Topic is the counts topic. Default topics.DefaultCountsTopic ("counts").
	Topic string
	// MaxKeys bounds how many counters Read keeps in memory (after Filter); a topic with more
	// makes Read fail with ErrTooManyKeys rather than grow without bound. Default DefaultMaxKeys.
	MaxKeys int
}

func (o Options) normalize() Options {
	if o.Topic == "" {
		o.Topic = topics.DefaultCountsTopic
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = DefaultMaxKeys
	}
	return o
}

// State is the counts topic's content at the end offsets Read saw: for each counter key
// the last record wins, a tombstone removes the key.
type State struct {
	// Counts holds the live counters (those Filter kept), by key.
	Counts map[string]topics.Count
	// Heartbeats holds the latest heartbeat per source partition, sorted by Topic and
	// Partition.
	Heartbeats []topics.Heartbeat
	// Records is how many records Read consumed.
	Records int
	// Deleted is how many kept keys ended on a tombstone.
	Deleted int
	// Bad is how many records could not be decoded (skipped; the key keeps its previous
	// value). BadReasons counts them by topics.Reason.
	Bad        int
	BadReasons map[string]int
}

// Read consumes the counts topic from the start of every partition up to the end offsets
// it lists first, and returns the state. keep, when not nil, selects the counter keys to
// hold in memory (heartbeats are always kept); other reserved keys are skipped. Read stops
// early with ctx's error.
func Read(ctx context.Context, o Options, keep func(key string) bool) (*State, error) {
	o = o.normalize()
	st := &State{Counts: make(map[string]topics.Count), BadReasons: make(map[string]int)}
	deleted := make(map[string]bool)
	hbs := make(map[string]topics.Heartbeat)

	starts, ends, err := offsets(ctx, o)
	if err != nil {
		return nil, err
	}
	want := make(map[int32]int64) // partition → end offset still to reach
	from := make(map[int32]kgo.Offset)
	for p, end := range ends {
		if end > starts[p] {
			want[p] = end
			from[p] = kgo.NewOffset().At(starts[p])
		}
	}
	if len(want) == 0 {
		return st, nil
	}
	cl, err := kgo.NewClient(append(slices.Clone(o.Kafka),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{o.Topic: from}))...)
	if err != nil {
		return nil, fmt.Errorf("countsview: kafka client: %w", err)
	}
	defer cl.Close()

	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("countsview: reading %s: %w", o.Topic, err)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			ferr = errors.Join(ferr, fmt.Errorf("countsview: fetching %s/%d: %w", t, p, err))
		})
		if ferr != nil {
			return nil, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			end, ok := want[r.Partition]
			if !ok || r.Offset >= end {
				return // past the snapshot point
			}
			if r.Offset >= end-1 {
				delete(want, r.Partition)
			}
			st.Records++
			st.apply(r, keep, deleted, hbs)
		})
		if len(st.Counts) > o.MaxKeys {
			return nil, fmt.Errorf("%w: more than %d in %s (narrow it with a prefix or window)", ErrTooManyKeys, o.MaxKeys, o.Topic)
		}
	}
	for k := range deleted {
		if deleted[k] {
			st.Deleted++
		}
	}
	for _, h := range hbs {
		st.Heartbeats = append(st.Heartbeats, h)
	}
	slices.SortFunc(st.Heartbeats, func(a, b topics.Heartbeat) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	return st, nil
}

func (st *State) apply(r *kgo.Record, keep func(string) bool, deleted map[string]bool, hbs map[string]topics.Heartbeat) {
	if topics.IsHeartbeatKey(r.Key) {
		if len(r.Value) == 0 {
			delete(hbs, string(r.Key))
			return
		}
		h, err := topics.DecodeHeartbeat(r.Value)
		if err != nil {
			st.bad(err)
			return
		}
		hbs[string(r.Key)] = h
		return
	}
	if topics.IsReservedKey(r.Key) || (keep != nil && !keep(string(r.Key))) {
		return
	}
	key := string(r.Key)
	if len(r.Value) == 0 {
		delete(st.Counts, key)
		deleted[key] = true
		return
	}
	c, err := topics.DecodeCount(r.Value)
	if err == nil && c.Key != key {
		err = fmt.Errorf("record key %q differs from count key %q", truncate(key), truncate(c.Key))
	}
	if err != nil {
		st.bad(err)
		return
	}
	st.Counts[key] = c
	deleted[key] = false
}

func (st *State) bad(err error) {
	st.Bad++
	st.BadReasons[topics.Reason(err)]++
}

// offsets lists the start and end offset of every partition of the topic.
func offsets(ctx context.Context, o Options) (starts, ends map[int32]int64, err error) {
	cl, err := kgo.NewClient(o.Kafka...)
	if err != nil {
		return nil, nil, fmt.Errorf("countsview: kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	list := func(f func(context.Context, ...string) (kadm.ListedOffsets, error)) (map[int32]int64, error) {
		lo, err := f(ctx, o.Topic)
		if err == nil {
			err = lo.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("countsview: listing offsets of %s: %w", o.Topic, err)
		}
		ps, ok := lo[o.Topic]
		if !ok || len(ps) == 0 {
			return nil, fmt.Errorf("countsview: topic %s not found", o.Topic)
		}
		out := make(map[int32]int64, len(ps))
		for p, l := range ps {
			out[p] = l.Offset
		}
		return out, nil
	}
	if starts, err = list(adm.ListStartOffsets); err != nil {
		return nil, nil, err
	}
	if ends, err = list(adm.ListEndOffsets); err != nil {
		return nil, nil, err
	}
	return starts, ends, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// TopOptions selects and ranks counters for Top. The zero value ranks every counter by
// total and returns all of them.
type TopOptions struct {
	// N is how many counters to return; 0 or less returns all.
	N int
	// Site, when set, ranks by that site's part instead of the total and leaves out
	// counters with nothing at the site.
	Site string
	// Prefix, when set, keeps only keys that start with it.
	Prefix string
	// Window, when set, keeps only counters of that window length.
	Window time.Duration
}

// Top returns the heaviest counters of counts, by total (or by TopOptions.Site's count),
// ties broken by key so the order is deterministic.
func Top(counts map[string]topics.Count, o TopOptions) []topics.Count {
	weight := func(c *topics.Count) float64 {
		if o.Site != "" {
			return c.Site(o.Site)
		}
		return c.Total
	}
	var out []topics.Count
	for k, c := range counts {
		if !strings.HasPrefix(k, o.Prefix) || (o.Window > 0 && c.WindowDuration() != o.Window) {
			continue
		}
		if o.Site != "" && c.Site(o.Site) <= 0 {
			continue
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b topics.Count) int {
		wa, wb := weight(&a), weight(&b)
		switch {
		case wa > wb:
			return -1
		case wa < wb:
			return 1
		}
		return strings.Compare(a.Key, b.Key)
	})
	if o.N > 0 && len(out) > o.N {
		out = out[:o.N]
	}
	return out
}

// Freshness summarises the pipeline's heartbeats at one instant.
type Freshness struct {
	// Sources is the number of source partitions with a heartbeat.
	Sources int
	// OldestAge is now minus the oldest heartbeat's AsOf: counts are at least this fresh.
	OldestAge time.Duration
	// MaxLag is the largest consume lag (HighWatermark − Offset, in records) of any source.
	MaxLag int64
	// Replaying counts the sources whose aggregator is rebuilding state.
	Replaying int
}

// FreshnessAt computes the Freshness of hbs at now. Sources is 0 when hbs is empty.
func FreshnessAt(hbs []topics.Heartbeat, now time.Time) Freshness {
	var f Freshness
	for i, h := range hbs {
		age := now.Sub(h.AsOfTime())
		if i == 0 || age > f.OldestAge {
			f.OldestAge = age
		}
		f.MaxLag = max(f.MaxLag, h.HighWatermark-h.Offset)
		if h.Replaying {
			f.Replaying++
		}
	}
	f.Sources = len(hbs)
	return f
}
