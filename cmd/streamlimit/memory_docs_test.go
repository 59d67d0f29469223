package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit/serve/server"
)

// TestDocsMemoryFlags keeps docs/operations.md's table of memory bounds true: each row's default
// is the enforcer's (and, for --max-memory, dev's) flag default, and each example value in
// the --max-memory row is accepted by the flag.
func TestDocsMemoryFlags(t *testing.T) {
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := regexp.MustCompile("(?m)^\\| `(--max-memory|--max-keys)` \\| `enforcer` \\| `([^`]+)` \\| (.*) \\|$").FindAllStringSubmatch(string(b), -1)
	if len(rows) != 2 {
		t.Fatalf("want the rows of --max-memory and --max-keys, found %d", len(rows))
	}
	enf, dev := newEnforcerCmd(), newDevCmd()
	for _, r := range rows {
		f := enf.Flags().Lookup(strings.TrimPrefix(r[1], "--"))
		if f == nil {
			t.Fatalf("docs/operations.md row %s: no such enforcer flag", r[1])
		}
		if f.DefValue != r[2] {
			t.Errorf("docs/operations.md says %s defaults to %s, the flag to %s", r[1], r[2], f.DefValue)
		}
		if r[1] != "--max-memory" {
			continue
		}
		if d := dev.Flags().Lookup("max-memory"); d == nil || d.DefValue != r[2] {
			t.Errorf("dev --max-memory: %v, want default %s", d, r[2])
		}
		def := byteSize(server.DefaultMaxMemory)
		if want := def.String(); r[2] != want {
			t.Errorf("docs/operations.md default %s, server.DefaultMaxMemory %s", r[2], want)
		}
		examples := regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(r[3], -1)
		n := 0
		for _, ex := range examples {
			if strings.HasSuffix(ex[1], "iB") || ex[1] == "none" {
				n++
				if err := enf.Flags().Set("max-memory", ex[1]); err != nil {
					t.Errorf("docs/operations.md example --max-memory %s: %v", ex[1], err)
				}
			}
		}
		if n != 3 {
			t.Errorf("found %d --max-memory examples, want 3", n)
		}
	}
}
