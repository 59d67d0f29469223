package main

import (
	"bufio"
	"errors"
	"fmt"
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// raceFreeTests returns the top-level tests of the module at root that compile only
// without -race: those of every _test.go file whose build constraint holds without the
// race tag and not with it (//go:build !race). The race pass of the unit tier cannot run
// them, so its first pass runs exactly these, and nothing else, without -race.
//
// Two kinds of test belong there: allocation counts (under -race, sync.Pool drops items
// on purpose and every count is off) and the simulator's runs, one goroutine computing at
// scale, where -race can find nothing and costs ten times the time.
func raceFreeTests(root string) ([]test, error) {
	module, err := modulePath(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, err
	}
	var out []test
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			// The go command ignores these directories, and testdata holds no package.
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, "_test.go") || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("testtier: %w", err)
		}
		if !raceFreeFile(f) {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		pkg := path.Join(module, filepath.ToSlash(rel))
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && isTest(fn) {
				out = append(out, test{pkg, fn.Name.Name})
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b test) int {
		return strings.Compare(a.pkg+" "+a.name, b.pkg+" "+b.name)
	})
	return out, nil
}

// raceFreeFile reports whether f's //go:build line holds on this platform without the
// race tag and fails with it.
func raceFreeFile(f *ast.File) bool {
	for _, g := range f.Comments {
		if g.Pos() >= f.Package {
			break
		}
		for _, c := range g.List {
			if !constraint.IsGoBuild(c.Text) {
				continue
			}
			expr, err := constraint.Parse(c.Text)
			if err != nil {
				return false // the go command rejects the file; go vet says why
			}
			with := func(race bool) bool {
				return expr.Eval(func(tag string) bool {
					switch tag {
					case "race":
						return race
					case runtime.GOOS, runtime.GOARCH, "unix", "gc":
						return true
					}
					return false
				})
			}
			return with(false) && !with(true)
		}
	}
	return false
}

// isTest reports whether fn is a top-level test the go command runs: TestXxx(t *testing.T).
func isTest(fn *ast.FuncDecl) bool {
	name := fn.Name.Name
	if fn.Recv != nil || !strings.HasPrefix(name, "Test") || fn.Type.Params.NumFields() != 1 {
		return false
	}
	rest := strings.TrimPrefix(name, "Test")
	return rest == "" || !(rest[0] >= 'a' && rest[0] <= 'z')
}

// modulePath reads the module line of a go.mod file.
func modulePath(gomod string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", fmt.Errorf("testtier: run from the module's root: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(m), `"`), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("testtier: go.mod has no module line")
}

// raceFree runs the race-free tests with go test (flags first; they must not include
// -race) and checks that every one of them ran and passed, but those that skipped as
// real-parts under -short: it writes those to out, for the real-parts tier to run without
// -race (e2e's -racefree-list).
func raceFree(root, out string, flags []string, ci bool) error {
	if slices.Contains(flags, "-race") {
		return errors.New("racefree: the race-free pass runs without -race")
	}
	tests, err := raceFreeTests(root)
	if err != nil {
		return err
	}
	if len(tests) == 0 {
		return errors.New("racefree: no test file is //go:build !race")
	}
	fmt.Printf("testtier: running %d race-free tests (//go:build !race) without -race\n", len(tests))
	args := append(append([]string{"test", "-json"}, flags...), runArgs(tests, nil)...)
	o, err := goTest(args)
	if err != nil {
		return err
	}
	var ran, realParts []test
	for _, t := range tests {
		if o.realParts[t] {
			realParts = append(realParts, t)
		} else {
			ran = append(ran, t)
		}
	}
	if err := writeList(out, realParts); err != nil {
		return err
	}
	fmt.Printf("testtier: %d race-free tests left to the real-parts tier, listed in %s\n", len(realParts), out)
	return checkRan("race-free pass", ran, o, ci)
}
