// Package snapshot keeps an in-memory view of the compacted counts topic: for every counter
// key, the aggregator's latest absolute sliding-window count with its per-site breakdown,
// and for every source partition of the hits topics, the aggregator's latest heartbeat.
//
// The enforcer's global decision reads the view on every request (docs/architecture.md, invariant 3:
// used = total − mine + local exact count), so a lookup is a lock-free map load that does
// not allocate, while one follower goroutine applies the topic's records.
// The view is also how the enforcer knows when to stop trusting it: Stale reports when the
// heartbeats say the counts are older than a bound, or being rebuilt (invariant 5).
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/internal/memsize"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// Defaults of Config.
const (
	// DefaultMaxKeys is Config.MaxKeys when zero.
	DefaultMaxKeys = 1 << 20
	// DefaultMaxStaleness is Config.MaxStaleness when zero.
	DefaultMaxStaleness = 10 * time.Second
	// DefaultSweepInterval is Config.SweepInterval when zero.
	DefaultSweepInterval = 10 * time.Second
	// DefaultMaxClockSkew is Config.MaxClockSkew when zero: the bound the aggregator puts
	// on hits from the future, so that a count is held to what its hits were.
	DefaultMaxClockSkew = 30 * time.Second
	// DefaultMaxCountAhead is Config.MaxCountAhead when zero: an aggregator dates a count
	// by its own clock when it publishes it, so a count from further ahead than two clocks
	// within clock.MaxSkew of true time can differ (clock.MaxAhead) was not made by an
	// aggregator.
	DefaultMaxCountAhead = clock.MaxAhead
	// maxInternedSites bounds the table that shares site-name strings between entries.
	maxInternedSites = 4096
	// maxServedSites bounds the table of sites' served times (SiteTime.Served): a site
	// past it is not known to have served, as if it had not.
	maxServedSites = 4096
)

// Errors returned by Apply, in addition to the topics.Err* record errors it passes on.
// Each is also counted in bad_records_total under the reason in its comment.
var (
	// ErrKeyMismatch: the record key differs from the key inside the value
	// (reason "key_mismatch").
	ErrKeyMismatch = errors.New("record key does not match the key in the value")
	// ErrFull: a count for a new key arrived while the snapshot held MaxKeys keys, or had
	// no room for it within MaxBytes; it was refused (counted in refused_keys_total, not in
	// bad_records_total).
	ErrFull = errors.New("snapshot full")
	// ErrSubBuckets: the count was made on another sub-bucket grid than Config.SubBuckets
	// (reason "sub_buckets"): the aggregator and the enforcers are configured differently,
	// and the own-site count the enforcer subtracts would not match the one it replaces.
	ErrSubBuckets = errors.New("count made with another number of sub-buckets")
	// ErrTooFarFuture: a count's as-of time, or a heartbeat's as-of or site time, is more
	// than Config.MaxClockSkew ahead of the clock (reason "too_far_future"). Believed, a
	// count from the future would hold its key until the future time plus a window, and a
	// heartbeat from the future would make the snapshot, or a silent site, look fresh.
	ErrTooFarFuture = errors.New("time too far in the future")
	// ErrBadTotal: a count's total is not the sum of its sites' counts (reason
	// "bad_total"), so the two views the decision reads would disagree.
	ErrBadTotal = errors.New("total is not the sum of the sites' counts")
)

// Reasons of bad_records_total that Apply adds to topics.Reasons.
const (
	ReasonKeyMismatch  = "key_mismatch"
	ReasonSubBuckets   = "sub_buckets"
	ReasonTooFarFuture = "too_far_future"
	ReasonBadTotal     = "bad_total"
	// ReasonUnknownInstance: a record of the counts topic not written by one of
	// Config.Aggregators.
	ReasonUnknownInstance = "unknown_instance"
)

// Config configures a Snapshot. Every field has a usable zero value, written in its comment,
// except Brokers, which New requires and NewMemory ignores.
type Config struct {
	// Brokers are the Kafka bootstrap addresses (host:port) of the cluster holding the
	// counts topic. Required by New.
	Brokers []string
	// KafkaOpts are added to the follower's kgo client options after the seed brokers, for
	// TLS, SASL, client ID and the like. They must not configure a consumer group or other
	// consume topics: the snapshot consumes the counts topic directly.
	KafkaOpts []kgo.Opt
	// Topic is the counts topic. Default topics.DefaultCountsTopic ("counts").
	Topic string
	// Site is this enforcer's site, the one whose count Entry.Mine carries. Default "" (no
	// site: Mine is always 0).
	Site string
	// MaxKeys bounds the number of counter keys held. A count for a new key arriving when
	// the bound is reached first sweeps the expired entries (at most once a second), and is
	// refused and counted (refused_keys_total) when none has expired, until tombstones or
	// the idle sweep make room: a count still in its window is never dropped for a new
	// key, so a full snapshot never frees a client at its limit. Default DefaultMaxKeys.
	MaxKeys int
	// MaxBytes bounds the bytes the entries keep alive, by an estimate per entry (its
	// Entry, per-site breakdown, key and map node), as MaxKeys bounds their number: a count
	// for a new key that does not fit is refused. Both bounds apply. Default 0: no bound in
	// bytes.
	MaxBytes int64
	// MaxStaleness is how old the oldest source's latest heartbeat may be before Stale
	// reports true. Default DefaultMaxStaleness (10 s).
	MaxStaleness time.Duration
	// SubBuckets is the number of sub-buckets the enforcer counts its own site with; a
	// count that states another is refused (ErrSubBuckets) and logged at error level.
	// Default window.DefaultSubBuckets.
	SubBuckets int
	// SweepInterval is how often Run removes idle entries (see Sweep). Default
	// DefaultSweepInterval (10 s).
	SweepInterval time.Duration
	// MaxClockSkew is how far ahead of Clock a heartbeat's times may be before the record
	// is refused (ErrTooFarFuture). Default DefaultMaxClockSkew.
	MaxClockSkew time.Duration
	// MaxCountAhead is how far ahead of Clock a count's as-of time may be before the count
	// is refused (ErrTooFarFuture): a count dated ahead would be taken as newer than this
	// site's own hits. Default DefaultMaxCountAhead.
	MaxCountAhead time.Duration
	// Aggregators, when set, are the instance IDs of the aggregators that write the counts
	// topic: Run skips, and counts as unknown_instance, every record (count, tombstone,
	// heartbeat) whose topics.InstanceHeader names none of them, or that has none.
	// Default none: every record is believed.
	Aggregators []string
	// Clock tells the time for staleness and idle eviction. Default clock.Real{}.
	Clock clock.Clock
	// Logger receives the follower's progress and problems. Default: discard.
	Logger *slog.Logger
	// Registerer receives the metrics (namespace streamlimit, subsystem snapshot). Default
	// nil: metrics are kept but not registered.
	Registerer prometheus.Registerer
}

func (c Config) normalize() (Config, error) {
	if c.Topic == "" {
		c.Topic = topics.DefaultCountsTopic
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultMaxKeys
	}
	if c.MaxStaleness == 0 {
		c.MaxStaleness = DefaultMaxStaleness
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.SubBuckets == 0 {
		c.SubBuckets = window.DefaultSubBuckets
	}
	if c.MaxClockSkew == 0 {
		c.MaxClockSkew = DefaultMaxClockSkew
	}
	if c.MaxCountAhead == 0 {
		c.MaxCountAhead = DefaultMaxCountAhead
	}
	c.Clock = clock.Or(c.Clock)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	var errs []error
	if c.MaxKeys < 0 {
		errs = append(errs, fmt.Errorf("snapshot: MaxKeys %d is negative", c.MaxKeys))
	}
	if c.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("snapshot: MaxBytes %d is negative", c.MaxBytes))
	}
	if c.MaxStaleness < 0 {
		errs = append(errs, fmt.Errorf("snapshot: MaxStaleness %v is negative", c.MaxStaleness))
	}
	if c.SweepInterval < 0 {
		errs = append(errs, fmt.Errorf("snapshot: SweepInterval %v is negative", c.SweepInterval))
	}
	if c.MaxClockSkew < 0 {
		errs = append(errs, fmt.Errorf("snapshot: MaxClockSkew %v is negative", c.MaxClockSkew))
	}
	if c.MaxCountAhead < 0 {
		errs = append(errs, fmt.Errorf("snapshot: MaxCountAhead %v is negative", c.MaxCountAhead))
	}
	return c, errors.Join(errs...)
}

// Entry is one counter key's latest count as published by the aggregator. Entries are
// returned by value; Sites is shared with the snapshot and must not be modified.
type Entry struct {
	// Total is the count in the window ending at AsOf, over all sites.
	Total float64
	// Mine is the part of Total counted at Config.Site (0 when the site has none).
	Mine float64
	// Window is the length of the sliding window the count covers.
	Window time.Duration
	// AsOf is the instant the count describes, in unix milliseconds of the aggregator's
	// clock.
	AsOf int64
	// Sites is the per-site breakdown, sorted by site, each site at most once. Read only.
	Sites []topics.SiteCount
}

// Remote returns the part of Total counted at sites other than Config.Site: Total − Mine,
// never negative.
func (e Entry) Remote() float64 { return max(e.Total-e.Mine, 0) }

// Share returns Config.Site's fraction of the key's traffic in the window, Mine/Total, in
// [0, 1]; 0 when Total is 0.
func (e Entry) Share() float64 {
	if e.Total <= 0 {
		return 0
	}
	return min(e.Mine/e.Total, 1)
}

// Site returns the count of site s, or 0 when s has none.
func (e Entry) Site(s string) float64 {
	i, ok := slices.BinarySearchFunc(e.Sites, s, func(c topics.SiteCount, s string) int { return strings.Compare(c.Site, s) })
	if !ok {
		return 0
	}
	return e.Sites[i].Count
}

// AsOfTime returns AsOf as a time.Time.
func (e Entry) AsOfTime() time.Time { return time.UnixMilli(e.AsOf) }

// Expired reports whether every hit the count covers has left the window by now
// (AsOf + Window ≤ now), so that the count is necessarily zero although no tombstone has
// arrived. Expired entries are removed by the next Sweep.
func (e Entry) Expired(now time.Time) bool {
	return e.AsOf+e.Window.Milliseconds() <= now.UnixMilli()
}

// Snapshot is an in-memory view of the counts topic: a bounded map from counter key to
// its latest Entry, and the latest heartbeat of every source partition. Create it with New
// (then call Run to follow Kafka) or NewMemory (then feed it with Apply). Get, Stale and
// the other readers are safe for simultaneous use by multiple goroutines, also while
// records are applied; Get does not allocate and takes no lock.
type Snapshot struct {
	cfg Config
	// entries maps each counter key (string) to its *slot, which holds its *Entry. An
	// *Entry is never modified once stored: Apply replaces it in the slot, so that
	// readers copy it without a lock. sync.Map's lock-free Load keeps a hot key fast
	// under many parallel readers, where a read lock's shared counter would bounce
	// between cores.
	entries sync.Map
	keys    atomic.Int64
	// bytes is what the entries keep alive (entryBytes), reserved before an insert as keys
	// is.
	bytes atomic.Int64
	// version is incremented after every change of entries (see Version).
	version atomic.Uint64
	// nextFullSweep is when a new key that finds the snapshot full may next sweep it
	// (unix ns; see sweepWhenFull).
	nextFullSweep atomic.Int64

	// start is when the snapshot was created, the age of its data until a heartbeat comes.
	start time.Time
	// oldestMs is the smallest AsOf among the sources' latest heartbeats (unix ms), or
	// math.MinInt64 when no heartbeat has been seen; replaying is set while any source's
	// latest heartbeat says Replaying. Both are recomputed at each heartbeat, so that
	// StaleAt costs two atomic loads.
	oldestMs  atomic.Int64
	replaying atomic.Bool

	// skew is the evidence of clock skew the heartbeats give (ClockSkew); lastSkewLog is
	// when a skew past the bound was last logged (unix ns).
	skew        skewMeter
	lastSkewLog atomic.Int64
	// listing is what tells a clock ahead past the bound, whose site records the
	// aggregators refuse (see unlisted).
	listing siteListing

	srcMu   sync.Mutex
	sources map[string]topics.Heartbeat // by heartbeat key
	// sites is the per-site freshness the sources' heartbeats give, rebuilt at each
	// heartbeat (see SiteTimes).
	sites atomic.Pointer[SiteTimes]
	// lastMismatchLog is when ErrSubBuckets was last logged (unix ns), to log it once a
	// minute; lastConflictLog likewise for a conflict on this site.
	lastMismatchLog atomic.Int64
	lastConflictLog atomic.Int64

	internMu sync.Mutex
	intern   map[string]string

	// servedMu guards served: for each site some count applied here lists, the latest
	// as-of time of such a count (unix ms; see SiteTime.Served). Taken inside srcMu.
	servedMu sync.Mutex
	served   map[string]servedTime

	running   atomic.Bool
	ready     atomic.Bool
	readyOnce sync.Once
	readyC    chan struct{}

	met *metrics
}

// New returns a Snapshot that will follow cfg.Topic on cfg.Brokers once Run is called. It
// is empty and not ready until Run has caught up. New does not connect to Kafka.
func New(cfg Config) (*Snapshot, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("snapshot: no Brokers")
	}
	return newSnapshot(cfg)
}

// NewMemory returns a Snapshot without Kafka, fed only through Apply (for tests and the
// accuracy simulator). It is ready at once; the Kafka fields of cfg are ignored and Run
// must not be called.
func NewMemory(cfg Config) (*Snapshot, error) {
	cfg.Brokers, cfg.KafkaOpts = nil, nil
	s, err := newSnapshot(cfg)
	if err != nil {
		return nil, err
	}
	s.markReady()
	return s, nil
}

func newSnapshot(cfg Config) (*Snapshot, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	s := &Snapshot{
		cfg:     cfg,
		start:   cfg.Clock.Now(),
		sources: make(map[string]topics.Heartbeat),
		intern:  make(map[string]string),
		served:  make(map[string]servedTime),
		readyC:  make(chan struct{}),
	}
	s.oldestMs.Store(noHeartbeat)
	s.met, err = newMetrics(s, cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Get returns the latest count of the counter key and true, or a zero Entry and false when
// the snapshot holds no count for it (never published, tombstoned, idle-evicted or refused
// for lack of room: all mean "no known remote traffic"). The entry may be Expired; Get does
// not read the clock. Get does not allocate and takes no lock.
func (s *Snapshot) Get(key string) (Entry, bool) {
	return s.Ref(key).Get()
}

// slot holds one key's latest entry, from the key's first count until it is deleted (a
// tombstone, a sweep): Apply replaces the entry in it, so that a reader holding the slot
// (Ref) reads the key's latest entry without the map lookup. A deleted slot holds dead
// and is left; the key's next count makes a new one.
type slot struct{ p atomic.Pointer[Entry] }

// dead is what a deleted slot holds.
var dead = new(Entry)

// Ref is a reference to one counter key's count in a Snapshot (Snapshot.Ref). Its Get
// reads the key's latest entry without the snapshot's map lookup, a few cache misses on a
// large snapshot, for as long as the snapshot holds a count of the key: a caller that
// reads a key often keeps its Ref rather than calling Snapshot.Get, which Version alone
// would send back to the map at every count applied to any key. The zero Ref holds
// nothing.
type Ref struct{ s *slot }

// Ref returns a reference to the counter key's count; one whose Get reports false when
// the snapshot holds no count for the key. Ref does not allocate and takes no lock.
func (s *Snapshot) Ref(key string) Ref {
	v, ok := s.entries.Load(key)
	if !ok {
		return Ref{}
	}
	return Ref{v.(*slot)}
}

// Get returns the key's latest count and true, as Snapshot.Get does; false once the
// snapshot no longer holds the count it referred to (tombstoned, swept), or for the zero
// Ref. A count for the key applied after that is not seen through r: Snapshot.Ref makes a
// new reference. Get does not allocate and takes no lock.
func (r Ref) Get() (Entry, bool) {
	if r.s == nil {
		return Entry{}, false
	}
	e := r.s.p.Load()
	if e == dead {
		return Entry{}, false
	}
	return *e, true
}

// Version returns a number that grows after every change of the entries (a count set, a
// tombstone applied, an entry swept). A reader that read Version, then called Get, and
// later reads the same Version may reuse Get's result instead of calling Get again: the
// entry it got is still the latest. This lets a caller that decides the same key often skip
// the map lookup while the snapshot is quiet. Version does not allocate and takes no lock.
func (s *Snapshot) Version() uint64 { return s.version.Load() }

// Len returns the number of counter keys held.
func (s *Snapshot) Len() int { return int(s.keys.Load()) }

// Bytes returns what the entries keep alive, by the estimate Config.MaxBytes bounds.
func (s *Snapshot) Bytes() int64 { return s.bytes.Load() }

// Byte estimates of an entry, each rounded up to the allocator's size classes: the Entry,
// the key's string header boxed as the map's key, and the map's node with its share of
// the map's inner nodes (measured: 271 bytes per entry of a 19-byte key and two sites,
// which these put at 272, before the entries were held in slots: slotBytes more now).
const (
	entrySize      = 64
	slotBytes      = 8 // the slot that holds the entry
	boxedKeyBytes  = 16
	mapNodeBytes   = 96
	siteCountBytes = int64(unsafe.Sizeof(topics.SiteCount{}))
)

// entryBytes is what entry e of key keeps alive.
func entryBytes(key string, e *Entry) int64 {
	return entrySize + slotBytes + memsize.Alloc(int64(cap(e.Sites))*siteCountBytes) + memsize.Alloc(int64(len(key))) + boxedKeyBytes + mapNodeBytes
}

// Apply applies one record of the counts topic: a count sets the key's entry (the last
// record applied wins, as in the compacted log), a nil or empty value (tombstone) deletes
// it, and a heartbeat key updates its source's freshness. Other keys with the reserved
// prefix are ignored. A record that does not decode, whose value names another key, whose
// time is more than MaxClockSkew ahead of the clock, or whose total is not the sum of its
// sites, is skipped, counted in bad_records_total by reason, and its error returned (it
// wraps one of the topics.Err* values, ErrKeyMismatch, ErrSubBuckets, ErrTooFarFuture or
// ErrBadTotal); a new key refused because the snapshot holds
// MaxKeys keys returns ErrFull. Apply is safe to call concurrently with readers and with
// itself; Run calls it for every record it consumes.
func (s *Snapshot) Apply(key, value []byte) error {
	if topics.IsReservedKey(key) {
		if topics.IsHeartbeatKey(key) {
			return s.applyHeartbeat(key, value)
		}
		s.met.ignored.Inc()
		return nil
	}
	if len(value) == 0 {
		s.met.tombstones.Inc()
		s.delete(key)
		return nil
	}
	c, err := topics.DecodeCount(value)
	if err != nil {
		s.met.bad(topics.Reason(err))
		return fmt.Errorf("snapshot: count for key %q: %w", truncate(key), err)
	}
	if c.Key != string(key) {
		s.met.bad(ReasonKeyMismatch)
		return fmt.Errorf("snapshot: %w: record key %q, value key %q", ErrKeyMismatch, truncate(key), truncate([]byte(c.Key)))
	}
	if c.SubBuckets != 0 && c.SubBuckets != s.cfg.SubBuckets {
		s.met.bad(ReasonSubBuckets)
		err := fmt.Errorf("snapshot: %w: key %q counted with %d, this enforcer uses %d: configure the aggregators and enforcers alike (--sub-buckets)",
			ErrSubBuckets, truncate(key), c.SubBuckets, s.cfg.SubBuckets)
		s.logMismatch(err)
		return err
	}
	if err := s.checkCount(&c); err != nil {
		return fmt.Errorf("snapshot: count for key %q: %w", truncate(key), err)
	}
	for i := range c.Sites {
		c.Sites[i].Site = s.internSite(c.Sites[i].Site)
	}
	if s.serve(c.Sites, c.AsOf) {
		s.srcMu.Lock()
		s.recomputeLocked()
		s.srcMu.Unlock()
	}
	e := &Entry{Total: c.Total, Mine: c.Site(s.cfg.Site), Window: c.WindowDuration(), AsOf: c.AsOf, Sites: c.Sites}
	if e.Mine > 0 {
		s.listing.counted(s.cfg.Clock.Now().UnixMilli())
	}

	if err := s.set(c.Key, e); err != nil {
		return err
	}
	s.met.applied.Inc()
	return nil
}

// checkCount refuses, and counts, a count from beyond the clock-skew bound or whose total
// disagrees with its sites.
func (s *Snapshot) checkCount(c *topics.Count) error {
	if limit := s.cfg.Clock.Now().Add(s.cfg.MaxCountAhead).UnixMilli(); c.AsOf > limit {
		s.met.bad(ReasonTooFarFuture)
		return fmt.Errorf("%w: as-of %s is more than %v ahead", ErrTooFarFuture, time.UnixMilli(c.AsOf).UTC().Format(time.RFC3339Nano), s.cfg.MaxCountAhead)
	}
	if len(c.Sites) == 0 {
		return nil
	}
	var sum float64
	for _, sc := range c.Sites {
		sum += sc.Count
	}
	// The aggregator adds the same numbers in another order: allow for rounding only.
	if math.Abs(c.Total-sum) > 1e-9*max(1, c.Total, sum) {
		s.met.bad(ReasonBadTotal)
		return fmt.Errorf("%w: total %v, sites %v", ErrBadTotal, c.Total, sum)
	}
	return nil
}

// checkTime refuses, and counts, a time (unix ms) more than MaxClockSkew ahead of the clock.
func (s *Snapshot) checkTime(ms int64, what string) error {
	limit := s.cfg.Clock.Now().Add(s.cfg.MaxClockSkew).UnixMilli()
	if ms > limit {
		s.met.bad(ReasonTooFarFuture)
		return fmt.Errorf("%w: %s %s is more than %v ahead", ErrTooFarFuture, what, time.UnixMilli(ms).UTC().Format(time.RFC3339), s.cfg.MaxClockSkew)
	}
	return nil
}

func (s *Snapshot) set(key string, e *Entry) error {
	cost := entryBytes(key, e)
	for {
		if v, ok := s.entries.Load(key); ok {
			sl := v.(*slot)
			old := sl.p.Load()
			if old == dead {
				// Being deleted: its deleter has counted it out; take it from the map
				// (the deleter's own removal then does nothing) and insert anew.
				s.entries.CompareAndDelete(key, v)
				continue
			}
			if sl.p.CompareAndSwap(old, e) {
				s.bytes.Add(cost - entryBytes(key, old))
				s.version.Add(1)
				return nil
			}
			continue // deleted or replaced meanwhile
		}
		// Reserve room before inserting, so that concurrent Apply calls cannot overshoot.
		if s.keys.Add(1) > int64(s.cfg.MaxKeys) {
			s.keys.Add(-1)
			if s.sweepWhenFull() {
				continue
			}
			s.met.refused.Inc()
			return fmt.Errorf("snapshot: key %q: %w (%d keys)", truncate([]byte(key)), ErrFull, s.cfg.MaxKeys)
		}
		if b := s.bytes.Add(cost); s.cfg.MaxBytes > 0 && b > s.cfg.MaxBytes {
			s.bytes.Add(-cost)
			s.keys.Add(-1)
			if s.sweepWhenFull() {
				continue
			}
			s.met.refused.Inc()
			return fmt.Errorf("snapshot: key %q: %w (%d bytes)", truncate([]byte(key)), ErrFull, s.cfg.MaxBytes)
		}
		sl := new(slot)
		sl.p.Store(e)
		if _, loaded := s.entries.LoadOrStore(key, sl); !loaded {
			s.version.Add(1)
			return nil
		}
		s.keys.Add(-1) // inserted by a concurrent Apply: update it instead
		s.bytes.Add(-cost)
	}
}

// sweepWhenFull sweeps the expired entries when a new key finds the snapshot full, at
// most once a second (a sweep reads every entry), and reports whether it removed any: the
// counts of keys whose windows have passed go before a new key is refused, and a full
// snapshot never drops a count that is still in its window (see Config.MaxKeys).
func (s *Snapshot) sweepWhenFull() bool {
	now := s.cfg.Clock.Now()
	next := s.nextFullSweep.Load()
	if now.UnixNano() < next || !s.nextFullSweep.CompareAndSwap(next, now.Add(time.Second).UnixNano()) {
		return false
	}
	return s.Sweep(now) > 0
}

func (s *Snapshot) delete(key []byte) {
	v, ok := s.entries.Load(string(key))
	if !ok {
		return
	}
	k, sl := string(key), v.(*slot)
	for {
		old := sl.p.Load()
		if old == dead {
			return // deleted by another
		}
		if s.kill(k, v, sl, old) {
			return
		}
	}
}

// kill deletes key's slot sl (the map's value v) if it still holds old, and reports
// whether it did: the slot is marked dead first, so that no Apply writes into a slot on
// its way out of the map, then taken from the map, and counted out.
func (s *Snapshot) kill(key string, v any, sl *slot, old *Entry) bool {
	if !sl.p.CompareAndSwap(old, dead) {
		return false
	}
	s.entries.CompareAndDelete(key, v)
	s.keys.Add(-1)
	s.bytes.Add(-entryBytes(key, old))
	s.version.Add(1)
	return true
}

// internSite returns a string equal to site that is shared by every entry naming the site,
// so that a million entries over three sites hold three site strings, not three million.
func (s *Snapshot) internSite(site string) string {
	s.internMu.Lock()
	defer s.internMu.Unlock()
	if v, ok := s.intern[site]; ok {
		return v
	}
	if len(s.intern) < maxInternedSites {
		s.intern[site] = site
	}
	return site
}

// Sweep removes the entries that are Expired at now and returns how many it removed
// (counted in evicted_total). Such a count's hits have all left its window, so it is zero
// although the tombstone that says so has not arrived (the aggregator may be down, or the
// tombstone compacted away). An entry replaced by a fresh count during the sweep is kept.
// Run sweeps every SweepInterval; NewMemory users call Sweep themselves. Sweep does not
// block readers.
func (s *Snapshot) Sweep(now time.Time) int {
	nowMs := now.UnixMilli()
	removed := 0
	s.entries.Range(func(k, v any) bool {
		sl := v.(*slot)
		if e := sl.p.Load(); e != dead && e.AsOf+e.Window.Milliseconds() <= nowMs && s.kill(k.(string), v, sl, e) {
			removed++
		}
		return true
	})
	s.met.evicted.Add(float64(removed))
	return removed
}

// logMismatch logs a sub-bucket mismatch at error level, at most once a minute: it means
// every count is refused and global limits are decided on local shares only.
func (s *Snapshot) logMismatch(err error) {
	now := time.Now().UnixNano()
	if last := s.lastMismatchLog.Load(); now-last < int64(time.Minute) || !s.lastMismatchLog.CompareAndSwap(last, now) {
		return
	}
	s.cfg.Logger.Error("counts refused: sub-bucket grids differ", "err", err)
}

func truncate(b []byte) string {
	const n = 64
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// Ready reports whether the snapshot has applied every record that was in the counts topic
// when Run started (always true for NewMemory). Once true it stays true, even if the
// follower later falls behind: Stale tells that.
func (s *Snapshot) Ready() bool { return s.ready.Load() }

// ReadyC returns a channel that is closed when the snapshot becomes ready.
func (s *Snapshot) ReadyC() <-chan struct{} { return s.readyC }

// WaitReady blocks until the snapshot is ready or ctx is done, and returns nil or
// ctx.Err().
func (s *Snapshot) WaitReady(ctx context.Context) error {
	select {
	case <-s.readyC:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Snapshot) markReady() {
	s.readyOnce.Do(func() {
		s.ready.Store(true)
		s.met.ready.Set(1)
		close(s.readyC)
	})
}
