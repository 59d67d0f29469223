package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/streamlimit/streamlimit/cmd/streamlimit/internal/countsview"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

func newRulesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rules",
		Short: "Validate rate-limit rules files",
	}
	cmd.AddCommand(newRulesCheckCmd())
	return cmd
}

func newRulesCheckCmd() *cobra.Command {
	var asJSON, merge bool
	var compat string
	maxBytes := byteSize(rules.DefaultMaxFileBytes)
	cmd := &cobra.Command{
		Use:   "check PATH",
		Short: "Load a rules file or directory as the enforcer does; list every limit or every error",
		Long: `check loads PATH (a YAML file, or every *.yaml/*.yml file directly in a directory) exactly
as the enforcer does. On error it prints every problem as file:line:column: field: reason and
exits 1, for operators' CI. Otherwise it lists every limit: domain, descriptor path, limit
(requests per window, and the unit when given), algorithm, scope and flags. Give it the
enforcer's --compat, --merge-domains and --rules-max-bytes to load as that enforcer loads.
Like the enforcer, it refuses a path that is not a regular file (a named pipe, a device)
and a file over --rules-max-bytes, without reading it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := rules.ParseCompat(compat)
			if err != nil {
				return fmt.Errorf("--compat: %w", err)
			}
			cfg, err := rules.LoadWith(args[0], rules.LoadOptions{Compat: c, MergeDomains: merge, MaxFileBytes: int64(maxBytes)})
			if err != nil {
				var n int
				if j, ok := err.(interface{ Unwrap() []error }); ok {
					n = len(j.Unwrap())
				}
				if n > 1 {
					return fmt.Errorf("rules check %s: %d errors:\n%w", args[0], n, err)
				}
				return err
			}
			rows, err := listLimits(cfg)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			printLimits(cmd.OutOrStdout(), cfg, rows)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the limits as a JSON array")
	cmd.Flags().StringVar(&compat, "compat", rules.DefaultCompat.String(), "whose answers a domain gets when its file does not say (compat:), as the enforcer's --compat: none or envoy")
	cmd.Flags().BoolVar(&merge, "merge-domains", false, "let several files configure one domain, as the enforcer's --merge-domains")
	cmd.Flags().Var(&maxBytes, "rules-max-bytes", rulesMaxBytesUsage+", as the enforcer's --rules-max-bytes")
	return cmd
}

// limitRow is one limit of a loaded rules set, as check lists it.
type limitRow struct {
	Domain      string        `json:"domain"`
	Descriptor  string        `json:"descriptor"`
	Entries     []rules.Entry `json:"-"`
	File        string        `json:"file"`
	Line        int           `json:"line"`
	ID          string        `json:"id,omitempty"`
	Requests    *int64        `json:"requests,omitempty"`
	WindowMs    int64         `json:"window_ms,omitempty"`
	Window      string        `json:"window,omitempty"`
	Unit        string        `json:"unit,omitempty"`
	Algorithm   string        `json:"algorithm,omitempty"`
	Scope       string        `json:"scope,omitempty"`
	Name        string        `json:"name,omitempty"`
	Replaces    []string      `json:"replaces,omitempty"`
	SoftPercent int           `json:"soft_percent,omitempty"`
	// SoftBand is the counts, first and last, that a soft limit admits past its hard
	// limit, marked soft.
	SoftBand    *[2]int64 `json:"soft_band,omitempty"`
	Burst       int64     `json:"burst,omitempty"`
	Hard        bool      `json:"hard,omitempty"`
	Align       string    `json:"align,omitempty"`
	Pool        string    `json:"pool,omitempty"`
	ElasticMax  int64     `json:"elastic_max,omitempty"`
	ElasticTill int       `json:"elastic_until,omitempty"`
	Priority    string    `json:"priority,omitempty"`
	// Priorities is set on a pool's row: the percentage of it each priority may fill.
	Priorities  map[string]int `json:"priorities,omitempty"`
	Unlimited   bool           `json:"unlimited,omitempty"`
	Shadow      bool           `json:"shadow,omitempty"`
	Unreachable bool           `json:"unreachable,omitempty"`
	rule        *rules.Rule    // nil when unreachable
}

// listLimits enumerates the limits of cfg in file and line order, each matched back to
// the rule a request with its descriptor path would get: what is listed is what the
// enforcer would apply.
func listLimits(cfg *rules.Config) ([]limitRow, error) {
	var rows []limitRow
	for _, r := range cfg.Rules() {
		path := make([]rules.Entry, len(r.Levels))
		for i, l := range r.Levels {
			path[i] = rules.Entry{Key: l.Key, Value: l.Value}
		}
		rows = append(rows, rowsOf(cfg, r.Domain, r.File, r.Line, path)...)
	}
	for _, d := range cfg.Domains() {
		for _, pl := range cfg.Pools(d) {
			l := &pl.Limit
			rows = append(rows, limitRow{Domain: d, Descriptor: "pool " + pl.Name, File: pl.File, Line: pl.Line,
				Requests: &l.Requests, WindowMs: l.Window.Milliseconds(), Window: l.Window.String(), Unit: l.Unit,
				Algorithm: l.Algorithm.String(), Scope: l.Scope.String(), SoftPercent: l.SoftPercent, Priorities: pl.Priorities})
		}
	}
	return rows, nil
}

func rowsOf(cfg *rules.Config, domain, file string, line int, path []rules.Entry) []limitRow {
	base := limitRow{Domain: domain, Descriptor: descriptorPath(path), Entries: path, File: file, Line: line}
	r := cfg.Match(domain, path)
	if r == nil {
		return nil // a placeholder level without limits
	}
	if !samePath(r.Levels, path) {
		// Matching the pattern as a value found an earlier wildcard that also matches it:
		// every request this descriptor would match goes to that one instead.
		base.Unreachable = true
		return []limitRow{base}
	}
	base.Line, base.ID, base.Shadow, base.rule = r.Line, r.ID, r.ShadowMode, r
	if r.Unlimited {
		base.Unlimited = true
		return []limitRow{base}
	}
	out := make([]limitRow, 0, len(r.Limits))
	for i := range r.Limits {
		l := &r.Limits[i]
		row := base
		row.Requests = &l.Requests
		row.WindowMs = l.Window.Milliseconds()
		row.Window = l.Window.String()
		row.Unit = l.Unit
		row.Algorithm = l.Algorithm.String()
		row.Scope = l.Scope.String()
		row.Name = l.Name
		row.Replaces = l.Replaces
		row.SoftPercent = l.SoftPercent
		if hard, all := l.HardAllowance(), l.CountAllowance(); l.SoftPercent > 0 && all > hard {
			row.SoftBand = &[2]int64{hard + 1, all}
		}
		row.Burst = l.Burst
		row.Hard = l.Hard
		if l.Calendar {
			row.Align = "calendar"
		}
		if l.Pool != nil {
			row.Pool = l.Pool.Name
		}
		if l.Elastic != nil {
			row.ElasticMax, row.ElasticTill = l.Elastic.Max, l.Elastic.Until
		}
		row.Priority = r.Priority
		if l.Line > 0 {
			row.Line = l.Line
		}
		out = append(out, row)
	}
	return out
}

func samePath(levels []rules.Level, path []rules.Entry) bool {
	if len(levels) != len(path) {
		return false
	}
	for i, l := range levels {
		if l.Key != path[i].Key || l.Value != path[i].Value {
			return false
		}
	}
	return true
}

// descriptorPath formats a descriptor as key=value/key (a level without value matches any
// value and has its own counter per value).
func descriptorPath(path []rules.Entry) string {
	parts := make([]string, len(path))
	for i, e := range path {
		parts[i] = e.Key
		if e.Value != "" {
			parts[i] += "=" + e.Value
		}
	}
	return strings.Join(parts, "/")
}

func printLimits(w io.Writer, cfg *rules.Config, rows []limitRow) {
	t := countsview.Table{Header: []string{"DOMAIN", "DESCRIPTOR", "LIMIT", "ALGORITHM", "SCOPE", "FLAGS", "AT"}}
	for _, r := range rows {
		at := fmt.Sprintf("%s:%d", r.File, r.Line)
		switch {
		case r.Unreachable:
			t.Add(r.Domain, r.Descriptor, "-", "-", "-", "unreachable (an earlier wildcard matches first)", at)
		case r.Unlimited:
			t.Add(r.Domain, r.Descriptor, "unlimited", "-", "-", flags(r), at)
		default:
			lim := fmt.Sprintf("%d / %s", *r.Requests, r.Window)
			if r.Unit != "" {
				lim += " (" + strings.ToLower(r.Unit) + ")"
			}
			t.Add(r.Domain, r.Descriptor, lim, r.Algorithm, r.Scope, flags(r), at)
		}
	}
	if len(rows) > 0 {
		_, _ = t.WriteTo(w)
	}
	domains := cfg.Domains()
	slices.Sort(domains)
	fmt.Fprintf(w, "ok: %s in %s (%s) from %s\n", plural(len(rows), "limit"), plural(len(domains), "domain"),
		strings.Join(domains, ", "), plural(len(cfg.Files()), "file"))
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func flags(r limitRow) string {
	var f []string
	if r.Name != "" {
		f = append(f, "name="+r.Name)
	}
	if r.Shadow {
		f = append(f, "shadow")
	}
	if r.SoftPercent > 0 {
		f = append(f, fmt.Sprintf("soft %d%%", r.SoftPercent))
		if r.SoftBand != nil {
			f = append(f, fmt.Sprintf("soft band %d..%d", r.SoftBand[0], r.SoftBand[1]))
		}
	}
	if r.Burst > 0 {
		f = append(f, fmt.Sprintf("burst %d", r.Burst))
	}
	if len(r.Replaces) > 0 {
		f = append(f, "replaces="+strings.Join(r.Replaces, ","))
	}
	if r.Hard {
		f = append(f, "hard")
	}
	if r.Align != "" {
		f = append(f, "align "+r.Align)
	}
	if r.Pool != "" {
		f = append(f, "pool="+r.Pool)
	}
	if r.ElasticMax > 0 {
		f = append(f, fmt.Sprintf("elastic to %d below %d%% of the pool", r.ElasticMax, r.ElasticTill))
	}
	if r.Priority != "" {
		f = append(f, "priority="+r.Priority)
	}
	if len(r.Priorities) > 0 {
		names := slices.Sorted(maps.Keys(r.Priorities))
		slices.SortStableFunc(names, func(a, b string) int { return r.Priorities[b] - r.Priorities[a] })
		for _, n := range names {
			f = append(f, fmt.Sprintf("%s fills %d%%", n, r.Priorities[n]))
		}
	}
	if r.rule != nil && slices.ContainsFunc(r.rule.Levels, func(l rules.Level) bool { return l.ShareThreshold }) {
		f = append(f, "shared wildcard")
	}
	if r.rule != nil && r.rule.QuotaMode {
		f = append(f, "quota")
	}
	if len(f) == 0 {
		return "-"
	}
	return strings.Join(f, ", ")
}
