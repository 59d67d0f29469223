package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamlimit/streamlimit/cmd/streamlimit/internal/history"
	"github.com/streamlimit/streamlimit/topics"
)

// historyFlags are the settings shared by counts export and counts plot.
type historyFlags struct {
	kf        kafkaFlags
	hitsTopic string
	topics    []string
	from, to  string
	step      time.Duration
	slack     time.Duration
	timeout   time.Duration
	maxRows   int
}

func (h *historyFlags) register(cmd *cobra.Command) {
	h.kf.register(cmd)
	addConfigFlag(cmd)
	f := cmd.Flags()
	f.StringVar(&h.hitsTopic, "hits-topic", topics.DefaultHitsTopic, "local hits topic; its MirrorMaker-2 copies <dc>.<hits-topic> are read too, so every site is counted once")
	f.StringSliceVar(&h.topics, "topics", nil, "read exactly these hits topics instead (comma separated)")
	f.StringVar(&h.from, "from", "1h", "start of the range: RFC 3339 (2026-11-25T10:00:00Z), or a duration back from now (90m)")
	f.StringVar(&h.to, "to", "now", "end of the range (excluded): RFC 3339, a duration back from now, or now")
	f.DurationVar(&h.step, "step", history.DefaultStep, "width of a row's time bucket (whole milliseconds)")
	f.DurationVar(&h.slack, "slack", history.DefaultSlack, "read records whose Kafka timestamps are this far outside the range (hits are then kept by their bucket start)")
	f.DurationVar(&h.timeout, "timeout", 5*time.Minute, "give up reading the hits topics after this long")
	f.IntVar(&h.maxRows, "max-rows", history.DefaultMaxRows, "fail rather than hold more than this many rows in memory")
}

// instant parses a --from or --to value.
func instant(flag, v string, now time.Time) (time.Time, error) {
	if v == "now" {
		return now, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("--%s %q: not RFC 3339 (2026-11-25T10:00:00Z), a duration (90m) or now", flag, v)
	}
	return t, nil
}

func (h *historyFlags) options(keep func(string) bool) (history.Options, error) {
	now := time.Now()
	from, err := instant("from", h.from, now)
	if err != nil {
		return history.Options{}, err
	}
	to, err := instant("to", h.to, now)
	if err != nil {
		return history.Options{}, err
	}
	kopts, err := h.kf.opts()
	if err != nil {
		return history.Options{}, err
	}
	return history.Options{Kafka: kopts, HitsTopic: h.hitsTopic, Topics: h.topics, From: from, To: to,
		Step: h.step, Slack: h.slack, Keep: keep, MaxRows: h.maxRows}, nil
}

// replay reads the range within --timeout and reports what was skipped on errOut.
func (h *historyFlags) replay(ctx context.Context, o history.Options, errOut io.Writer) (*history.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	res, err := history.Replay(ctx, o)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(errOut, "read %s from %s: %d hits in %s, %d outside the range, %d of other keys, %d site records, %d re-routed copies, %d undecodable skipped",
		plural(int(res.Records), "record"), strings.Join(res.Topics, ", "), res.Hits, plural(len(res.Rows), "row"),
		res.Outside, res.OtherKeys, res.SiteRecords, res.Rerouted, res.Bad)
	if res.Bad > 0 {
		reasons := make([]string, 0, len(res.BadReasons))
		for r, n := range res.BadReasons {
			reasons = append(reasons, fmt.Sprintf("%s %d", r, n))
		}
		slices.Sort(reasons)
		fmt.Fprintf(errOut, " (%s)", strings.Join(reasons, ", "))
	}
	fmt.Fprintln(errOut)
	if len(res.Truncated) > 0 {
		fmt.Fprintf(errOut, "warning: retention has deleted records after the start of the range on %s: hits there may be missing\n", strings.Join(res.Truncated, ", "))
	}
	return res, nil
}

func newCountsExportCmd() *cobra.Command {
	var (
		hf     historyFlags
		format string
		prefix string
		output string
	)
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Export past usage per key and site per minute (or --step), from the hits topics",
		Long: `export replays the hit records of a time range from the hits topic and its
MirrorMaker-2 copies (the hits topics keep at least two windows, longer with a configured
retention), finding the offsets by record timestamp, and prints per step, counter key,
window and site the hits admitted and the requests refused there. A hit belongs to the
step its bucket starts in. Malformed records are skipped and counted; a summary goes to
stderr. Formats: csv (start,key,window_ms,site,admitted,denied) and jsonl (one object per
row: start, ts, key, w, site, n, d). Parquet is not built in: convert the CSV.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := history.ParseFormat(format)
			if err != nil {
				return fmt.Errorf("--format: %w", err)
			}
			o, err := hf.options(func(k string) bool { return strings.HasPrefix(k, prefix) })
			if err != nil {
				return err
			}
			res, err := hf.replay(cmd.Context(), o, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return writeOutput(cmd.OutOrStdout(), output, func(w io.Writer) error { return history.Write(w, f, res.Rows) })
		},
	}
	hf.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&format, "format", string(history.CSV), "csv or jsonl")
	fl.StringVar(&prefix, "prefix", "", "only keys starting with this, e.g. the domain \"api|\"")
	fl.StringVarP(&output, "output", "o", "", "write to this file instead of stdout")
	return cmd
}

func newCountsPlotCmd() *cobra.Command {
	var (
		hf     historyFlags
		svg    string
		window time.Duration
		title  string
	)
	cmd := &cobra.Command{
		Use:   "plot KEY",
		Short: "Draw one key's past usage per site over time as an SVG, from the hits topics",
		Long: `plot replays the hits topics as export does, for one counter key, and draws per step
the hits admitted at each site, at all sites together, and the requests refused.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if svg == "" {
				return fmt.Errorf("--svg is required (a file, or - for stdout)")
			}
			key := args[0]
			o, err := hf.options(func(k string) bool { return k == key })
			if err != nil {
				return err
			}
			res, err := hf.replay(cmd.Context(), o, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			po := history.PlotOptions{Key: key, Window: window.Milliseconds(), From: o.From, To: o.To, Step: o.Step, Title: title}
			// Draw first, so that a failed plot leaves no file behind.
			var b bytes.Buffer
			if err := history.WritePlot(&b, res.Rows, po); err != nil {
				return err
			}
			if svg == "-" {
				svg = ""
			}
			return writeOutput(cmd.OutOrStdout(), svg, func(w io.Writer) error { _, err := b.WriteTo(w); return err })
		},
	}
	hf.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&svg, "svg", "", "write the SVG to this file (- for stdout)")
	fl.DurationVar(&window, "window", 0, "the key's window, when its hits count toward several")
	fl.StringVar(&title, "title", "", "title above the plot (default: the key)")
	return cmd
}

// writeOutput runs write on stdout when path is empty, else on the file at path.
func writeOutput(stdout io.Writer, path string, write func(io.Writer) error) error {
	if path == "" {
		return write(stdout)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
