package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// TestREADMERulesLoad keeps the README's examples true: every YAML block that starts with
// "domain:" must load as the enforcer loads it — as rules, or, when it lists descriptor
// entries, as the HTTP descriptor config of --http-config.
func TestREADMERulesLoad(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(b), "```yaml\n")[1:]
	n := 0
	for _, blk := range blocks {
		body := blk[:strings.Index(blk, "```")]
		if !strings.HasPrefix(body, "domain:") {
			continue
		}
		n++
		p := filepath.Join(t.TempDir(), "rules.yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(body, "entries:") {
			if _, err := loadHTTPConfig(p); err != nil {
				t.Errorf("README HTTP config example %d does not load: %v\n%s", n, err, body)
			}
			continue
		}
		if _, err := rules.LoadFile(p); err != nil {
			t.Errorf("README rules example %d does not load: %v\n%s", n, err, body)
		}
	}
	if n == 0 {
		t.Fatal("no rules example found in README.md")
	}
}

// TestREADMEFlagsExist keeps the README's prose honest about flags: every `--flag` it
// names outside code blocks is a flag of some streamlimit command.
func TestREADMEFlagsExist(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) { known["--"+f.Name] = true })
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
	parts := strings.Split(string(b), "```")
	n := 0
	for i := 0; i < len(parts); i += 2 { // outside code blocks
		for _, m := range readmeFlag.FindAllStringSubmatch(parts[i], -1) {
			n++
			if !known[m[1]] {
				t.Errorf("README names %s, which no command has", m[1])
			}
		}
	}
	if n == 0 {
		t.Fatal("no flag found in README.md")
	}
}

var readmeFlag = regexp.MustCompile("`(--[a-z][a-z0-9-]*)")
