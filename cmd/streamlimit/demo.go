package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/streamlimit/streamlimit/cmd/streamlimit/internal/demo"
)

func newDemoCmd() *cobra.Command { return newDemoCmdOn(nil) }

// newDemoCmdOn is newDemoCmd with the embedded broker's connections carried over network
// when it is not nil, in memory (demo.Options.Network): a test runs the command in a
// testing/synctest bubble, on virtual time.
func newDemoCmdOn(network *kfake.VirtualNetwork) *cobra.Command {
	var (
		opts             demo.Options
		plain, showRules bool
		logLevel, logFmt string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Watch a global limit hold across three sites, on an embedded Kafka (zero setup)",
		Long: `demo runs the whole pipeline in this process: an embedded Kafka-protocol broker
(franz-go's kfake, compacting the counts topic), the hits and counts topics, one aggregator,
and one enforcer per site (eu, us, ap), each with its own snapshot of the counts topic, its
own hit producer and its own exact site counter. Synthetic clients call the enforcers:
light clients on their home site, an abusive client sending 5× its limit spread evenly over
all sites (each site alone sees less than the limit), and a burst at one site.

On a terminal a live table shows each site's decisions, the abusive client's admissions in
the last window against its limit, and the pipeline lag; otherwise a plain line is printed
every 2 seconds. At the end a summary gives the exact busiest and mean window of the abusive
client and says whether the global limit held. The exit status is 1 when the verdict says
the limit did not hold (or could not be measured although the run was not interrupted), so
that the demo serves as a smoke test; it is also non-zero when the embedded pipeline cannot
run, and 0 after an interrupt.`,
		Example: `  streamlimit demo
  streamlimit demo --duration 1m --sites 4
  streamlimit demo --print-rules   # print the rules the demo enforces`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if showRules {
				_, err := io.WriteString(out, demo.RulesYAML)
				return err
			}
			log, err := newLogger(logFmt, logLevel)
			if err != nil {
				return err
			}
			opts.Logger = log
			opts.Network = network
			opts.Live = !plain && isTerminal(out)
			sum, err := demo.Run(cmd.Context(), opts, out)
			if errors.Is(err, context.Canceled) && cmd.Context().Err() != nil {
				fmt.Fprintln(out, "interrupted before the traffic started")
				return nil
			}
			if err != nil {
				return err
			}
			return verdictError(sum)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&opts.Duration, "duration", demo.DefaultDuration, "how long the synthetic traffic runs (more than the limit's 5s window, at most 1h)")
	f.Uint64Var(&opts.Seed, "seed", 1, "seed of the light clients' jitter")
	f.IntVar(&opts.Sites, "sites", demo.DefaultSites, fmt.Sprintf("number of sites, 1..%d (eu, us, ap, sa, af, oc)", demo.MaxSites))
	f.BoolVar(&plain, "plain", false, "print plain status lines even on a terminal")
	f.BoolVar(&showRules, "print-rules", false, "print the demo's rules file and exit")
	f.StringVar(&logLevel, "log-level", "error", "level of the components' logs on stderr: debug, info, warn or error")
	f.StringVar(&logFmt, "log-format", "text", "log format: text or json")
	return cmd
}

// errVerdict is returned by the demo command when its verdict is a failure: the demo is a
// claim about the product, so a claim that turned out false must fail a script that runs it.
var errVerdict = errors.New("demo: verdict failed")

// verdictError returns nil when the summary's verdict is that the global limit held, or when
// the run was interrupted (nothing is claimed then), and an error wrapping errVerdict that
// repeats the verdict otherwise.
func verdictError(sum demo.Summary) error {
	if sum.Held || sum.Interrupted {
		return nil
	}
	return fmt.Errorf("%w: %s", errVerdict, sum.Verdict)
}

// isTerminal reports whether w is a character device (a terminal), where the demo may
// redraw its table with ANSI escape sequences.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
