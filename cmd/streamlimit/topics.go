package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/streamlimit/streamlimit/cmd/streamlimit/internal/countsview"
	"github.com/streamlimit/streamlimit/topicadmin"
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

// registerLayout registers the flags of the topics' layout, with topics.Config's defaults:
// what ensure creates, or, for describe (expected), what it expects. --partitions is the
// former name of --hits-partitions, kept hidden for old scripts.
func (t *topicFlags) registerLayout(cmd *cobra.Command, expected bool) {
	what, rf := "", "replication factor (-1: the broker's default)"
	if expected {
		what, rf = "expected ", "expected replication factor (-1: the broker's default, not checked)"
	}
	f := cmd.Flags()
	f.Int32Var(&t.cfg.HitsPartitions, "hits-partitions", topics.DefaultPartitions, what+"partitions of the hits topics (every data center's hits topic must have the same count)")
	f.Int32Var(&t.cfg.HitsPartitions, "partitions", topics.DefaultPartitions, "former name of --hits-partitions")
	_ = f.MarkHidden("partitions")
	f.Int32Var(&t.cfg.CountsPartitions, "counts-partitions", topics.DefaultPartitions, what+"partitions of the counts topic")
	f.Int16Var(&t.cfg.ReplicationFactor, "replication-factor", topics.DefaultReplicationFactor, rf)
	f.DurationVar(&t.cfg.HitsRetention, "hits-retention", topics.DefaultHitsRetention, what+"retention of the hits topics (at least twice --max-window)")
	f.DurationVar(&t.cfg.MaxWindow, "max-window", topics.DefaultMaxWindow, "longest window any rule uses")
}

func newTopicsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "topics",
		Short: "Create or verify streamlimit's Kafka topics",
	}
	cmd.AddCommand(newTopicsEnsureCmd(), newTopicsDescribeCmd())
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
reported with what it is and what it should be, and the command exits 1. It returns once
every topic is described with all its partitions led (topicadmin.ReadyTimeout at most), so
that the next command of a script can use them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := kf.client()
			if err != nil {
				return err
			}
			defer cl.Close()
			ctx := cmd.Context()
			res, err := topicadmin.Ensure(ctx, kadm.NewClient(cl), tf.cfg)
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
	tf.registerLayout(cmd, false)
	return cmd
}

func newTopicsDescribeCmd() *cobra.Command {
	var (
		kf     kafkaFlags
		tf     topicFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "describe",
		Short: "Show the hits and counts topics' layout and configs, and whether they match what ensure creates",
		Long: `describe shows, for the local hits topic, every MirrorMaker-2 copy of it ("<dc>.hits") and
the counts topic: partitions, replication factor, and the configs streamlimit sets
(cleanup.policy, retention.ms, segment.ms, …), each next to the value ensure would create it
with. Remote copies are expected to have the local hits topic's layout. It only reads; a
mismatch is reported, not fixed (the exit status stays 0: use ensure to fail on one).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := tf.cfg.Normalize()
			if err != nil {
				return err
			}
			cl, err := kf.client()
			if err != nil {
				return err
			}
			defer cl.Close()
			descs, err := describeTopics(cmd.Context(), kadm.NewClient(cl), cfg)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(descs)
			}
			printTopics(cmd.OutOrStdout(), descs)
			return nil
		},
	}
	kf.register(cmd)
	tf.register(cmd)
	addConfigFlag(cmd)
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	tf.registerLayout(cmd, true)
	return cmd
}

// topicDesc is one topic as describe reports it.
type topicDesc struct {
	Topic string `json:"topic"`
	// Role is "hits", "remote hits" or "counts".
	Role   string `json:"role"`
	Site   string `json:"site,omitempty"`
	Exists bool   `json:"exists"`
	// Match reports that every checked setting has the expected value.
	Match    bool           `json:"match"`
	Settings []topicSetting `json:"settings"`
	// Configs are all the topic's configs as the broker reports them.
	Configs map[string]string `json:"configs,omitempty"`
}

// topicSetting is one checked setting: what the topic has and what ensure creates.
type topicSetting struct {
	Name string `json:"name"`
	Have string `json:"have"`
	// Want is empty when the setting is not checked (replication at the broker's default).
	Want  string `json:"want,omitempty"`
	Match bool   `json:"match"`
}

func describeTopics(ctx context.Context, adm *kadm.Client, cfg topics.Config) ([]topicDesc, error) {
	all, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("topics describe: list topics: %w", err)
	}
	pat := regexp.MustCompile(topics.HitsPattern(cfg.HitsTopic))
	var descs []topicDesc
	descs = append(descs, topicDesc{Topic: cfg.HitsTopic, Role: "hits"})
	var remotes []string
	for name := range all {
		if name != cfg.HitsTopic && pat.MatchString(name) {
			remotes = append(remotes, name)
		}
	}
	slices.Sort(remotes)
	for _, r := range remotes {
		descs = append(descs, topicDesc{Topic: r, Role: "remote hits", Site: topics.SiteOfTopic(r, cfg.HitsTopic)})
	}
	descs = append(descs, topicDesc{Topic: cfg.CountsTopic, Role: "counts"})

	var names []string
	for _, d := range descs {
		if _, ok := all[d.Topic]; ok {
			names = append(names, d.Topic)
		}
	}
	var rcs kadm.ResourceConfigs
	if len(names) > 0 {
		if rcs, err = adm.DescribeTopicConfigs(ctx, names...); err != nil {
			return nil, fmt.Errorf("topics describe: describe configs: %w", err)
		}
	}
	for i := range descs {
		d := &descs[i]
		td, ok := all[d.Topic]
		if !ok {
			d.Settings = []topicSetting{{Name: "exists", Have: "no", Want: "yes"}}
			continue
		}
		if td.Err != nil {
			return nil, fmt.Errorf("topics describe: %s: %w", d.Topic, td.Err)
		}
		d.Exists = true
		rc, err := rcs.On(d.Topic, nil)
		if err == nil {
			err = rc.Err
		}
		if err != nil {
			return nil, fmt.Errorf("topics describe: configs of %s: %w", d.Topic, err)
		}
		d.Configs = make(map[string]string, len(rc.Configs))
		for _, c := range rc.Configs {
			if c.Value != nil {
				d.Configs[c.Key] = *c.Value
			}
		}
		wantParts, want := cfg.HitsPartitions, cfg.HitsConfigs()
		if d.Role == "counts" {
			wantParts, want = cfg.CountsPartitions, cfg.CountsConfigs()
		}
		add := func(name, have, want string) {
			d.Settings = append(d.Settings, topicSetting{Name: name, Have: have, Want: want, Match: want == "" || have == want})
		}
		add("partitions", fmt.Sprint(len(td.Partitions)), fmt.Sprint(wantParts))
		rf := ""
		if cfg.ReplicationFactor > 0 {
			rf = fmt.Sprint(cfg.ReplicationFactor)
		}
		add("replication", fmt.Sprint(td.Partitions.NumReplicas()), rf)
		keys := make([]string, 0, len(want))
		for k := range want {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			add(k, d.Configs[k], *want[k])
		}
	}
	for i := range descs {
		d := &descs[i]
		d.Match = d.Exists && !slices.ContainsFunc(d.Settings, func(s topicSetting) bool { return !s.Match })
	}
	return descs, nil
}

func printTopics(w io.Writer, descs []topicDesc) {
	t := countsview.Table{Header: []string{"TOPIC", "ROLE", "SETTING", "HAVE", "WANT", ""}}
	bad := 0
	for _, d := range descs {
		role := d.Role
		if d.Site != "" {
			role += " (" + d.Site + ")"
		}
		for _, s := range d.Settings {
			want, mark := s.Want, "ok"
			if want == "" {
				want, mark = "(broker default)", ""
			}
			if !s.Match {
				mark = "MISMATCH"
				bad++
			}
			t.Add(d.Topic, role, s.Name, s.Have, want, mark)
		}
	}
	_, _ = t.WriteTo(w)
	if bad == 0 {
		fmt.Fprintf(w, "all %d topics match what ensure creates\n", len(descs))
		return
	}
	var which []string
	for _, d := range descs {
		if !d.Match {
			which = append(which, d.Topic)
		}
	}
	fmt.Fprintf(w, "%s differ from what ensure creates, in %s\n", plural(bad, "setting"), strings.Join(which, ", "))
}
