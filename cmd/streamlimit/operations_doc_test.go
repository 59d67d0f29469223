package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// docs/operations.md (and docs/rlqs.md, whose table holds the RLQS bounds) names flags
// by their commands, with their defaults: every flag it names is a flag of some command,
// and every row of its settings tables is a flag of the command the row names, whose
// default is the one the row states.
func TestOperationsDocFlags(t *testing.T) {
	for _, name := range []string{"operations.md", "rlqs.md"} {
		t.Run(name, func(t *testing.T) { checkDocFlags(t, "../../docs/"+name) })
	}
}

// TestRLQSFlagsDocumented: every --rlqs-* flag of the enforcer has its row in
// docs/rlqs.md's table of bounds or is named in its text.
func TestRLQSFlagsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/rlqs.md")
	if err != nil {
		t.Fatal(err)
	}
	newEnforcerCmd().Flags().VisitAll(func(f *pflag.Flag) {
		if strings.HasPrefix(f.Name, "rlqs-") && !strings.Contains(string(b), "`--"+f.Name+"`") {
			t.Errorf("docs/rlqs.md does not name --%s", f.Name)
		}
	})
}

func checkDocFlags(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	root := newRootCmd()
	known := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) { known["--"+f.Name] = true })
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	for _, m := range readmeFlag.FindAllStringSubmatch(doc, -1) {
		if !known[m[1]] {
			t.Errorf("%s names %s, which no command has", path, m[1])
		}
	}
	rows := 0
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 {
			t.Fatalf("settings row %q: want setting, command, default", line)
		}
		flags := backticked.FindAllStringSubmatch(cells[0], -1)
		cmds := backticked.FindAllStringSubmatch(cells[1], -1)
		defs := backticked.FindAllStringSubmatch(cells[2], -1)
		if len(cmds) != 1 {
			t.Fatalf("settings row %q: want one command", line)
		}
		cmd, _, err := root.Find([]string{cmds[0][1]})
		if err != nil || cmd == root {
			t.Fatalf("settings row %q: no command %q", line, cmds[0][1])
		}
		if len(defs) > 0 && len(defs) != len(flags) {
			t.Fatalf("settings row %q: %d flags but %d defaults", line, len(flags), len(defs))
		}
		for i, f := range flags {
			rows++
			fl := cmd.Flags().Lookup(strings.TrimPrefix(f[1], "--"))
			if fl == nil {
				t.Errorf("%s: %s has no flag %s", path, cmds[0][1], f[1])
				continue
			}
			if len(defs) > 0 && defs[i][1] != fl.DefValue {
				t.Errorf("%s: %s %s defaults to %q, the doc says %q", path, cmds[0][1], f[1], fl.DefValue, defs[i][1])
			}
		}
	}
	if rows == 0 {
		t.Fatalf("no settings rows found in %s", path)
	}
}

var backticked = regexp.MustCompile("`([^`]+)`")
