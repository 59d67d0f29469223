package main

import (
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitestore"
	"github.com/streamlimit/streamlimit/serve/httplimit"
	"github.com/streamlimit/streamlimit/serve/rlqs"
	"github.com/streamlimit/streamlimit/serve/rls"
	"github.com/streamlimit/streamlimit/serve/server"
)

// notFlags are the settings of server.Config that no flag of `streamlimit enforcer` writes
// directly, each with how the command sets it, or why it has no flag.
var notFlags = map[string]string{
	"Config.Load.MaxFileBytes":        "--rules-max-bytes (a byte size, parsed first)",
	"Config.RuleSet":                  "--rules names a file; rules made in code are for library callers",
	"Config.Brokers":                  "--brokers, unless --no-kafka",
	"Config.KafkaOpts":                "--kafka-tls-*, --kafka-sasl-* (built into client options)",
	"Config.SiteKey":                  "--site-keys (the file's line for --site)",
	"Config.Load.Compat":              "--compat (parsed)",
	"Config.Tuning.DenyUnknownDomain": "--unknown-domain allow|deny",
	"Config.Tuning.EnvoyKeyPrefix":    "--redis-key-prefix when given, as envoyproxy/ratelimit's CACHE_KEY_PREFIX",
	"Config.Tuning.ShareDamping":      "tuned with `streamlimit sim dc --share-damping`; the default is the simulator's choice",
	"Config.Tuning.DemandPrior":       "tuned with `streamlimit sim dc --demand-prior`; the default is the simulator's choice",
	"Config.Tuning.NewKeyHold":        "a few pipeline lags; not worth a flag until a deployment needs another",
	"Config.Tuning.RecoveryHold":      "the catch-up after an outage; not worth a flag until a deployment needs another",
	"Config.Tuning.MaxWaiters":        "Await's queue, which only the library's callers use",
	"Config.Redis.Client":             "a library caller's own client; the command builds one from --redis-*",
	"Config.Redis.TLS":                "--redis-tls-* (built into a tls.Config)",
	"Config.Redis.HashTag":            "a function: how a library caller spreads keys over a Cluster",
	"Config.Redis.Breaker":            "the circuit breaker's defaults (package breaker); not worth flags until a deployment needs others",
	"Config.Redis.ExpirySlack":        "clock skew between enforcers and Redis; not worth a flag until a deployment needs another",
	"Config.Redis.ReturnHold":         "the end of an outage; not worth a flag until a deployment needs another",
	"Config.Redis.Lanes":              "measured on the serving benchmark (docs/redis.md); not worth a flag",
	"Config.Redis.MaxBatch":           "measured on the serving benchmark (docs/redis.md); not worth a flag",
	"Config.MaxMemory":                "--max-memory (a byte size, parsed first)",
	"Config.Clock":                    "the wall clock; tests inject theirs",
	"Config.Logger":                   "--log-format and --log-level",
	"Config.Registerer":               "the Server's Registry",
	"NoGRPCReflection":                "--grpc-reflection, inverted",
	"LimitOverrides":                  "--limit-overrides (parsed)",
	"RLQS.TTL":                        "--max-staleness: assignments live as long as the counts they come from",
	"RLQS.SiteShare":                  "--site-enforcers",
	"RLQS.MaxBytes":                   "--max-memory's RLQS part (memsize.RLQSPart)",
	"RLQS.Clock":                      "the Server's",
	"RLQS.Logger":                     "the Server's",
	"RLQS.Registerer":                 "the Server's",
	"Upstream":                        "--upstream (parsed as a URL)",
	"HTTP":                            "--http-config, or --http-domain and --trusted-proxies",
	"AuthTokens":                      "--auth-token-file",
	"Registry":                        "a new registry, served on /metrics",
	"Auth.ClientIPHeader":             "nginx's header names, as docs/api.md's auth_request snippet sets them",
	"Auth.URIHeader":                  "nginx's header names, as docs/api.md's auth_request snippet sets them",
	"Auth.MethodHeader":               "nginx's header names, as docs/api.md's auth_request snippet sets them",
	"RLQS.Strategy":                   "token buckets, what Envoy's filter enforces best (docs/rlqs.md); other strategies are for library callers",
	"RLQS.Unit":                       "the unit of the requests_per_time_unit strategy, which has no flag either",
	"RLQS.AbandonAfter":               "not worth a flag until a deployment needs another",
}

// flagName finds a flag's name at the start of a notFlags reason.
var flagName = regexp.MustCompile(`^--[a-z0-9-]+`)

// groups are the struct types whose fields are settings of their own (walked into);
// every other field is one setting.
var groups = []reflect.Type{
	reflect.TypeFor[streamlimit.Config](), reflect.TypeFor[enforcer.Tuning](),
	reflect.TypeFor[sitestore.Redis](), reflect.TypeFor[rules.LoadOptions](),
	reflect.TypeFor[rls.EnvoyOptions](), reflect.TypeFor[rlqs.Options](),
	reflect.TypeFor[server.Limits](), reflect.TypeFor[server.TLSFiles](),
	reflect.TypeFor[httplimit.AuthOptions](),
}

// TestEveryServerSettingHasAFlag walks server.Config field by field (into the embedded
// layers below it: streamlimit.Config, enforcer.Tuning, sitestore.Redis, ...) and
// requires each setting to be written by a flag of `streamlimit enforcer`, or listed in
// notFlags with how it is set. A setting added to any layer's struct therefore reaches
// the command, or says why not, in the same change.
func TestEveryServerSettingHasAFlag(t *testing.T) {
	var ef enforcerFlags
	cmd := newEnforcerCmdOn(&ef)
	written := map[uintptr]string{} // a flag's target address → the flag
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		for _, p := range targets(reflect.ValueOf(f.Value)) {
			written[p] = "--" + f.Name
		}
	})
	var missing, stale []string
	listed := map[string]bool{}
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		for i := range v.NumField() {
			sf := v.Type().Field(i)
			if !sf.IsExported() {
				continue
			}
			name := strings.TrimPrefix(path+"."+sf.Name, ".")
			fv := v.Field(i)
			if slices.Contains(groups, sf.Type) {
				walk(fv, name)
				continue
			}
			_, byFlag := written[fv.Addr().Pointer()]
			why, ok := notFlags[name]
			switch {
			case ok && byFlag && !strings.HasPrefix(why, "--"+strings.TrimPrefix(written[fv.Addr().Pointer()], "--")):
				stale = append(stale, name+" is written by "+written[fv.Addr().Pointer()]+" but listed as: "+why)
			case ok:
				listed[name] = true
				if f := flagName.FindString(why); strings.HasPrefix(why, "--") && !strings.HasSuffix(f, "-") && cmd.Flags().Lookup(f[2:]) == nil {
					stale = append(stale, name+" is listed as set by "+f+", which is no flag")
				}
			case !byFlag:
				missing = append(missing, name)
			}
		}
	}
	walk(reflect.ValueOf(&ef.cfg).Elem(), "")
	for name := range notFlags {
		if !listed[name] {
			stale = append(stale, name+" is listed in notFlags but is no setting of server.Config")
		}
	}
	slices.Sort(missing)
	slices.Sort(stale)
	for _, m := range missing {
		t.Errorf("server.Config.%s: no flag of `streamlimit enforcer` writes it; add one, or list it in notFlags with why", m)
	}
	for _, s := range stale {
		t.Error(s)
	}
}

// targets returns the addresses a flag.Value writes: the value itself when it points at
// the setting (pflag's scalar values are pointers to it), or the pointers it holds (its
// slice values keep a pointer to the slice).
func targets(v reflect.Value) []uintptr {
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return nil
	}
	out := []uintptr{v.Pointer()}
	if e := v.Elem(); e.Kind() == reflect.Struct {
		for i := range e.NumField() {
			if f := e.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
				out = append(out, f.Pointer())
			}
		}
	}
	return out
}
