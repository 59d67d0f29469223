package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitestore"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/safefile"
	"github.com/streamlimit/streamlimit/serve/httplimit"
	"github.com/streamlimit/streamlimit/serve/rlqs"
	"github.com/streamlimit/streamlimit/serve/rls"
	"github.com/streamlimit/streamlimit/serve/server"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// enforcerFlags are the settings of `streamlimit enforcer`.
type enforcerFlags struct {
	kf                  kafkaFlags
	redisTLS            tlsFlags
	cfg                 server.Config
	noKafka             bool
	upstream            string
	httpConfig          string
	httpDomain          string
	trustedProxies      []string
	trustedProxiesSet   bool // --trusted-proxies given (flag, environment or --config)
	authTokenFile       string
	siteKeys            string
	limitOverrides      string
	compat              string
	unknownDomain       string
	maxMemory           byteSize
	rulesMaxBytes       byteSize
	grpcReflection      bool // server.Config.NoGRPCReflection, inverted: on unless told
	logFormat, logLevel string
}

func newEnforcerCmd() *cobra.Command { return newEnforcerCmdOn(new(enforcerFlags)) }

// newEnforcerCmdOn is newEnforcerCmd with its flags bound to ef (tests look at which
// setting each flag writes).
func newEnforcerCmdOn(ef *enforcerFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "enforcer",
		Short: "Serve rate-limit decisions: HTTP check API, nginx auth_request, Envoy gRPC, reverse proxy",
		Long: `enforcer decides requests locally, in well under a microsecond, against the rules file
(hot-reloaded): local limits in process, site limits in the site's Redis, global limits from
the counts topic's snapshot plus this site's exact count. Admitted hits of global limits are
published to the hits topic. It serves:

  --http-listen   POST /v1/check, /json, /v1/auth (nginx auth_request), /metrics, /healthz,
                  /readyz, and /openapi.yaml (the OpenAPI document of this API)
  --grpc-listen   envoy.service.ratelimit.v3.RateLimitService (Envoy's rate-limit filter)
  --rlqs-addr     when given: envoy.service.rate_limit_quota.v3.RateLimitQuotaService (Envoy's
                  rate_limit_quota filter, which decides locally on assigned quotas)
  --proxy-listen  with --upstream: a reverse proxy that answers 429 before the upstream

Every listener binds loopback by default. Callers can be made to prove who they are with
--tls-client-ca (mutual TLS) or --auth-token-file (bearer tokens); slow and idle clients are
cut off by the timeouts, and connections and gRPC streams are bounded (--max-conns,
--max-conns-per-addr, --grpc-max-streams).

Once its listeners are bound the enforcer prints one line to standard output naming each
one's address ("enforcer site eu: http 127.0.0.1:8081, grpc 127.0.0.1:8082"): with port 0
(127.0.0.1:0) the system chooses a free port and that line says which.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ef.trustedProxiesSet = cmd.Flags().Changed("trusted-proxies")
			if cmd.Flags().Changed("redis-key-prefix") {
				// envoyproxy/ratelimit's CACHE_KEY_PREFIX, set: its keys start with it too;
				// unset, they start with nothing, as there.
				ef.cfg.EnvoyKeyPrefix = ef.cfg.Redis.KeyPrefix
			}
			cfg, err := ef.serverConfig()
			if err != nil {
				return err
			}
			tuneGC(cmd.Context())
			limitMemory(cfg.MaxMemory)
			if len(cfg.Redis.Addrs) > 0 {
				// go-redis keeps one logger per process; this command is the process.
				redis.SetLogger(sitestore.GoRedisLogger{Logger: cfg.Logger})
			}
			srv, err := server.New(cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "enforcer site %s: http %s, grpc %s", cfg.Site, srv.HTTPAddr(), orNone(srv.GRPCAddr()))
			if a := srv.RLQSAddr(); a != "" {
				fmt.Fprintf(cmd.OutOrStdout(), ", rlqs %s", a)
			}
			if a := srv.ProxyAddr(); a != "" {
				fmt.Fprintf(cmd.OutOrStdout(), ", proxy %s → %s", a, cfg.Upstream)
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return srv.Run(cmd.Context())
		},
	}
	ef.kf.register(cmd)
	f := cmd.Flags()
	c := &ef.cfg
	f.StringVar(&c.Site, "site", "", "this enforcer's site: the process, or the data center sharing --redis-addr (required)")
	f.StringVar(&c.Rules, "rules", "", "rules file or directory (required)")
	f.DurationVar(&c.ReloadInterval, "rules-reload-interval", rules.DefaultReloadInterval, "how often the rules are checked for changes")
	f.DurationVar(&c.ReloadSettle, "rules-reload-settle", rules.DefaultReloadSettle, "how long a changed rules file must stay unchanged (content, size, modification time) before it is loaded, so that one rewritten in place is not loaded half-written")
	ef.rulesMaxBytes = rules.DefaultMaxFileBytes
	f.Var(&ef.rulesMaxBytes, "rules-max-bytes", rulesMaxBytesUsage)
	f.BoolVar(&ef.noKafka, "no-kafka", false, "run without Kafka: global limits are decided on --default-share of the limit")
	f.StringVar(&c.HitsTopic, "hits-topic", topics.DefaultHitsTopic, "topic this site's hits are published to")
	f.StringVar(&c.CountsTopic, "counts-topic", topics.DefaultCountsTopic, "compacted counts topic to follow")
	f.StringSliceVar(&c.Aggregators, "aggregator-instances", nil, "instance IDs (the aggregators' --instance-id) whose records of the counts topic are believed; records of any other writer are skipped (default: every record)")
	f.StringVar(&ef.siteKeys, "site-keys", "", "file of site keys (a site name and a hex key per line; docs/hardening.md): every record published to the hits topic is signed with --site's key, which aggregators given the keys require (default: unsigned)")
	f.DurationVar(&c.MaxStaleness, "max-staleness", snapshot.DefaultMaxStaleness, "age of the aggregator's heartbeats past which global limits use local shares")
	f.Float64Var(&c.DefaultShare, "default-share", 0, "this site's share of a global limit for keys new to the counts (0: 1/the number of sites that may spend them: live, or cut off from here, and shown serving by the counts once this site is)")
	f.Float64Var(&c.MinShare, "min-share", enforcer.Defaults().MinShare, "smallest share of a hot key's room the sites of one data center hold together, so that one the counts do not show yet (a client just arrived there) is not shut out for the pipeline's lag")
	f.DurationVar(&c.SiteStaleAfter, "site-stale-after", enforcer.Defaults().SiteStaleAfter, "how long a site may go unheard before it is taken as silent and reserved its share of the keys it served")
	f.DurationVar(&c.CrashHold, "crash-hold", enforcer.Defaults().CrashHold, "how long a site silent while the rest of its data center speaks (a crash) keeps its reservation, fading (negative: none)")
	f.DurationVar(&c.ReserveMargin, "reserve-margin", enforcer.Defaults().ReserveMargin, "added to the pipeline lag over which the other sites' recent rate of a key is kept back from the room this site may spend (negative: none)")
	f.DurationVar(&c.ServingSpan, "serving-span", enforcer.Defaults().ServingSpan, "span over which the other data centers' recent rates of a key tell which still serve it, each kept at least this site's rate (negative: every one that served it in the window)")
	f.IntVar(&c.SubBuckets, "sub-buckets", window.DefaultSubBuckets, "sub-window buckets per window (must equal the aggregator's)")
	f.IntVar(&c.MaxKeys, "max-keys", enforcer.Defaults().MaxKeys, "bound on keys held per structure (local counters, site counts, snapshot, key cache); idle keys go first")
	ef.maxMemory = server.DefaultMaxMemory
	f.Var(&ef.maxMemory, "max-memory", memoryUsage)
	f.StringSliceVar(&c.Redis.Addrs, "redis-addr", nil, "the site's Redis (several: Cluster); default none: site counts in process")
	f.StringVar(&c.Redis.MasterName, "redis-sentinel-master", "", "name of the master the Redis Sentinels at --redis-addr watch; default none: --redis-addr is Redis itself")
	f.StringVar(&c.Redis.Username, "redis-username", "", "Redis ACL user")
	f.StringVar(&c.Redis.Password, "redis-password", "", "Redis password (prefer env STREAMLIMIT_REDIS_PASSWORD)")
	ef.redisTLS.register(cmd, "redis")
	f.IntVar(&c.SiteEnforcers, "site-enforcers", 1, "enforcers sharing --redis-addr; while Redis is down each keeps to 1/N of the site's limits")
	f.DurationVar(&c.Redis.Timeout, "redis-timeout", sitestore.DefaultTimeout, "bound on each Redis call (a hung Redis, not a latency target); past it, decide in process")
	f.StringVar(&c.Redis.KeyPrefix, "redis-key-prefix", sitestore.DefaultKeyPrefix, "start of every Redis key of this site's counters (no '{' or '}')")
	f.StringVar(&c.HTTPAddr, "http-listen", server.DefaultHTTPAddr, "address of the check API, auth endpoint and admin endpoints")
	f.StringVar(&c.GRPCAddr, "grpc-listen", server.DefaultGRPCAddr, `address of the Envoy rate-limit gRPC service ("off" to disable)`)
	f.BoolVar(&ef.grpcReflection, "grpc-reflection", true, "serve gRPC server reflection on the gRPC listeners, for grpcurl and the like (--grpc-reflection=false: off)")
	registerRLQSFlags(f, &c.RLQSAddr, &c.RLQS)
	f.StringVar(&ef.limitOverrides, "limit-overrides", rls.HonourOverrides.String(),
		"what the gRPC service and /json do with a descriptor's own limit (Envoy's override): honour (a caller can raise its own quota) or ignore (the rules decide)")
	f.StringVar(&ef.compat, "compat", rules.DefaultCompat.String(),
		"whose answers a domain gets when its rules file does not say (compat:): none (streamlimit's) or envoy (envoyproxy/ratelimit's, for its files and clients; docs/envoy-compat.md)")
	f.StringVar(&ef.unknownDomain, "unknown-domain", "allow",
		"what a request of a domain no rules file configures gets: allow (no limit, as envoyproxy/ratelimit) or deny; either way counted and logged")
	f.BoolVar(&c.Load.MergeDomains, "merge-domains", false, "let several rules files configure one domain, their descriptors put together (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG)")
	e := &c.Envoy
	f.BoolVar(&e.StopIncrementWhenOverLimit, "envoy-stop-increment-when-over-limit", false,
		"compat: envoy: when a request takes one of its limits over, only the limits it takes over count it (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT)")
	f.BoolVar(&e.ResponseHeaders, "envoy-response-headers", false,
		"compat: envoy: send the limit, remaining and reset of the descriptor closest to its limit in response_headers_to_add (LIMIT_RESPONSE_HEADERS_ENABLED)")
	f.StringVar(&e.LimitHeader, "envoy-limit-header", rls.DefaultLimitHeader, "name of the limit field of --envoy-response-headers (LIMIT_LIMIT_HEADER)")
	f.StringVar(&e.RemainingHeader, "envoy-remaining-header", rls.DefaultRemainingHeader, "name of the remaining field of --envoy-response-headers (LIMIT_REMAINING_HEADER)")
	f.StringVar(&e.ResetHeader, "envoy-reset-header", rls.DefaultResetHeader, "name of the reset field of --envoy-response-headers (LIMIT_RESET_HEADER)")
	f.BoolVar(&e.QuotaMode, "envoy-quota-mode", false, "compat: envoy: every rule in quota_mode, admitting over its limit and saying so in the dynamic metadata (QUOTA_MODE)")
	f.BoolVar(&e.ShadowMode, "envoy-shadow-mode", false, "compat: envoy: answer OK overall whatever the descriptors say (SHADOW_MODE)")
	f.BoolVar(&e.DynamicMetadata, "envoy-dynamic-metadata", false, "compat: envoy: describe the request and its quota-mode violations in the response's dynamic_metadata (RESPONSE_DYNAMIC_METADATA)")
	f.StringVar(&ef.upstream, "upstream", "", "URL of a service to reverse-proxy with rate limiting")
	f.StringVar(&c.ProxyAddr, "proxy-listen", server.DefaultProxyAddr, "address of the reverse proxy (with --upstream); \":8080\" to serve every interface")
	f.DurationVar(&c.ProxyMaxDelay, "proxy-max-delay", 0, "with --upstream: hold a request that its limits will admit within this long until they do, instead of answering 429")
	f.StringVar(&ef.httpConfig, "http-config", "", "YAML file saying how HTTP requests become descriptors (domain, descriptors, trusted_proxies, ipv6_prefix)")
	f.StringVar(&ef.httpDomain, "http-domain", "http", "rules domain for proxied and /v1/auth requests when --http-config is not given (descriptor: remote_address)")
	// Loopback by default, so that an nginx on the same host (the auth_request setup of
	// docs/api.md) is believed and nobody else is.
	f.StringSliceVar(&ef.trustedProxies, "trusted-proxies", []string{"127.0.0.0/8", "::1/128"},
		"proxies (CIDRs) whose X-Forwarded-For, and X-Real-IP at /v1/auth, name the client, when --http-config is not given (there: trusted_proxies)")
	f.IntVar(&c.Auth.DeniedStatus, "auth-denied-status", httplimit.DefaultDeniedStatus, "status of a denied /v1/auth request (403 for nginx auth_request)")
	l := &c.Limits
	f.DurationVar(&l.ReadHeaderTimeout, "read-header-timeout", server.DefaultReadHeaderTimeout, "bound on reading a request's headers (every HTTP listener)")
	f.DurationVar(&l.ReadTimeout, "read-timeout", server.DefaultReadTimeout, "bound on reading a whole request, body included (HTTP API)")
	f.DurationVar(&l.WriteTimeout, "write-timeout", server.DefaultWriteTimeout, "bound on writing a response (HTTP API)")
	f.DurationVar(&l.ProxyTimeout, "proxy-timeout", server.DefaultProxyTimeout, "bound on reading a request and writing its response (reverse proxy)")
	f.DurationVar(&l.IdleTimeout, "idle-timeout", server.DefaultIdleTimeout, "how long a keep-alive connection may wait for its next request")
	f.IntVar(&l.MaxHeaderBytes, "max-header-bytes", server.DefaultMaxHeaderBytes, "bound on a request's header block (431 beyond) and on a gRPC call's metadata (stream reset beyond)")
	f.Int64Var(&l.MaxBodyBytes, "max-body-bytes", httplimit.DefaultMaxBodyBytes, "bound on a check request's body (413 beyond) and a gRPC message")
	f.IntVar(&l.MaxConns, "max-conns", server.DefaultMaxConns, "connections each listener holds at once; more wait to be accepted (-1: no bound)")
	f.IntVar(&l.MaxConnsPerAddr, "max-conns-per-addr", server.DefaultMaxConnsPerAddr, "connections each listener holds from one client address (IPv6: one /64); more are refused when accepted: 503 on plaintext HTTP, closed on gRPC and TLS (-1: no bound)")
	f.IntVar(&l.GRPCMaxStreams, "grpc-max-streams", server.DefaultGRPCMaxStreams, "concurrent calls per gRPC connection")
	f.DurationVar(&l.GRPCHandshakeTimeout, "grpc-handshake-timeout", server.DefaultGRPCHandshakeTimeout, "bound on a new gRPC connection's handshake (TLS and HTTP/2 preface)")
	f.DurationVar(&l.GRPCKeepaliveMinTime, "grpc-keepalive-min-time", server.DefaultGRPCKeepaliveMinTime, "shortest keepalive ping interval a gRPC client may use before it is disconnected")
	f.DurationVar(&l.GRPCMaxConnIdle, "grpc-max-conn-idle", server.DefaultGRPCMaxConnIdle, "close gRPC connections without calls for this long")
	f.StringVar(&c.TLS.CertFile, "tls-cert", "", "PEM certificate of the HTTP API and gRPC (with --tls-key: serve TLS; reloaded when the file changes)")
	f.StringVar(&c.TLS.KeyFile, "tls-key", "", "PEM key of --tls-cert")
	f.StringVar(&c.TLS.ClientCAFile, "tls-client-ca", "", "PEM CAs whose client certificates the HTTP API and gRPC require (mutual TLS)")
	f.StringVar(&ef.authTokenFile, "auth-token-file", "", "file of bearer tokens, one per line, that callers of the HTTP API and gRPC must present (/healthz, /readyz and gRPC health stay open; the console at /ui/ also takes one as a basic-authentication password)")
	f.StringSliceVar(&c.AllowedHosts, "allowed-hosts", nil, "host names (or addresses; no port) the HTTP API and console answer as Host, against DNS rebinding; others get 421 (/healthz, /readyz, /openapi.yaml and /v1/auth answer any). Empty: any Host")
	f.DurationVar(&c.AuthMaxDelay, "auth-max-delay", 0, "hold a /v1/auth request that its limits will admit within this long until they do (nginx's proxy_read_timeout must be longer)")
	f.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", server.DefaultShutdownTimeout, "bound on draining requests and flushing hits at shutdown")
	f.StringVar(&ef.logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&ef.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	// envoyproxy/ratelimit's names of the settings that mean the same thing, so that its
	// deployments can swap the binary (docs/envoy-compat.md).
	for flag, env := range map[string]string{
		"merge-domains":                        "MERGE_DOMAIN_CONFIG",
		"envoy-stop-increment-when-over-limit": "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
		"envoy-response-headers":               "LIMIT_RESPONSE_HEADERS_ENABLED",
		"envoy-limit-header":                   "LIMIT_LIMIT_HEADER",
		"envoy-remaining-header":               "LIMIT_REMAINING_HEADER",
		"envoy-reset-header":                   "LIMIT_RESET_HEADER",
		"envoy-quota-mode":                     "QUOTA_MODE",
		"envoy-shadow-mode":                    "SHADOW_MODE",
		"envoy-dynamic-metadata":               "RESPONSE_DYNAMIC_METADATA",
		"redis-timeout":                        "REDIS_TIMEOUT",
		"redis-key-prefix":                     "CACHE_KEY_PREFIX",
		"log-level":                            "LOG_LEVEL",
		"log-format":                           "LOG_FORMAT",
	} {
		setEnvAliases(f, flag, env)
	}
	addConfigFlag(cmd)
	return cmd
}

// The enforcer's garbage collector target, unless GOGC is set. Its live heap is mostly
// the key tables (bounded by --max-keys) and every call allocates a few kilobytes, so with
// Go's default target (GOGC 100: collect when the heap has grown by the live heap) a small
// heap is collected some twenty times a second at 30 000 calls/s, marking the same key
// tables each time: a fifth of the serving core in the serving benchmark's profile. The
// enforcer gives the collector gcHeadroom bytes of growth instead, as a GOGC between 100
// and 400 recomputed from the live heap every gcTuneEvery: a 10 MiB heap is collected a
// quarter as often, a heap of several hundred MiB (a million keys) as with the default, so
// memory stays within twice the live heap plus gcHeadroom.
const (
	gcHeadroom   = 128 << 20
	gcTuneEvery  = 5 * time.Second
	gcPercentMin = 100
	gcPercentMax = 400
)

// rulesMaxBytesUsage is the usage of --rules-max-bytes, shared by enforcer and rules check.
const rulesMaxBytesUsage = "bound on each rules file (64MiB, 1GiB; none: no bound): a larger one is refused, at start and at reload, before it is read"

// memoryUsage is the usage of --max-memory, shared by enforcer and dev.
const memoryUsage = "memory target: the per-key structures keep at most half of it alive, idle keys evicted first (256MiB, 2GiB; none: bound by --max-keys only)"

// limitMemory sets the Go runtime's soft memory limit to the enforcer's memory target
// (--max-memory), unless GOMEMLIMIT chose one: the per-key structures keep at most half of
// it alive, and the limit makes the collector run before the heap's garbage takes the
// process past it. A soft limit, not the bound: the structures' own budgets are.
func limitMemory(target int64) {
	if target > 0 && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(target)
	}
}

// gcPercentFor returns the GOGC that gives a live heap of live bytes gcHeadroom of growth,
// within [gcPercentMin, gcPercentMax].
func gcPercentFor(live uint64) int {
	if live == 0 {
		return gcPercentMax
	}
	return int(min(max(uint64(gcHeadroom)*100/live, gcPercentMin), gcPercentMax))
}

// tuneGC sets the GC target from the live heap now and every gcTuneEvery until ctx is
// done, unless the GOGC environment variable chose a target.
func tuneGC(ctx context.Context) {
	if os.Getenv("GOGC") != "" {
		return
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	set := func() {
		metrics.Read(sample)
		if sample[0].Value.Kind() == metrics.KindUint64 {
			debug.SetGCPercent(gcPercentFor(sample[0].Value.Uint64()))
		}
	}
	set()
	go func() {
		t := time.NewTicker(gcTuneEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				set()
			}
		}
	}()
}

// registerRLQSFlags adds the flags of the Rate Limit Quota Service, shared by enforcer and
// dev.
func registerRLQSFlags(f *pflag.FlagSet, addr *string, o *rlqs.Options) {
	f.StringVar(addr, "rlqs-addr", "", "address of Envoy's Rate Limit Quota Service (rate_limit_quota filter); default none: not served")
	f.DurationVar(&o.ReportingInterval, "rlqs-reporting-interval", rlqs.DefaultReportingInterval,
		"how often the RLQS clients report each bucket, until measured: Envoy's reporting interval")
	f.IntVar(&o.MaxStreamBuckets, "rlqs-max-stream-buckets", rlqs.DefaultMaxStreamBuckets,
		"buckets one RLQS stream may hold; more are left without an assignment (-1: no bound)")
	f.IntVar(&o.MaxStreamsPerAddr, "rlqs-max-streams-per-addr", rlqs.DefaultMaxStreamsPerAddr,
		"RLQS streams open at once from one client address (IPv6: /64); more are refused (-1: no bound)")
	f.DurationVar(&o.StreamIdleTimeout, "rlqs-stream-idle-timeout", rlqs.DefaultStreamIdleTimeout,
		"cut an RLQS stream that sends no report for this long (-1s: never)")
	f.DurationVar(&o.SendTimeout, "rlqs-send-timeout", rlqs.DefaultSendTimeout,
		"cut an RLQS stream whose client takes no response for this long (-1s: never)")
}

func orNone(s string) string {
	if s == "" {
		return "off"
	}
	return s
}

// serverConfig turns the flags into a server.Config.
func (ef *enforcerFlags) serverConfig() (server.Config, error) {
	cfg := ef.cfg
	cfg.MaxMemory = int64(ef.maxMemory)
	cfg.Load.MaxFileBytes = int64(ef.rulesMaxBytes)
	cfg.NoGRPCReflection = !ef.grpcReflection
	var errs []error
	if cfg.Site == "" {
		errs = append(errs, errors.New("--site is required"))
	}
	if cfg.Rules == "" {
		errs = append(errs, errors.New("--rules is required"))
	}
	if ef.siteKeys != "" {
		keys, err := topics.LoadSiteKeys(ef.siteKeys)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("--site-keys: %w", err))
		case ef.noKafka:
			errs = append(errs, errors.New("--site-keys signs what is published to Kafka: not with --no-kafka"))
		default:
			var ok bool
			if cfg.SiteKey, ok = keys.Key(cfg.Site); !ok {
				errs = append(errs, fmt.Errorf("--site-keys %s: no key for site %q", ef.siteKeys, cfg.Site))
			}
		}
	}
	log, err := newLogger(ef.logFormat, ef.logLevel)
	if err != nil {
		errs = append(errs, err)
	}
	cfg.Logger = log
	if !ef.noKafka {
		cfg.Brokers = ef.kf.brokers
		if cfg.KafkaOpts, err = ef.kf.security(); err != nil {
			errs = append(errs, err)
		}
	}
	if cfg.Redis.MasterName != "" && len(cfg.Redis.Addrs) == 0 {
		errs = append(errs, errors.New("--redis-sentinel-master needs --redis-addr: the addresses of the Sentinels"))
	}
	if cfg.Redis.TLS, err = ef.redisTLS.config(); err != nil {
		errs = append(errs, fmt.Errorf("redis TLS: %w", err))
	}
	if ef.upstream != "" {
		u, err := url.Parse(ef.upstream)
		if err != nil || u.Scheme == "" || u.Host == "" {
			errs = append(errs, fmt.Errorf("--upstream %q: want an absolute URL such as http://127.0.0.1:9000", ef.upstream))
		}
		cfg.Upstream = u
	}
	if ef.httpConfig != "" {
		if ef.trustedProxiesSet {
			errs = append(errs, errors.New("--trusted-proxies applies only without --http-config: set trusted_proxies in that file"))
		}
		if cfg.HTTP, err = loadHTTPConfig(ef.httpConfig); err != nil {
			errs = append(errs, err)
		}
	} else if ef.httpDomain != "" {
		cfg.HTTP = httplimit.Config{Domain: ef.httpDomain, TrustedProxies: ef.trustedProxies,
			Descriptors: []httplimit.Descriptor{{Entries: []httplimit.Source{{Type: "remote_address"}}}}}
		if err := cfg.HTTP.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("--trusted-proxies: %w", err))
		}
	}
	if cfg.LimitOverrides, err = rls.ParseOverrideMode(ef.limitOverrides); err != nil {
		errs = append(errs, fmt.Errorf("--limit-overrides: %w", err))
	}
	if cfg.Load.Compat, err = rules.ParseCompat(ef.compat); err != nil {
		errs = append(errs, fmt.Errorf("--compat: %w", err))
	}
	switch ef.unknownDomain {
	case "allow":
	case "deny":
		cfg.DenyUnknownDomain = true
	default:
		errs = append(errs, fmt.Errorf("--unknown-domain %q: want allow or deny", ef.unknownDomain))
	}
	if ef.authTokenFile != "" {
		if cfg.AuthTokens, err = readTokens(ef.authTokenFile); err != nil {
			errs = append(errs, err)
		}
	}
	cfg.Registry = newRegistry()
	return cfg, errors.Join(errs...)
}

// maxTokenFileBytes bounds --auth-token-file: some thousands of tokens.
const maxTokenFileBytes = 1 << 20

// readTokens reads bearer tokens, one per line; blank lines and lines starting with # are
// skipped. A file without a token is an error: it would leave the API open unnoticed. The
// file is read as the rules are (safefile): a FIFO, a device or a huge file is refused
// instead of hanging or exhausting the enforcer at start.
func readTokens(path string) ([]string, error) {
	b, _, err := safefile.Read(path, maxTokenFileBytes)
	if err != nil {
		return nil, fmt.Errorf("--auth-token-file %s: %w", path, err)
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			out = append(out, line)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--auth-token-file %s: no token in it", path)
	}
	return out, nil
}

// loadHTTPConfig reads an httplimit.Config from YAML, rejecting unknown fields.
func loadHTTPConfig(path string) (httplimit.Config, error) {
	var c httplimit.Config
	f, err := os.Open(path)
	if err != nil {
		return c, fmt.Errorf("--http-config: %w", err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
