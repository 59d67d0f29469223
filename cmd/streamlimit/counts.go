package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/cmd/streamlimit/internal/countsview"
	"github.com/streamlimit/streamlimit/topics"
)

// countsFlags are the settings shared by the counts subcommands.
type countsFlags struct {
	kf      kafkaFlags
	topic   string
	json    bool
	timeout time.Duration
	maxKeys int
	// now, when set (hidden --now, RFC 3339), fixes the instant ages are computed from, so
	// that output is reproducible in tests.
	now string
}

func (c *countsFlags) register(cmd *cobra.Command) {
	c.kf.register(cmd)
	addConfigFlag(cmd)
	f := cmd.Flags()
	f.StringVar(&c.topic, "counts-topic", topics.DefaultCountsTopic, "compacted counts topic")
	f.BoolVar(&c.json, "json", false, "print JSON (the counts topic's JSON form plus age_ms) instead of a table")
	f.StringVar(&c.now, "now", "", "compute ages as of this RFC 3339 instant (for reproducible output)")
	_ = f.MarkHidden("now")
}

// registerRead adds the flags of the commands that read the whole topic.
func (c *countsFlags) registerRead(cmd *cobra.Command) {
	f := cmd.Flags()
	f.DurationVar(&c.timeout, "timeout", time.Minute, "give up reading the topic after this long")
	f.IntVar(&c.maxKeys, "max-keys", countsview.DefaultMaxKeys, "fail rather than hold more than this many counters in memory")
}

func (c *countsFlags) clock() (clock.Clock, error) {
	if c.now == "" {
		return clock.Real{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, c.now)
	if err != nil {
		return nil, fmt.Errorf("--now: %w", err)
	}
	return clock.NewFake(t), nil
}

func (c *countsFlags) options() (countsview.Options, error) {
	opts, err := c.kf.opts()
	if err != nil {
		return countsview.Options{}, err
	}
	return countsview.Options{Kafka: opts, Topic: c.topic, MaxKeys: c.maxKeys}, nil
}

// read restores the counts topic (the counters keep selects) within --timeout.
func (c *countsFlags) read(ctx context.Context, keep func(string) bool) (*countsview.State, error) {
	o, err := c.options()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return countsview.Read(ctx, o, keep)
}

func newCountsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "counts",
		Short: "Read and analyse the counts topic: get one key, top-N, tail",
		Long: `counts reads the compacted counts topic that the aggregator publishes: each counter
key's absolute sliding-window count across all sites, with the per-site breakdown. get and
top read the whole topic up to its current end (the last record per key wins; deleted keys
are left out); tail follows changes as they arrive. --json prints the counts topic's JSON
form with an extra "age_ms" (now − asof).`,
	}
	cmd.AddCommand(newCountsGetCmd(), newCountsTopCmd(), newCountsTailCmd())
	cmd.AddCommand(newCountsExportCmd(), newCountsPlotCmd()) // history.go: past usage from the hits topics
	return cmd
}

func newCountsGetCmd() *cobra.Command {
	var cf countsFlags
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Print one counter: total, window, as-of and age, per-site breakdown",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			clk, err := cf.clock()
			if err != nil {
				return err
			}
			key := args[0]
			st, err := cf.read(cmd.Context(), func(k string) bool { return k == key })
			if err != nil {
				return err
			}
			c, ok := st.Counts[key]
			if !ok {
				why := "no record"
				if st.Deleted > 0 {
					why = "deleted (its count fell to zero)"
				}
				return fmt.Errorf("counts get: key %q is not in topic %s: %s", key, cf.topic, why)
			}
			now := clk.Now()
			out := cmd.OutOrStdout()
			if cf.json {
				b, err := countsview.AppendCountJSON(nil, &c, now)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(out, "%s\n", b)
				return err
			}
			printCount(out, &c, now)
			fmt.Fprintln(out)
			printFooter(out, st, now)
			return nil
		},
	}
	cf.register(cmd)
	cf.registerRead(cmd)
	return cmd
}

func printCount(w io.Writer, c *topics.Count, now time.Time) {
	head := countsview.Table{}
	head.Add("key", c.Key)
	head.Add("window", c.WindowDuration().String())
	head.Add("total", countsview.FormatCount(c.Total))
	head.Add("as of", countsview.FormatTime(c.AsOf)+" (age "+countsview.FormatAge(now.Sub(c.AsOfTime()))+")")
	_, _ = head.WriteTo(w)
	if len(c.Sites) == 0 {
		return
	}
	fmt.Fprintln(w)
	sites := countsview.Table{Header: []string{"SITE", "COUNT", "SHARE"}, Right: []bool{false, true, true}}
	for _, s := range c.Sites {
		share := "-"
		if c.Total > 0 {
			share = countsview.FormatCount(100*s.Count/c.Total) + "%"
		}
		sites.Add(s.Site, countsview.FormatCount(s.Count), share)
	}
	_, _ = sites.WriteTo(w)
}

// printFooter prints what was skipped and the pipeline's freshness from heartbeats.
func printFooter(w io.Writer, st *countsview.State, now time.Time) {
	fmt.Fprintf(w, "read %s: %s, %d deleted, %d undecodable skipped", plural(st.Records, "record"), plural(len(st.Counts), "counter"), st.Deleted, st.Bad)
	if st.Bad > 0 {
		reasons := make([]string, 0, len(st.BadReasons))
		for r, n := range st.BadReasons {
			reasons = append(reasons, fmt.Sprintf("%s %d", r, n))
		}
		slices.Sort(reasons)
		fmt.Fprintf(w, " (%s)", strings.Join(reasons, ", "))
	}
	fmt.Fprintln(w)
	f := countsview.FreshnessAt(st.Heartbeats, now)
	if f.Sources == 0 {
		fmt.Fprintln(w, "pipeline: no heartbeats (is an aggregator running?)")
		return
	}
	fmt.Fprintf(w, "pipeline: %d source partitions, oldest heartbeat %s ago, max lag %d records", f.Sources, countsview.FormatAge(f.OldestAge), f.MaxLag)
	if f.Replaying > 0 {
		fmt.Fprintf(w, ", %d replaying", f.Replaying)
	}
	fmt.Fprintln(w)
}

func newCountsTopCmd() *cobra.Command {
	var (
		cf countsFlags
		to countsview.TopOptions
	)
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Print the heaviest counters now, by total or by one site's count",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			clk, err := cf.clock()
			if err != nil {
				return err
			}
			st, err := cf.read(cmd.Context(), func(k string) bool { return strings.HasPrefix(k, to.Prefix) })
			if err != nil {
				return err
			}
			now := clk.Now()
			top := countsview.Top(st.Counts, to)
			out := cmd.OutOrStdout()
			if cf.json {
				if st.Bad > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "skipped %d undecodable records\n", st.Bad)
				}
				b := []byte{'['}
				for i := range top {
					if i > 0 {
						b = append(b, ',')
					}
					if b, err = countsview.AppendCountJSON(b, &top[i], now); err != nil {
						return err
					}
				}
				_, err = fmt.Fprintf(out, "%s]\n", b)
				return err
			}
			printTop(out, top, to.Site, now)
			fmt.Fprintln(out)
			printFooter(out, st, now)
			return nil
		},
	}
	cf.register(cmd)
	cf.registerRead(cmd)
	f := cmd.Flags()
	f.IntVarP(&to.N, "n", "n", 20, "how many counters to show (0: all)")
	f.StringVar(&to.Site, "site", "", "rank by this site's count (counters with nothing there are left out)")
	f.StringVar(&to.Prefix, "prefix", "", "only keys starting with this, e.g. the domain \"api|\"")
	f.DurationVar(&to.Window, "window", 0, "only counters of this window length, e.g. 1m")
	return cmd
}

func printTop(w io.Writer, top []topics.Count, site string, now time.Time) {
	var sites []string
	for _, c := range top {
		for _, s := range c.Sites {
			if !slices.Contains(sites, s.Site) {
				sites = append(sites, s.Site)
			}
		}
	}
	slices.Sort(sites)
	if i := slices.Index(sites, site); i > 0 { // the ranking site first
		sites = append([]string{site}, slices.Delete(sites, i, i+1)...)
	}
	t := countsview.Table{Header: []string{"#", "KEY", "WINDOW", "TOTAL"}, Right: []bool{true, false, true, true}}
	for _, s := range sites {
		t.Header = append(t.Header, s) // site names are case-sensitive: as they are
		t.Right = append(t.Right, true)
	}
	t.Header = append(t.Header, "AGE")
	t.Right = append(t.Right, true)
	for i, c := range top {
		row := []string{fmt.Sprint(i + 1), c.Key, c.WindowDuration().String(), countsview.FormatCount(c.Total)}
		for _, s := range sites {
			v := "-" // no entry for the site
			if slices.ContainsFunc(c.Sites, func(e topics.SiteCount) bool { return e.Site == s }) {
				v = countsview.FormatCount(c.Site(s))
			}
			row = append(row, v)
		}
		row = append(row, countsview.FormatAge(now.Sub(c.AsOfTime())))
		t.Add(row...)
	}
	if len(top) == 0 {
		fmt.Fprintln(w, "no counters")
		return
	}
	_, _ = t.WriteTo(w)
}

func newCountsTailCmd() *cobra.Command {
	var (
		cf     countsFlags
		to     countsview.TailOptions
		follow bool
		maxN   int
		dur    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Print counter changes as they arrive (deleted keys as \"deleted\")",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			clk, err := cf.clock()
			if err != nil {
				return err
			}
			o, err := cf.options()
			if err != nil {
				return err
			}
			to.NoFollow = !follow
			ctx := cmd.Context()
			if dur > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, dur)
				defer cancel()
			}
			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			n := 0
			var line []byte
			err = countsview.Tail(ctx, o, to, func(ch countsview.Change) error {
				line = line[:0]
				if line, err = appendChange(line, &ch, clk.Now(), cf.json); err != nil {
					return err
				}
				if _, err := out.Write(line); err != nil {
					return err
				}
				if n++; maxN > 0 && n >= maxN {
					return countsview.ErrStop
				}
				return nil
			}, func(key []byte, err error) {
				fmt.Fprintf(errOut, "skipped undecodable record %q: %v\n", key, err)
			})
			if errors.Is(err, context.DeadlineExceeded) {
				return nil
			}
			return err
		},
	}
	cf.register(cmd)
	f := cmd.Flags()
	f.BoolVar(&follow, "follow", true, "keep waiting for changes (false: stop at the current end)")
	f.BoolVar(&to.FromBeginning, "from-beginning", false, "start at the beginning of the topic instead of its end")
	f.IntVar(&maxN, "max", 0, "stop after this many changes (0: no limit)")
	f.DurationVar(&dur, "for", 0, "stop after this long (0: until interrupted)")
	return cmd
}

// appendChange appends one tail line: JSON, or "asof  key  total N  window W  sites …  age A".
func appendChange(dst []byte, ch *countsview.Change, now time.Time, asJSON bool) ([]byte, error) {
	if ch.Count == nil {
		if asJSON {
			dst = append(dst, `{"key":`...)
			dst = appendQuoted(dst, ch.Key)
			dst = fmt.Appendf(dst, `,"deleted":true,"ts":%d}`, ch.Time.UnixMilli())
			return append(dst, '\n'), nil
		}
		return fmt.Appendf(dst, "%s  %s  deleted\n", countsview.FormatTime(ch.Time.UnixMilli()), ch.Key), nil
	}
	c := ch.Count
	if asJSON {
		dst, err := countsview.AppendCountJSON(dst, c, now)
		return append(dst, '\n'), err
	}
	return fmt.Appendf(dst, "%s  %s  total %s  window %s  sites %s  age %s\n",
		countsview.FormatTime(c.AsOf), c.Key, countsview.FormatCount(c.Total), c.WindowDuration(),
		countsview.FormatSites(c), countsview.FormatAge(now.Sub(c.AsOfTime()))), nil
}

// appendQuoted appends s as a JSON string.
func appendQuoted(dst []byte, s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return append(dst, b...)
}
