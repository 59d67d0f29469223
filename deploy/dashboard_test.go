package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/aggregator"
	"github.com/streamlimit/streamlimit/enforcer/sitestore"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/server"
)

// TestGrafanaDashboardMetricsExist checks deploy/grafana/streamlimit.json against the
// metrics that an enforcer process (with Redis configured) and an aggregator really
// register: every streamlimit_ metric a panel queries must be one of them, so that a
// renamed metric cannot leave a panel silently empty.
func TestGrafanaDashboardMetricsExist(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("grafana", "streamlimit.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}

	reg := streamlimitMetrics(t)

	nameRE := regexp.MustCompile(`\bstreamlimit_[a-z0-9_]+`)
	var queried []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			names := nameRE.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q queries no streamlimit metric: %s", p.Title, tg.Expr)
			}
			for _, n := range names {
				if !registered(reg, n) {
					t.Errorf("panel %q queries %s, which no component registers", p.Title, n)
				}
				queried = append(queried, n)
			}
		}
	}
	// The test itself must be able to fail: a made-up name is not registered.
	if registered(reg, "streamlimit_enforcer_no_such_metric_total") {
		t.Fatal("registered() accepts a name nobody registers")
	}
	if !slices.Contains(queried, "streamlimit_enforcer_decisions_total") {
		t.Error("the dashboard does not show decisions")
	}
}

// streamlimitMetrics returns a registry with the metrics of an enforcer process (with
// Redis configured; built, never run against a broker: clients connect lazily) and of an
// aggregator.
func streamlimitMetrics(t *testing.T) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	srv, err := server.New(server.Config{
		Config: streamlimit.Config{
			Site:    "t",
			Rules:   rulesPath,
			Brokers: []string{"127.0.0.1:9"},
			Redis:   sitestore.Redis{Addrs: []string{"127.0.0.1:9"}},
			Logger:  quiet,
		},
		HTTPAddr:        "127.0.0.1:0",
		GRPCAddr:        "127.0.0.1:0",
		ShutdownTimeout: 100 * time.Millisecond,
		Registry:        reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	defer srv.Run(ctx) // closes its listeners at once
	if _, err := aggregator.New(aggregator.Config{Brokers: []string{"127.0.0.1:9"}, Logger: quiet, Registerer: reg}); err != nil {
		t.Fatal(err)
	}

	return reg
}

// registered reports whether reg has a metric family called name (for a histogram, name
// may end in _bucket, _sum or _count). It registers a probe collector of that name: the
// registry refuses it exactly when a collector already describes the name.
func registered(reg *prometheus.Registry, name string) bool {
	for _, n := range []string{name, strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")} {
		probe := prometheus.NewGauge(prometheus.GaugeOpts{Name: n, Help: "probe"})
		err := reg.Register(probe)
		if err == nil {
			reg.Unregister(probe)
			continue
		}
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) || strings.Contains(err.Error(), "same fully-qualified name") {
			return true
		}
	}
	return false
}

// TestPrometheusAlerts checks deploy/prometheus/alerts.yml with promtool (Debian's
// prometheus package): the rules are valid and each alert fires, or stays silent, on the
// recorded series of alerts_test.yml as it should; and every streamlimit metric they use is
// registered by the enforcer or the aggregator.
func TestPrometheusAlerts(t *testing.T) {
	promtool := testenv.Tool(t, "promtool", "apt-get install prometheus")
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	b, err := os.ReadFile(filepath.Join("prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	reg := streamlimitMetrics(t)
	n := 0
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			n++
			for _, name := range regexp.MustCompile(`\bstreamlimit_[a-z0-9_]+`).FindAllString(r.Expr, -1) {
				if !registered(reg, name) {
					t.Errorf("alert %s uses %s, which no component registers", r.Alert, name)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no alerting rules")
	}
}
