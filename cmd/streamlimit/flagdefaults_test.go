package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitestore"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/serve/httplimit"
	"github.com/streamlimit/streamlimit/serve/rlqs"
	"github.com/streamlimit/streamlimit/serve/server"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"

	"github.com/streamlimit/streamlimit/cmd/streamlimit/internal/countsview"
)

// findCmd returns the subcommand at path ("counts get").
func findCmd(t *testing.T, path string) *cobra.Command {
	t.Helper()
	c, _, err := newRootCmd().Find(strings.Fields(path))
	if err != nil || c.Name() != strings.Fields(path)[len(strings.Fields(path))-1] {
		t.Fatalf("no command %q: %v", path, err)
	}
	return c
}

// Every flag that sets a library setting shows the library's own default, so that a
// default is stated once, by the package that owns the setting, and the command cannot
// drift from it.
func TestFlagDefaultsAreTheLibraries(t *testing.T) {
	d := func(v time.Duration) string { return v.String() }
	bytes := func(v int64) string { b := byteSize(v); return b.String() }
	for cmd, flags := range map[string]map[string]string{
		"enforcer": {
			"rules-reload-interval":     d(rules.DefaultReloadInterval),
			"rules-reload-settle":       d(rules.DefaultReloadSettle),
			"rules-max-bytes":           bytes(rules.DefaultMaxFileBytes),
			"hits-topic":                topics.DefaultHitsTopic,
			"counts-topic":              topics.DefaultCountsTopic,
			"max-staleness":             d(snapshot.DefaultMaxStaleness),
			"min-share":                 fmt.Sprint(enforcer.Defaults().MinShare),
			"site-stale-after":          d(enforcer.Defaults().SiteStaleAfter),
			"crash-hold":                d(enforcer.Defaults().CrashHold),
			"reserve-margin":            d(enforcer.Defaults().ReserveMargin),
			"serving-span":              d(enforcer.Defaults().ServingSpan),
			"sub-buckets":               fmt.Sprint(window.DefaultSubBuckets),
			"max-keys":                  fmt.Sprint(enforcer.Defaults().MaxKeys),
			"redis-timeout":             d(sitestore.DefaultTimeout),
			"redis-key-prefix":          sitestore.DefaultKeyPrefix,
			"http-listen":               server.DefaultHTTPAddr,
			"grpc-listen":               server.DefaultGRPCAddr,
			"proxy-listen":              server.DefaultProxyAddr,
			"auth-denied-status":        fmt.Sprint(httplimit.DefaultDeniedStatus),
			"read-header-timeout":       d(server.DefaultReadHeaderTimeout),
			"read-timeout":              d(server.DefaultReadTimeout),
			"write-timeout":             d(server.DefaultWriteTimeout),
			"proxy-timeout":             d(server.DefaultProxyTimeout),
			"idle-timeout":              d(server.DefaultIdleTimeout),
			"max-header-bytes":          fmt.Sprint(server.DefaultMaxHeaderBytes),
			"max-body-bytes":            fmt.Sprint(httplimit.DefaultMaxBodyBytes),
			"max-conns":                 fmt.Sprint(server.DefaultMaxConns),
			"max-conns-per-addr":        fmt.Sprint(server.DefaultMaxConnsPerAddr),
			"grpc-max-streams":          fmt.Sprint(server.DefaultGRPCMaxStreams),
			"grpc-handshake-timeout":    d(server.DefaultGRPCHandshakeTimeout),
			"grpc-keepalive-min-time":   d(server.DefaultGRPCKeepaliveMinTime),
			"grpc-max-conn-idle":        d(server.DefaultGRPCMaxConnIdle),
			"shutdown-timeout":          d(server.DefaultShutdownTimeout),
			"rlqs-reporting-interval":   d(rlqs.DefaultReportingInterval),
			"rlqs-max-stream-buckets":   fmt.Sprint(rlqs.DefaultMaxStreamBuckets),
			"rlqs-max-streams-per-addr": fmt.Sprint(rlqs.DefaultMaxStreamsPerAddr),
			"rlqs-stream-idle-timeout":  d(rlqs.DefaultStreamIdleTimeout),
			"rlqs-send-timeout":         d(rlqs.DefaultSendTimeout),
		},
		"aggregator": {
			"hits-topic":          topics.DefaultHitsTopic,
			"counts-topic":        topics.DefaultCountsTopic,
			"group":               aggregator.DefaultGroup,
			"session-timeout":     d(aggregator.DefaultSessionTimeout),
			"max-local-hold":      d(aggregator.DefaultMaxLocalHold),
			"counts-format":       aggregator.CountsBinary,
			"sub-buckets":         fmt.Sprint(window.DefaultSubBuckets),
			"emit-interval":       d(aggregator.DefaultEmitInterval),
			"max-emit-per-second": fmt.Sprint(aggregator.DefaultMaxEmitPerSecond),
			"lateness":            d(aggregator.DefaultLateness),
			"max-clock-skew":      d(aggregator.DefaultMaxClockSkew),
			"max-keys":            fmt.Sprint(aggregator.DefaultMaxKeys),
			"default-window":      d(aggregator.DefaultDefaultWindow),
			"max-window":          d(topics.DefaultMaxWindow),
			"metadata-max-age":    d(aggregator.DefaultMetadataMaxAge),
		},
		"dev": {
			"http-listen":               server.DefaultHTTPAddr,
			"grpc-listen":               server.DefaultGRPCAddr,
			"rlqs-max-stream-buckets":   fmt.Sprint(rlqs.DefaultMaxStreamBuckets),
			"rlqs-max-streams-per-addr": fmt.Sprint(rlqs.DefaultMaxStreamsPerAddr),
			"rlqs-stream-idle-timeout":  d(rlqs.DefaultStreamIdleTimeout),
			"rlqs-send-timeout":         d(rlqs.DefaultSendTimeout),
		},
		"topics ensure": {
			"hits-partitions":    fmt.Sprint(topics.DefaultPartitions),
			"counts-partitions":  fmt.Sprint(topics.DefaultPartitions),
			"replication-factor": fmt.Sprint(topics.DefaultReplicationFactor),
			"hits-retention":     d(topics.DefaultHitsRetention),
			"max-window":         d(topics.DefaultMaxWindow),
		},
		"topics describe": {
			"hits-partitions":   fmt.Sprint(topics.DefaultPartitions),
			"counts-partitions": fmt.Sprint(topics.DefaultPartitions),
		},
		"rules check": {
			"rules-max-bytes": bytes(rules.DefaultMaxFileBytes),
		},
		"counts get": {
			"max-keys": fmt.Sprint(countsview.DefaultMaxKeys),
		},
	} {
		c := findCmd(t, cmd)
		for name, want := range flags {
			f := c.Flags().Lookup(name)
			if f == nil {
				t.Errorf("%s has no --%s", cmd, name)
				continue
			}
			if f.DefValue != want {
				t.Errorf("%s --%s defaults to %q, its library to %q", cmd, name, f.DefValue, want)
			}
		}
	}
}
