package rules

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/streamlimit/streamlimit/clock"
)

// ReloaderOptions configures a Reloader.
type ReloaderOptions struct {
	// Interval is how often Run checks the files. Default (0): DefaultReloadInterval.
	Interval time.Duration
	// Settle is how long a change must stay as it is before it is loaded: Run reads a
	// changed path again Settle after it first saw the change, and loads it only if every
	// file's content, size and modification time are still what they were, else waits
	// again. A file rewritten in place (not written aside and renamed) is thus not loaded
	// half-written. Default (0): DefaultReloadSettle; negative: a change is loaded as soon
	// as it is seen.
	Settle time.Duration
	// Logger receives one record per reload and per rejected edit. Default (nil): discard.
	Logger *slog.Logger
	// Clock stamps Stats.LastReload. Default (nil): clock.Real{}.
	Clock clock.Clock
	// Load says how the files become a Config (Compat, MergeDomains).
	Load LoadOptions
	// OnReload, if set, is called with each newly loaded Config (not the initial one), from
	// the goroutine that detected the change.
	OnReload func(*Config)
}

// ReloadStats are a Reloader's counters.
type ReloadStats struct {
	// Reloads counts successful reloads after the initial load.
	Reloads uint64
	// Failures counts rejected edits (each distinct broken content once) and unreadable
	// paths (each check).
	Failures uint64
	// LastError is the last rejection, or nil once a later edit loaded.
	LastError error
	// LastReload is when the Config in force was loaded.
	LastReload time.Time
}

// DefaultReloadInterval is ReloaderOptions.Interval when zero.
const DefaultReloadInterval = time.Second

// DefaultReloadSettle is ReloaderOptions.Settle when zero: longer than an editor or a
// deployment tool takes to write a rules file, short enough that an edit still applies
// within about a second.
const DefaultReloadSettle = 250 * time.Millisecond

// Reloader keeps the rules of a file or directory current. It polls: every Interval it
// reads the path (all *.yaml/*.yml files for a directory) and, when the content has
// changed and then stayed as it is for Settle, loads it. A broken edit is rejected: it is logged with its file:line error and
// counted, and the last good Config stays in force until an edit loads. Polling content
// (not mtimes or inotify) sees every kind of update, including symlink swaps and editors
// that replace files. Every read is bounded (LoadOptions.MaxFileBytes) and refuses what is
// not a regular file, so a path swapped to a named pipe or a device is a counted, logged
// failure that leaves the last good rules in force, never a hang or a crash.
//
// A Reloader is safe for simultaneous use; Current is a single atomic load.
type Reloader struct {
	path string
	opts ReloaderOptions
	clk  clock.Clock
	log  *slog.Logger
	cur  atomic.Pointer[Config]

	mu       sync.Mutex // serializes Check and guards the fields below
	good     [sha256.Size]byte
	bad      [sha256.Size]byte
	hasBad   bool
	pending  [sha256.Size]byte // the stamp of a change seen but not settled
	settling bool              // pending is set
	reloads  uint64
	failures uint64
	lastErr  error
	lastLoad time.Time
}

// NewReloader loads path (see LoadWith) with opts.Load and returns a Reloader holding it. It fails if the
// initial load fails, so that a bad rules file is a clear error at start.
func NewReloader(path string, opts ReloaderOptions) (*Reloader, error) {
	if opts.Interval <= 0 {
		opts.Interval = DefaultReloadInterval
	}
	if opts.Settle == 0 {
		opts.Settle = DefaultReloadSettle
	}
	r := &Reloader{path: path, opts: opts, clk: clock.Or(opts.Clock), log: opts.Logger}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	srcs, err := read(path, r.opts.Load)
	if err != nil {
		return nil, err
	}
	c, err := build(srcs, r.opts.Load)
	if err != nil {
		return nil, err
	}
	r.good = fingerprint(srcs)
	r.cur.Store(c)
	r.lastLoad = r.clk.Now()
	return r, nil
}

func fingerprint(srcs []source) [sha256.Size]byte {
	h := sha256.New()
	for _, s := range srcs {
		h.Write([]byte(s.name))
		h.Write([]byte{0})
		h.Write(s.data)
		h.Write([]byte{0})
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// stamp is fingerprint with every file's size and modification time: what must not
// change while a change settles.
func stamp(srcs []source) [sha256.Size]byte {
	h := sha256.New()
	sum := fingerprint(srcs)
	h.Write(sum[:])
	for _, s := range srcs {
		fmt.Fprintf(h, "%d %d\x00", s.size, s.mtime.UnixNano())
	}
	h.Sum(sum[:0])
	return sum
}

// Current returns the Config in force. It never returns nil.
func (r *Reloader) Current() *Config { return r.cur.Load() }

// Check reads the path once and loads it if it changed and the change has settled: if
// the previous Check saw the same change (the same content, sizes and modification
// times), or at once when Settle is negative. It reports whether a new Config is now in
// force, and the error that rejected the change, if any. Run spaces the two checks of a
// change Settle apart.
func (r *Reloader) Check() (bool, error) {
	ok, _, err := r.check()
	return ok, err
}

// check is Check, and reports whether a change waits to settle.
func (r *Reloader) check() (loaded, settling bool, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	srcs, err := read(r.path, r.opts.Load)
	if err != nil {
		r.settling = false
		r.failures++
		r.lastErr = err
		r.log.Error("rules: cannot read, keeping the last good rules", "path", r.path, "err", err)
		return false, false, err
	}
	sum := fingerprint(srcs)
	if sum == r.good || (r.hasBad && sum == r.bad) {
		r.settling = false
		return false, false, nil
	}
	if r.opts.Settle > 0 {
		if st := stamp(srcs); !r.settling || st != r.pending {
			r.pending, r.settling = st, true
			r.log.Debug("rules: change seen, loading it once it has settled", "path", r.path, "settle", r.opts.Settle)
			return false, true, nil
		}
	}
	r.settling = false
	c, err := build(srcs, r.opts.Load)
	if err != nil {
		r.bad, r.hasBad = sum, true
		r.failures++
		r.lastErr = err
		r.log.Error("rules: edit rejected, keeping the last good rules", "path", r.path, "err", err)
		return false, false, err
	}
	r.good, r.hasBad = sum, false
	r.cur.Store(c)
	r.reloads++
	r.lastErr = nil
	r.lastLoad = r.clk.Now()
	r.log.Info("rules: reloaded", "path", r.path, "domains", len(c.domains))
	if r.opts.OnReload != nil {
		r.opts.OnReload(c)
	}
	return true, false, nil
}

// Run calls Check every Interval until ctx is done, then returns nil. When a Check sees a
// change, the next Check is Settle later, whatever Interval says, so that a change is
// loaded only once it has stayed as it is for Settle.
func (r *Reloader) Run(ctx context.Context) error {
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	var settled <-chan time.Time // set while a change settles
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if settled != nil {
				continue // the change's own check comes Settle after it was seen
			}
		case <-settled:
		}
		settled = nil
		// Failures are logged and counted by check.
		if _, settling, _ := r.check(); settling {
			settled = time.After(r.opts.Settle)
		}
	}
}

// Stats returns the reloader's counters.
func (r *Reloader) Stats() ReloadStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return ReloadStats{Reloads: r.reloads, Failures: r.failures, LastError: r.lastErr, LastReload: r.lastLoad}
}

// Static returns a source of rules that are never reloaded, in the form a Reloader's
// Current takes (enforcer.Config.Rules): it always returns c.
func Static(c *Config) func() *Config { return func() *Config { return c } }
