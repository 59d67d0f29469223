package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/cmd/streamlimit/internal/demo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/serve/httplimit"
	"github.com/streamlimit/streamlimit/serve/rlqs"
	"github.com/streamlimit/streamlimit/serve/server"
	"github.com/streamlimit/streamlimit/topicadmin"
	"github.com/streamlimit/streamlimit/topics"
)

// devCompactEvery is how often the embedded broker compacts the counts topic in dev mode
// (kfake's log.cleaner.backoff.ms; its default is an hour).
const devCompactEvery = 10 * time.Second

// devFlags are the settings of `streamlimit dev`.
type devFlags struct {
	port                int
	dataDir             string
	rulesPath           string
	site                string
	httpAddr, grpcAddr  string
	rlqsAddr            string
	rlqs                rlqs.Options
	httpConfig          string
	maxMemory           byteSize
	countsFormat        string
	logFormat, logLevel string
}

// devHTTPConfig is how dev's /v1/auth (nginx auth_request) turns a request into a
// descriptor of the demo's rules when --http-config is not given: the client is named by
// its X-Client-Id header, as in deploy/http.yaml.
func devHTTPConfig() httplimit.Config {
	return httplimit.Config{Domain: "demo", Descriptors: []httplimit.Descriptor{{Entries: []httplimit.Source{
		{Type: httplimit.SourceHeader, Name: "X-Client-Id", Key: "client"},
	}}}}
}

func newDevCmd() *cobra.Command {
	var df devFlags
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run an embedded Kafka, an aggregator and an enforcer for local development",
		Long: `dev runs, in this process, an embedded Kafka-protocol broker (franz-go's kfake) on a
fixed port, creates the hits and counts topics, and runs an aggregator and an enforcer
server, so that any Kafka client (kcat, a service under development) can publish hits and
read counts, and any HTTP or Envoy client can ask for decisions. State is in memory unless
--data-dir is given, in which case the broker persists it there and reloads it on restart.
The broker listens on 127.0.0.1 only. Stop it with Ctrl-C.`,
		Example: `  streamlimit dev
  streamlimit dev --port 19092 --data-dir ./.streamlimit-dev --rules ./rules.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return df.run(cmd) },
	}
	f := cmd.Flags()
	f.IntVar(&df.port, "port", 9092, "port of the embedded Kafka broker on 127.0.0.1 (0: any free port)")
	f.StringVar(&df.dataDir, "data-dir", "", "directory where the broker persists its state across restarts (default: in memory)")
	// No backquotes in usages: pflag would take the quoted text for the value's name.
	f.StringVar(&df.rulesPath, "rules", "", `rules file or directory for the enforcer (default: the demo's rules, as "streamlimit demo --print-rules" prints them)`)
	f.StringVar(&df.httpConfig, "http-config", "", `YAML file saying how /v1/auth requests become descriptors, as for the enforcer (default: domain demo, the client from the X-Client-Id header)`)
	f.StringVar(&df.site, "site", "dev", "the enforcer's site")
	f.StringVar(&df.countsFormat, "counts-format", aggregator.CountsBinary, "how the aggregator writes count records: binary, or json for readers without a decoder (kcat, ksqlDB, Kafka Connect)")
	f.StringVar(&df.httpAddr, "http-listen", server.DefaultHTTPAddr, "address of the enforcer's check API and admin endpoints")
	f.StringVar(&df.grpcAddr, "grpc-listen", server.DefaultGRPCAddr, `address of the enforcer's Envoy rate-limit gRPC service ("off" to disable)`)
	registerRLQSFlags(f, &df.rlqsAddr, &df.rlqs)
	df.maxMemory = server.DefaultMaxMemory
	f.Var(&df.maxMemory, "max-memory", "the enforcer's "+memoryUsage)
	f.StringVar(&df.logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&df.logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	return cmd
}

func (df *devFlags) run(cmd *cobra.Command) error {
	ctx := cmd.Context()
	out := cmd.OutOrStdout()
	log, err := newLogger(df.logFormat, df.logLevel)
	if err != nil {
		return err
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(df.port),
		kfake.BrokerConfigs(map[string]string{"log.cleaner.backoff.ms": fmt.Sprint(devCompactEvery.Milliseconds())}),
	}
	if df.dataDir != "" {
		opts = append(opts, kfake.DataDir(df.dataDir))
	}
	cluster, err := kfake.NewCluster(opts...)
	if err != nil {
		return fmt.Errorf("embedded kafka on port %d: %w", df.port, err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	// Production's layout, as `topics ensure` makes it, so that `topics describe` finds
	// dev's topics as it expects; the broker's frequent cleaner passes (devCompactEvery)
	// compact the counts topic once its one-minute segments close.
	tcfg, err := topics.Config{}.Normalize()
	if err != nil {
		return err
	}
	res, err := ensureDevTopics(ctx, brokers, tcfg)
	if err != nil {
		return err
	}

	rulesPath := df.rulesPath
	if rulesPath == "" {
		dir, err := os.MkdirTemp("", "streamlimit-dev-")
		if err != nil {
			return fmt.Errorf("rules: %w", err)
		}
		defer os.RemoveAll(dir)
		rulesPath = filepath.Join(dir, "demo.yaml")
		if err := os.WriteFile(rulesPath, []byte(demo.RulesYAML), 0o600); err != nil {
			return fmt.Errorf("rules: %w", err)
		}
	}

	httpCfg := devHTTPConfig()
	if df.httpConfig != "" {
		if httpCfg, err = loadHTTPConfig(df.httpConfig); err != nil {
			return err
		}
	}
	// One registry, served on the enforcer's /metrics: the aggregator's metrics too.
	reg := newRegistry()
	agg, err := aggregator.New(aggregator.Config{Brokers: brokers, CountsFormat: df.countsFormat, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	srv, err := server.New(server.Config{
		Config: streamlimit.Config{
			Site:      df.site,
			Rules:     rulesPath,
			Brokers:   brokers,
			Logger:    log,
			MaxMemory: int64(df.maxMemory),
		},
		HTTPAddr: df.httpAddr,
		GRPCAddr: df.grpcAddr,
		HTTP:     httpCfg,
		Registry: reg,
		RLQSAddr: df.rlqsAddr,
		RLQS:     df.rlqs,
	})
	if err != nil {
		return err
	}

	broker := brokers[0]
	data := "in memory (use --data-dir to keep state across restarts)"
	if df.dataDir != "" {
		data = df.dataDir
	}
	created := "existing"
	if len(res.Created) > 0 {
		created = "created"
	}
	fmt.Fprintf(out, `streamlimit dev: embedded Kafka, aggregator and enforcer (Ctrl-C to stop)

  kafka       %s
  topics      %s (%d partitions), %s (%d partitions, compacted): %s
  data        %s
  aggregator  group streamlimit-aggregator, counting %s into %s
  enforcer    site %s: http %s (POST /v1/check, POST /json, /v1/auth, /metrics with the aggregator's, /readyz), grpc %s, rlqs %s
  console     http://%s%s/ (live: sites, top keys, decisions per second, recent 429s, rules)
  rules       %s

`,
		broker, tcfg.HitsTopic, tcfg.HitsPartitions, tcfg.CountsTopic, tcfg.CountsPartitions, created, data,
		tcfg.HitsTopic, tcfg.CountsTopic, df.site, srv.HTTPAddr(), orNone(srv.GRPCAddr()), orNone(srv.RLQSAddr()), srv.HTTPAddr(), server.ConsolePath, rulesPath)
	if ex, ok := devExample(srv.Engine().Config().Rules()); ok {
		fmt.Fprintf(out, `Publish a hit as JSON with kcat (murmur2_random places keys as the Go producer does):
  echo '%s@{"key":"%s","site":"eu","ts":'$(date +%%s%%3N)',"w":%d,"n":1}' | kcat -P -b %s -t %s -K@ -X topic.partitioner=murmur2_random
Read its count:
  streamlimit counts get '%s' --brokers %s
Ask the enforcer:
  curl -s %s/v1/check -d '%s'
`, ex.key, ex.key, ex.window.Milliseconds(), broker, tcfg.HitsTopic, ex.key, broker, srv.HTTPAddr(), ex.check)
	} else {
		fmt.Fprintln(out, "The rules limit nothing yet: no request to try.")
	}
	if df.rulesPath == "" {
		// The demo's rules come with an HTTP descriptor reading the client from a header.
		fmt.Fprintf(out, "  curl -i -H 'X-Client-Id: alice' %s/v1/auth\n", srv.HTTPAddr())
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return agg.Run(gctx) })
	g.Go(func() error { return srv.Run(gctx) })
	return g.Wait()
}

func ensureDevTopics(ctx context.Context, brokers []string, cfg topics.Config) (topicadmin.EnsureResult, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return topicadmin.EnsureResult{}, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	res, err := topicadmin.Ensure(ctx, kadm.NewClient(cl), cfg)
	if err != nil {
		return res, fmt.Errorf("topics: %w", err)
	}
	return res, nil
}

// devExampleValue stands for a descriptor value that a rule leaves open (any value), or
// for the runs of characters a wildcard matches.
const devExampleValue = "alice"

// example is a request that one limit of the rules in force decides, as dev prints it.
type example struct {
	key    string        // the limit's counter key for the request
	window time.Duration // the limit's window
	check  string        // the request as a body of POST /v1/check
}

// devExample finds, in the rules in force, the first limit of a rule that limits (a
// global one if any: those are what dev's pipeline counts), and a request it decides:
// each level's value, devExampleValue for an open one and in place of each wildcard's
// '*'. It reports false when no rule limits anything.
func devExample(cfg *rules.Config) (example, bool) {
	var pick *rules.Rule
	pickAt := 0
	for _, r := range cfg.Rules() {
		if r.Unlimited || len(r.Limits) == 0 {
			continue
		}
		if pick == nil {
			pick = r // the first rule that limits, unless a global limit comes
		}
		if i := slices.IndexFunc(r.Limits, func(l rules.Limit) bool { return l.Scope == rules.Global }); i >= 0 {
			pick, pickAt = r, i
			break
		}
	}
	if pick == nil {
		return example{}, false
	}
	entries := make([]rules.Entry, len(pick.Levels))
	type jsonEntry struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	body := struct {
		Domain      string `json:"domain"`
		Descriptors []struct {
			Entries []jsonEntry `json:"entries"`
		} `json:"descriptors"`
	}{Domain: pick.Domain}
	body.Descriptors = make([]struct {
		Entries []jsonEntry `json:"entries"`
	}, 1)
	for i, lv := range pick.Levels {
		v := lv.Value
		switch {
		case v == "":
			v = devExampleValue
		case lv.Wildcard:
			v = strings.ReplaceAll(v, "*", devExampleValue)
		}
		entries[i] = rules.Entry{Key: lv.Key, Value: v}
		body.Descriptors[0].Entries = append(body.Descriptors[0].Entries, jsonEntry{lv.Key, v})
	}
	check, err := json.Marshal(body)
	if err != nil {
		return example{}, false
	}
	return example{key: string(pick.AppendKey(nil, entries, pickAt)), window: pick.Limits[pickAt].Window, check: string(check)}, true
}
