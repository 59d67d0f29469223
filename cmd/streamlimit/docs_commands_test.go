package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// inlineCommand is a code span that runs streamlimit, but for one naming several
// subcommands at once (`counts get|top|tail`) or elided arguments.
var inlineCommand = regexp.MustCompile("`((?:go run ./cmd/)?streamlimit [^`|…]*)`")

// TestDocsCommandsParse keeps every streamlimit command line of the README and of docs/
// runnable as written: each line of a sh block that runs streamlimit (or
// `go run ./cmd/streamlimit`) names a command that exists, with flags it has and values
// they accept, and each code span of the prose that does names a command and flags that
// exist. Tests elsewhere run many of them; this one leaves none unchecked.
func TestDocsCommandsParse(t *testing.T) {
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, name := range append([]string{"../../README.md"}, docs...) {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.Split(string(b), "```")
		var blocks []string
		for i, p := range parts {
			if i%2 == 1 {
				if blk, ok := strings.CutPrefix(p, "sh\n"); ok {
					blocks = append(blocks, blk)
				}
				continue
			}
			// Prose names commands in code spans too (`streamlimit rules check`), often
			// without their arguments: the command and its flags must exist.
			for _, m := range inlineCommand.FindAllStringSubmatch(p, -1) {
				n++
				args := strings.Fields(strings.TrimPrefix(m[1], "go run ./cmd/"))[1:]
				root := newRootCmd()
				root.InitDefaultHelpCmd()
				cmd, rest, err := root.Find(args)
				if err != nil || cmd == root {
					t.Errorf("%s: %q: no such command (%v)", filepath.Base(name), m[1], err)
					continue
				}
				for _, a := range rest {
					if f, ok := strings.CutPrefix(a, "--"); ok && cmd.Flags().Lookup(strings.SplitN(f, "=", 2)[0]) == nil {
						t.Errorf("%s: %q: %s has no flag --%s", filepath.Base(name), m[1], cmd.Name(), f)
					}
				}
			}
		}
		for _, blk := range blocks {
			blk = strings.ReplaceAll(blk, "\\\n", " ")
			for line := range strings.Lines(blk) {
				line, _, _ = strings.Cut(line, "  #")
				line = strings.TrimSpace(line)
				for _, p := range []string{"go run ./cmd/streamlimit ", "streamlimit "} {
					if rest, ok := strings.CutPrefix(line, p); ok {
						line = "streamlimit " + rest
						break
					}
				}
				if !strings.HasPrefix(line, "streamlimit ") {
					continue
				}
				line, _, _ = strings.Cut(line, " && ") // `streamlimit demo … && echo held`
				line, _, _ = strings.Cut(line, " | ")
				n++
				args := shellWords(t, line)[1:]
				root := newRootCmd()
				cmd, rest, err := root.Find(args)
				if err != nil || cmd == root {
					t.Errorf("%s: %q: no such command (%v)", filepath.Base(name), line, err)
					continue
				}
				if err := cmd.ParseFlags(rest); err != nil {
					t.Errorf("%s: %q: %v", filepath.Base(name), line, err)
					continue
				}
				if cmd.Args != nil {
					if err := cmd.Args(cmd, cmd.Flags().Args()); err != nil {
						t.Errorf("%s: %q: %v", filepath.Base(name), line, err)
					}
				}
			}
		}
	}
	if n < 20 {
		t.Fatalf("found %d streamlimit command lines in README.md and docs/, want the many they have", n)
	}
	t.Logf("%d command lines parse", n)
}

// TestREADMESubcommands keeps the README's list of the binary's parts whole: every command
// it names exists, and every command but help's, completion's and version's is named.
func TestREADMESubcommands(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, list, ok := strings.Cut(string(b), "runs every part: ")
	if !ok {
		t.Fatal(`README has no "runs every part:" list`)
	}
	list, _, _ = strings.Cut(list, "(")
	named := map[string]bool{}
	for _, m := range backticked.FindAllStringSubmatch(list, -1) {
		named[m[1]] = true
	}
	root := newRootCmd()
	for name := range named {
		if c, _, err := root.Find([]string{name}); err != nil || c == root {
			t.Errorf("README names the command %s, which streamlimit lacks", name)
		}
	}
	for _, c := range root.Commands() {
		if n := c.Name(); !named[n] && n != "help" && n != "completion" && n != "version" {
			t.Errorf("README's list of commands lacks %s", n)
		}
	}
}
