package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// Source types of a descriptor entry.
const (
	// SourceRemoteAddress is the client's IP address (see Config.TrustedProxies), grouped
	// by Config.IPv4Prefix or Config.IPv6Prefix. Default entry key "remote_address".
	SourceRemoteAddress = "remote_address"
	// SourceHeader is the value of request header Name. Default entry key: Name.
	SourceHeader = "header"
	// SourceMethod is the request method. Default entry key "method".
	SourceMethod = "method"
	// SourcePath is the URL path as received (not cleaned). Default entry key "path".
	SourcePath = "path"
	// SourceRoute is the route pattern: the http.ServeMux pattern that matched the request
	// (Request.Pattern, or Options.Mux's), else the longest of Prefixes that the path
	// starts with. Default entry key "route".
	SourceRoute = "route"
	// SourceQuery is the value of query parameter Name (the first, if repeated). Default
	// entry key: Name.
	SourceQuery = "query"
	// SourceGenericKey is the constant Value, as Envoy's generic_key action. Default entry
	// key "generic_key".
	SourceGenericKey = "generic_key"
)

// Config says how requests become enforcer descriptors. It is plain data, loadable from
// YAML:
//
//	domain: api
//	trusted_proxies: [10.0.0.0/8, "::1/128"]
//	forwarded_header: X-Forwarded-For
//	ipv6_prefix: 64
//	descriptors:
//	  - entries:
//	      - {type: remote_address}
//	  - entries:
//	      - {type: header, name: X-API-Key, key: api_key}
//	      - {type: route, prefixes: [/articles, /users]}
//	  - entries:
//	      - {type: generic_key, value: everyone}
//	      - {type: method}
//
// As in Envoy, a descriptor whose entry has no value in a request (the header or query
// parameter is absent, no route matches) is not sent at all, unless the entry says
// skip_if_absent, in which case only that entry is left out. A request for which no
// descriptor remains is not limited.
type Config struct {
	// Domain is the rules domain of every request. Required.
	Domain string `yaml:"domain" json:"domain"`
	// Descriptors are built for each request in order; each is matched against the rules
	// on its own, and the request passes only if all pass.
	Descriptors []Descriptor `yaml:"descriptors" json:"descriptors"`
	// TrustedProxies are the CIDRs (or single addresses) of proxies whose ForwardedHeader
	// is believed (and, at the auth endpoint, whose AuthOptions.ClientIPHeader). Default
	// none: the client is the connection's peer and every forwarding header is ignored.
	TrustedProxies []string `yaml:"trusted_proxies" json:"trusted_proxies"`
	// ForwardedHeader is the one header the trusted proxies write the client's address
	// into; every other forwarding header is ignored, since a client can send any of them
	// and a proxy passes through those it does not set. "Forwarded" is read in its own
	// syntax (for= parameters); any other name as a comma-separated list of addresses, as
	// X-Forwarded-For (or a single one, as X-Real-IP). Default DefaultForwardedHeader.
	ForwardedHeader string `yaml:"forwarded_header" json:"forwarded_header,omitempty"`
	// IPv4Prefix is the prefix length that groups IPv4 clients into one remote_address
	// value. Default 32 (each address on its own).
	IPv4Prefix int `yaml:"ipv4_prefix" json:"ipv4_prefix"`
	// IPv6Prefix is the prefix length that groups IPv6 clients; one subscriber commonly
	// holds a whole /64, so limiting single addresses would be pointless. Default 64.
	IPv6Prefix int `yaml:"ipv6_prefix" json:"ipv6_prefix"`
}

// DefaultForwardedHeader is Config.ForwardedHeader when empty: the header that nginx
// ($proxy_add_x_forwarded_for), Envoy, HAProxy and cloud load balancers append to.
const DefaultForwardedHeader = "X-Forwarded-For"

// Validate reports the first problem of c as a *ConfigError, or nil; New reports the same.
func (c Config) Validate() error {
	_, err := compile(c)
	return err
}

// Descriptor is one descriptor: its entries in order.
type Descriptor struct {
	Entries []Source `yaml:"entries" json:"entries"`
}

// Source says where one descriptor entry's value comes from.
type Source struct {
	// Type is one of the Source* constants.
	Type string `yaml:"type" json:"type"`
	// Key is the entry key, as the rules name it. Default: see the Source* constants.
	Key string `yaml:"key" json:"key,omitempty"`
	// Name is the header name (header) or query parameter name (query).
	Name string `yaml:"name" json:"name,omitempty"`
	// Value is the constant value of a generic_key entry.
	Value string `yaml:"value" json:"value,omitempty"`
	// Prefixes are the path prefixes of a route entry, used when no ServeMux pattern is
	// known.
	Prefixes []string `yaml:"prefixes" json:"prefixes,omitempty"`
	// SkipIfAbsent leaves only this entry out when it has no value, instead of the whole
	// descriptor.
	SkipIfAbsent bool `yaml:"skip_if_absent" json:"skip_if_absent,omitempty"`
}

// ConfigError reports an invalid Config; Field locates the problem, e.g.
// "descriptors[1].entries[0].name".
type ConfigError struct {
	Field string
	Err   error
}

func (e *ConfigError) Error() string { return "httplimit: config " + e.Field + ": " + e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// source is a compiled Source.
type source struct {
	kind         string
	key          string
	name         string // canonical header name, or query parameter
	value        string
	prefixes     []string // longest first
	skipIfAbsent bool
}

// compiled is a validated Config.
type compiled struct {
	domain  string
	descs   [][]source
	trusted []netip.Prefix
	// fwd is the canonical name of Config.ForwardedHeader; fwdRFC is set when it is
	// "Forwarded", whose syntax differs.
	fwd     string
	fwdRFC  bool
	v4, v6  int
	entries int // total entries, for sizing
}

func compile(c Config) (*compiled, error) {
	out := &compiled{domain: c.Domain, v4: c.IPv4Prefix, v6: c.IPv6Prefix}
	if c.Domain == "" {
		return nil, &ConfigError{"domain", errors.New("required")}
	}
	if out.v4 == 0 {
		out.v4 = 32
	}
	if out.v6 == 0 {
		out.v6 = 64
	}
	if out.v4 < 1 || out.v4 > 32 {
		return nil, &ConfigError{"ipv4_prefix", fmt.Errorf("%d is not in 1..32", c.IPv4Prefix)}
	}
	if out.v6 < 1 || out.v6 > 128 {
		return nil, &ConfigError{"ipv6_prefix", fmt.Errorf("%d is not in 1..128", c.IPv6Prefix)}
	}
	out.fwd = http.CanonicalHeaderKey(strings.TrimSpace(c.ForwardedHeader))
	if out.fwd == "" {
		out.fwd = DefaultForwardedHeader
	}
	if strings.ContainsAny(out.fwd, " \t:,;") {
		return nil, &ConfigError{"forwarded_header", fmt.Errorf("%q is not a header name", c.ForwardedHeader)}
	}
	out.fwdRFC = out.fwd == "Forwarded"
	for i, s := range c.TrustedProxies {
		p, err := parsePrefix(s)
		if err != nil {
			return nil, &ConfigError{fmt.Sprintf("trusted_proxies[%d]", i), err}
		}
		out.trusted = append(out.trusted, p)
	}
	if len(c.Descriptors) == 0 {
		return nil, &ConfigError{"descriptors", errors.New("at least one descriptor is required")}
	}
	for i, d := range c.Descriptors {
		if len(d.Entries) == 0 {
			return nil, &ConfigError{fmt.Sprintf("descriptors[%d].entries", i), errors.New("at least one entry is required")}
		}
		var srcs []source
		for j, e := range d.Entries {
			f := fmt.Sprintf("descriptors[%d].entries[%d]", i, j)
			s, err := compileSource(e)
			if err != nil {
				var ce *ConfigError
				if errors.As(err, &ce) {
					ce.Field = f + "." + ce.Field
					return nil, ce
				}
				return nil, &ConfigError{f, err}
			}
			srcs = append(srcs, s)
		}
		out.descs = append(out.descs, srcs)
		out.entries += len(srcs)
	}
	return out, nil
}

func compileSource(e Source) (source, error) {
	s := source{kind: e.Type, key: e.Key, name: e.Name, value: e.Value, skipIfAbsent: e.SkipIfAbsent}
	def := e.Type
	switch e.Type {
	case SourceRemoteAddress, SourceMethod, SourcePath, SourceGenericKey:
		if e.Type == SourceGenericKey && e.Value == "" {
			return s, &ConfigError{"value", errors.New("generic_key needs a value")}
		}
	case SourceHeader:
		if e.Name == "" {
			return s, &ConfigError{"name", errors.New("header needs a name")}
		}
		s.name = http.CanonicalHeaderKey(e.Name)
		def = e.Name
	case SourceQuery:
		if e.Name == "" {
			return s, &ConfigError{"name", errors.New("query needs a name")}
		}
		def = e.Name
	case SourceRoute:
		for _, p := range e.Prefixes {
			if !strings.HasPrefix(p, "/") {
				return s, &ConfigError{"prefixes", fmt.Errorf("%q does not start with /", p)}
			}
			s.prefixes = append(s.prefixes, p)
		}
		// Longest first, so that /api/v2 wins over /api.
		for i := 1; i < len(s.prefixes); i++ {
			for j := i; j > 0 && len(s.prefixes[j]) > len(s.prefixes[j-1]); j-- {
				s.prefixes[j], s.prefixes[j-1] = s.prefixes[j-1], s.prefixes[j]
			}
		}
	case "":
		return s, &ConfigError{"type", errors.New("required")}
	default:
		return s, &ConfigError{"type", fmt.Errorf("unknown type %q (want remote_address, header, method, path, route, query or generic_key)", e.Type)}
	}
	if s.key == "" {
		s.key = def
	}
	return s, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("bad CIDR: %w", err)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("bad address: %w", err)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}
