package rlqs

import (
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	ratelimitquotav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"gopkg.in/yaml.v3"

	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/envoyfilter"
)

// fromYAML decodes a YAML form of a protobuf message (as Envoy reads its configuration)
// into m, through protojson: every field must exist and every typed_config resolve.
func fromYAML(t *testing.T, src any, m proto.Message) {
	t.Helper()
	js, err := json.Marshal(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(js, m); err != nil {
		t.Fatalf("%T: %v\n%s", m, err, js)
	}
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			t.Fatalf("%T: %v", m, err)
		}
	}
}

// envoyConfig is what a test reads of an Envoy configuration: the rate_limit_quota filter,
// the bucket settings of its matchers' actions, and the cluster it names.
type envoyConfig struct {
	filter   *ratelimitquotav3.RateLimitQuotaFilterConfig
	settings []*ratelimitquotav3.RateLimitQuotaBucketSettings
	cluster  *clusterv3.Cluster
}

// checkEnvoyConfig checks the rate_limit_quota filter among filters and its cluster among
// clusters: the filter's config and bucket settings are valid and read by the Envoy model,
// and the cluster speaks HTTP/2 (gRPC) to port.
func checkEnvoyConfig(t *testing.T, filters []*hcmv3.HttpFilter, clusters []*clusterv3.Cluster, port int) envoyConfig {
	t.Helper()
	var c envoyConfig
	for _, f := range filters {
		if f.GetName() != "envoy.filters.http.rate_limit_quota" {
			continue
		}
		c.filter = &ratelimitquotav3.RateLimitQuotaFilterConfig{}
		if err := f.GetTypedConfig().UnmarshalTo(c.filter); err != nil {
			t.Fatal(err)
		}
	}
	if c.filter == nil {
		t.Fatal("no envoy.filters.http.rate_limit_quota filter")
	}
	for _, m := range c.filter.GetBucketMatchers().GetMatcherList().GetMatchers() {
		s := &ratelimitquotav3.RateLimitQuotaBucketSettings{}
		if err := m.GetOnMatch().GetAction().GetTypedConfig().UnmarshalTo(s); err != nil {
			t.Fatal(err)
		}
		if _, err := envoyfilter.SettingsFrom(s); err != nil {
			t.Fatal(err)
		}
		c.settings = append(c.settings, s)
	}
	if len(c.settings) == 0 {
		t.Fatal("no bucket matcher with an action")
	}
	name := c.filter.GetRlqsServer().GetEnvoyGrpc().GetClusterName()
	for _, cl := range clusters {
		if cl.GetName() == name {
			c.cluster = cl
		}
	}
	if c.cluster == nil {
		t.Fatalf("the filter's cluster %q is not configured", name)
	}
	var po upstreamhttpv3.HttpProtocolOptions
	if err := c.cluster.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(&po); err != nil {
		t.Fatalf("cluster %s: HttpProtocolOptions: %v", name, err)
	}
	if po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Errorf("cluster %s does not speak HTTP/2: gRPC needs it", name)
	}
	got := c.cluster.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
	if int(got) != port {
		t.Errorf("cluster %s: port %d, want the enforcer's --rlqs-addr port %d", name, got, port)
	}
	return c
}

// driveEnvoyConfig serves the rules of yaml and makes an Envoy model with c's first bucket
// settings decide a request of bucket id: it is reported, and the server assigns a token
// bucket for it, as the configuration means.
func driveEnvoyConfig(t *testing.T, rulesYAML string, c envoyConfig, id map[string]string) {
	t.Helper()
	cfg, err := rules.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	descs := NewMapper(cfg).Descriptors(c.filter.GetDomain(), id)
	if len(descs) == 0 || cfg.Match(c.filter.GetDomain(), descs[0]) == nil {
		t.Fatalf("bucket id %v maps to %v, which no rule of domain %q matches", id, descs, c.filter.GetDomain())
	}
	s, err := envoyfilter.SettingsFrom(c.settings[0])
	if err != nil {
		t.Fatal(err)
	}
	l := startLive(t, rulesYAML, Options{ReportingInterval: s.ReportingInterval})
	e := l.envoy(envoyfilter.Options{Domain: c.filter.GetDomain()})
	e.Decide(id, s)
	eventually(t, "an assignment", func() bool { return e.Stats().Responses > 0 })
	st, _ := e.Filter().Strategy(time.Now(), id)
	if st.GetTokenBucket() == nil {
		t.Errorf("assignment %v, want a token bucket", st)
	}
}

// section returns the Markdown of the section of doc that starts with heading.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), heading+"\n")
	if !ok {
		t.Fatalf("%s has no %q", doc, heading)
	}
	if i := strings.Index(sec, "\n#"); i >= 0 {
		sec = sec[:i]
	}
	return sec
}

// firstBlock returns the first fenced block of lang in md that starts with prefix.
func firstBlock(t *testing.T, md, lang, prefix string) string {
	t.Helper()
	for _, b := range strings.Split(md, "```"+lang+"\n")[1:] {
		if b, _, _ = strings.Cut(b, "```"); strings.HasPrefix(b, prefix) {
			return b
		}
	}
	t.Fatalf("no %s block starting with %q", lang, prefix)
	return ""
}

// docsRules returns docs/rules.md's first rules example of domain api (its user limits).
func docsRules(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/rules.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, blk := range strings.Split(string(b), "```yaml\n")[1:] {
		if body, _, _ := strings.Cut(blk, "```"); strings.HasPrefix(body, "domain: api\n") {
			return body
		}
	}
	t.Fatal("no rules example of domain api in docs/rules.md")
	return ""
}

var rlqsAddrFlag = regexp.MustCompile(`--rlqs-addr 127\.0\.0\.1:(\d+)`)

// TestDocsAPIEnvoyConfig keeps docs/api.md's Envoy configuration working: its filter and
// cluster parse into go-control-plane's messages and validate, the cluster is the
// enforcer's --rlqs-addr over HTTP/2, and the Envoy model configured by it gets a token
// bucket for a user of docs/rules.md's rules.
func TestDocsAPIEnvoyConfig(t *testing.T) {
	sec := section(t, "../../docs/api.md", "## Envoy deciding locally (Rate Limit Quota Service)")
	if n := strings.Count(sec, "\n"); n > 15 {
		t.Errorf("docs/api.md's RLQS section has %d lines, want at most 15: the rest belongs in docs/rlqs.md", n)
	}
	m := rlqsAddrFlag.FindStringSubmatch(sec)
	if m == nil {
		t.Fatal("the section names no --rlqs-addr 127.0.0.1:PORT")
	}
	port, _ := strconv.Atoi(m[1])
	var doc struct {
		HTTPFilters []any `yaml:"http_filters"`
		Clusters    []any `yaml:"clusters"`
	}
	if err := yaml.Unmarshal([]byte(firstBlock(t, sec, "yaml", "http_filters:")), &doc); err != nil {
		t.Fatal(err)
	}
	var filters []*hcmv3.HttpFilter
	for _, f := range doc.HTTPFilters {
		hf := &hcmv3.HttpFilter{}
		fromYAML(t, f, hf)
		filters = append(filters, hf)
	}
	var clusters []*clusterv3.Cluster
	for _, c := range doc.Clusters {
		cl := &clusterv3.Cluster{}
		fromYAML(t, c, cl)
		clusters = append(clusters, cl)
	}
	c := checkEnvoyConfig(t, filters, clusters, port)
	driveEnvoyConfig(t, docsRules(t), c, map[string]string{"user": "42"})
}

// TestDocsEnvoyBootstrap keeps docs/rlqs.md's whole Envoy bootstrap working, as
// docs/api.md's fragment: it parses into go-control-plane's Bootstrap and validates, and its
// filter, matchers and cluster work with the rules file beside it.
func TestDocsEnvoyBootstrap(t *testing.T) {
	sec := section(t, "../../docs/rlqs.md", "## An Envoy configuration")
	var src any
	if err := yaml.Unmarshal([]byte(firstBlock(t, sec, "yaml", "static_resources:")), &src); err != nil {
		t.Fatal(err)
	}
	var bs bootstrapv3.Bootstrap
	fromYAML(t, src, &bs)
	var filters []*hcmv3.HttpFilter
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, nf := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if err := nf.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					t.Fatal(err)
				}
				if err := hcm.ValidateAll(); err != nil {
					t.Fatal(err)
				}
				filters = append(filters, hcm.GetHttpFilters()...)
				if last := hcm.GetHttpFilters()[len(hcm.GetHttpFilters())-1]; last.GetName() != "envoy.filters.http.router" {
					t.Errorf("last HTTP filter %s, want the router", last.GetName())
				}
			}
		}
	}
	m := rlqsAddrFlag.FindStringSubmatch(section(t, "../../docs/rlqs.md", "## Serving it"))
	if m == nil {
		t.Fatal("docs/rlqs.md's serving section names no --rlqs-addr 127.0.0.1:PORT")
	}
	port, _ := strconv.Atoi(m[1])
	c := checkEnvoyConfig(t, filters, bs.GetStaticResources().GetClusters(), port)
	rulesYAML := firstBlock(t, sec, "yaml", "domain:")
	// Every matcher's bucket id is made of the request's headers: those of the section's
	// example request.
	driveEnvoyConfig(t, rulesYAML, c, map[string]string{"user": "42", "plan": "free"})
}
