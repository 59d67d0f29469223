package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/streamlimit/streamlimit/topics"
)

// topicFlags are the topic names and layout, shared by every subcommand.
type topicFlags struct {
	cfg topics.Config
}

func (t *topicFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&t.cfg.HitsTopic, "hits-topic", topics.DefaultHitsTopic, "local hits topic")
	f.StringVar(&t.cfg.CountsTopic, "counts-topic", topics.DefaultCountsTopic, "compacted counts topic")
}

func newTopicsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "topics",
		Short: "Create or verify streamlimit's Kafka topics",
	}
	cmd.AddCommand(newTopicsEnsureCmd())
	return cmd
}

func newTopicsEnsureCmd() *cobra.Command {
	var (
		kf kafkaFlags
		tf topicFlags
	)
	cmd := &cobra.Command{
		Use:   "ensure",
		Short: "Create missing topics; verify existing ones (never alters them)",
		Long: `ensure creates the hits and counts topics when they do not exist, with the partition
counts and configs streamlimit needs (counts compacted, hits retained at least twice the
longest window). Existing topics are verified: a wrong partition count or cleanup.policy is
reported with what it is and what it should be, and the command exits 1.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := kf.client()
			if err != nil {
				return err
			}
			defer cl.Close()
			ctx := cmd.Context()
			res, err := topics.EnsureTopics(ctx, kadm.NewClient(cl), tf.cfg)
			out := cmd.OutOrStdout()
			for _, t := range res.Created {
				fmt.Fprintf(out, "created  %s\n", t)
			}
			for _, t := range res.Verified {
				fmt.Fprintf(out, "verified %s\n", t)
			}
			return err
		},
	}
	kf.register(cmd)
	tf.register(cmd)
	addConfigFlag(cmd)
	f := cmd.Flags()
	f.Int32Var(&tf.cfg.HitsPartitions, "partitions", 12, "partitions of the hits topic (all data centers' hits topics must have the same count)")
	f.Int32Var(&tf.cfg.CountsPartitions, "counts-partitions", 12, "partitions of the counts topic")
	f.Int16Var(&tf.cfg.ReplicationFactor, "replication-factor", -1, "replication factor of created topics (-1: the broker's default)")
	f.DurationVar(&tf.cfg.HitsRetention, "hits-retention", 24*time.Hour, "retention of the hits topic (at least twice --max-window)")
	f.DurationVar(&tf.cfg.MaxWindow, "max-window", time.Hour, "longest window any rule uses")
	return cmd
}
