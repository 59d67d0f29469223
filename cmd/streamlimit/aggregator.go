package main

import (
	"fmt"
	"net"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

func newAggregatorCmd() *cobra.Command {
	var (
		kf                             kafkaFlags
		cfg                            aggregator.Config
		hits, pattern, admin, siteKeys string
		topicsList                     []string
		logFormat, logLevel            string
	)
	cmd := &cobra.Command{
		Use:   "aggregator",
		Short: "Count hits of all data centers into the compacted counts topic",
		Long: `aggregator is a member of a Kafka consumer group over the local hits topic and its
MirrorMaker-2 copies (<dc>.hits). It keeps sliding-window counts per counter key and site
and publishes absolute counts, with heartbeats, to the compacted counts topic. Aggregators of
one data center share the work through their group, by partition number of the hits
topics; run two or more with stable --instance-id values (docs/operations.md). On SIGTERM it
publishes what is due, leaves the group at once and exits.

Once --admin-listen is bound it prints "aggregator: admin ADDR" to standard output: with port
0 (127.0.0.1:0) the system chooses a free port and ADDR says which.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logFormat, logLevel)
			if err != nil {
				return err
			}
			sec, err := kf.security()
			if err != nil {
				return err
			}
			cfg.Brokers, cfg.KafkaOpts, cfg.Logger = kf.brokers, sec, log
			if len(topicsList) > 0 {
				cfg.Topics = topicsList
			} else if pattern != "" {
				cfg.TopicPattern = pattern
			} else {
				cfg.TopicPattern = topics.HitsPattern(hits)
			}
			if len(topicsList) == 0 || cmd.Flags().Changed("hits-topic") {
				cfg.LocalTopic = hits
			}
			if siteKeys != "" {
				if cfg.SiteKeys, err = topics.LoadSiteKeys(siteKeys); err != nil {
					return fmt.Errorf("--site-keys: %w", err)
				}
				log.Info("site authentication on: records not signed by the site they name are skipped", "sites", len(cfg.SiteKeys.Sites()))
			}
			reg := newRegistry()
			cfg.Registerer = reg
			agg, err := aggregator.New(cfg)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", admin)
			if err != nil {
				return fmt.Errorf("admin listener: %w", err)
			}
			log.Info("aggregator starting", "brokers", kf.brokers, "admin", ln.Addr().String())
			// On standard output whatever the log level, for whoever started the process
			// with port 0 and needs the port.
			fmt.Fprintf(cmd.OutOrStdout(), "aggregator: admin %s\n", ln.Addr())
			g, ctx := errgroup.WithContext(cmd.Context())
			g.Go(func() error { return agg.Run(ctx) })
			g.Go(func() error {
				return serveHTTP(ctx, ln, adminMux(reg, func() (bool, string) {
					if agg.Ready() {
						return true, "assigned partitions replayed"
					}
					return false, "replaying assigned partitions or waiting for an assignment"
				}), 5*time.Second, log)
			})
			return g.Wait()
		},
	}
	kf.register(cmd)
	f := cmd.Flags()
	f.StringVar(&hits, "hits-topic", topics.DefaultHitsTopic, "local hits topic; its MirrorMaker-2 copies <dc>.<hits-topic> are consumed too")
	f.StringVar(&pattern, "topic-pattern", "", "regular expression of hits topics to consume (default: the hits topic and its <dc>. copies)")
	f.StringSliceVar(&topicsList, "topics", nil, "explicit list of hits topics (overrides the pattern)")
	f.StringVar(&cfg.CountsTopic, "counts-topic", topics.DefaultCountsTopic, "compacted counts topic")
	f.StringVar(&cfg.Group, "group", aggregator.DefaultGroup, "consumer group")
	f.DurationVar(&cfg.SessionTimeout, "session-timeout", aggregator.DefaultSessionTimeout, "how long the group waits for a member that stopped without leaving before its slots move, and how long a restart under the same --instance-id may take without a rebalance (within the brokers' group.min/max.session.timeout.ms)")
	f.DurationVar(&cfg.MaxLocalHold, "max-local-hold", aggregator.DefaultMaxLocalHold, "most the local hits topic's records are held back to match the replicated topics' lag (negative: never)")
	f.StringVar(&cfg.CountsFormat, "counts-format", aggregator.CountsBinary, "how count records are written: binary, or json for readers without a decoder (kcat, ksqlDB, Kafka Connect)")
	f.StringVar(&cfg.DeadLetterTopic, "dead-letter-topic", "", "copy skipped hit records here (default: none)")
	f.IntVar(&cfg.SubBuckets, "sub-buckets", window.DefaultSubBuckets, "sub-window buckets per window (enforcers must use the same)")
	f.DurationVar(&cfg.EmitInterval, "emit-interval", aggregator.DefaultEmitInterval, "least time between two counts of one key")
	f.IntVar(&cfg.MaxEmitPerSecond, "max-emit-per-second", aggregator.DefaultMaxEmitPerSecond, "cap on count records per second")
	f.DurationVar(&cfg.Lateness, "lateness", aggregator.DefaultLateness, "how late a hit may arrive and still count")
	f.DurationVar(&cfg.MaxClockSkew, "max-clock-skew", aggregator.DefaultMaxClockSkew, "how far in the future a hit's time may be")
	f.IntVar(&cfg.MaxKeys, "max-keys", aggregator.DefaultMaxKeys, "bound on counters held (a new counter beyond it takes the place of the least recently hit)")
	f.DurationVar(&cfg.DefaultWindow, "default-window", aggregator.DefaultDefaultWindow, "window of JSON hits without \"w\"")
	f.DurationVar(&cfg.MaxWindow, "max-window", topics.DefaultMaxWindow, "longest window accepted; recovery replays this much")
	f.DurationVar(&cfg.MetadataMaxAge, "metadata-max-age", aggregator.DefaultMetadataMaxAge, "how soon a new <dc>.hits topic matching the pattern is consumed")
	f.StringVar(&siteKeys, "site-keys", "", "file of every site's key (a site name and a hex key per line; docs/hardening.md): a hits record counts only when signed by the site it names; others are skipped and counted (default: records are taken at their word)")
	f.StringVar(&cfg.InstanceID, "instance-id", "", "stable, unique name of this aggregator: in heartbeats and on every record it writes to the counts topic (which enforcers started with --aggregator-instances check), and its static group membership (a restart under it within --session-timeout keeps its slots without a rebalance); default host-pid-random, dynamic membership")
	f.StringVar(&admin, "admin-listen", "127.0.0.1:9090", "address of /metrics, /healthz and /readyz")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	addConfigFlag(cmd)
	return cmd
}
