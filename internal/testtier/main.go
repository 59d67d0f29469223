// Command testtier runs the two test tiers of `make test` so that each test runs in
// exactly one of them and none is left out: `testtier racefree -- FLAGS...` runs the
// tests of //go:build !race files without -race; `go test -short -race -json ./...`
// piped through `testtier unit -o FILE` prints the run and writes the tests that skipped
// as real-parts (testenv.RealParts) to FILE; `testtier e2e -list FILE -- FLAGS...` runs
// exactly those without -short (the tests named by -alone last, on their own) and fails
// when one is skipped under CI=true or does not run. How the tiers work: docs/testing.md.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
)

// realPartsSkip is testenv.RealPartsSkip (a test keeps the two equal): this command is
// not a test and does not import the test helpers.
const realPartsSkip = "real-parts tier (make test-e2e)"

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ci := os.Getenv("CI") == "true"
	var err error
	switch os.Args[1] {
	case "unit":
		fs := flag.NewFlagSet("unit", flag.ExitOnError)
		out := fs.String("o", "", "file to write the real-parts tests to")
		_ = fs.Parse(os.Args[2:])
		if *out == "" {
			usage()
		}
		err = unit(os.Stdin, os.Stdout, *out, ci)
	case "e2e":
		fs := flag.NewFlagSet("e2e", flag.ExitOnError)
		list := fs.String("list", "", "file written by testtier unit")
		raceFreeList := fs.String("racefree-list", "", "file written by testtier racefree: tests to run without -race")
		alone := fs.String("alone", "", "comma-separated tests to run after the others, on their own")
		_ = fs.Parse(os.Args[2:])
		if *list == "" {
			usage()
		}
		err = e2e(*list, *raceFreeList, splitList(*alone), fs.Args(), ci)
	case "racefree":
		fs := flag.NewFlagSet("racefree", flag.ExitOnError)
		out := fs.String("o", "", "file to write the race-free real-parts tests to")
		_ = fs.Parse(os.Args[2:])
		if *out == "" {
			usage()
		}
		err = raceFree(".", *out, fs.Args(), ci)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtier:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: testtier racefree -o FILE [-- go test flags]\n       go test -json -short ... | testtier unit -o FILE\n       testtier e2e -list FILE [-racefree-list FILE] [-alone Test1,Test2] [-- go test flags]")
	os.Exit(2)
}

func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // of build-output events
	Test       string
	Output     string
}

// test identifies a top-level test.
type test struct{ pkg, name string }

// outcome is what a run of `go test -json` showed.
type outcome struct {
	failed    bool
	passed    map[test]bool
	realParts map[test]bool // skipped, or had a subtest skipped, with realPartsSkip
	// otherSkips are tests (or subtests) skipped for another reason.
	otherSkips []string
}

// follow reads `go test -json` from r and prints to w what go test prints without -v:
// package lines, the output of failed tests and anything outside a test.
func follow(r io.Reader, w io.Writer) (outcome, error) {
	o := outcome{passed: map[test]bool{}, realParts: map[test]bool{}}
	// Output of each running test (or subtest), printed if it fails.
	buf := map[string]*strings.Builder{}
	sawSkipMsg := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// go test writes some errors (a package that does not build, in older
			// versions) as plain text.
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		top, _, _ := strings.Cut(e.Test, "/")
		key := e.Package + " " + e.Test
		switch e.Action {
		case "build-output":
			fmt.Fprint(w, e.Output)
		case "build-fail":
			o.failed = true
		case "output":
			if e.Test == "" {
				// Package-level lines: "ok  pkg 1.2s", "FAIL", "PASS", panics outside a
				// test. PASS alone is noise without -v.
				if e.Output != "PASS\n" {
					fmt.Fprint(w, e.Output)
				}
				continue
			}
			b := buf[key]
			if b == nil {
				b = &strings.Builder{}
				buf[key] = b
			}
			b.WriteString(e.Output)
			if strings.Contains(e.Output, realPartsSkip) {
				sawSkipMsg[key] = true
			}
		case "fail":
			if e.Test == "" {
				// A test binary that died (a panic, a timeout, a signal) leaves the tests
				// it was running without an outcome: their output says why.
				o.failed = true
				for _, k := range slices.Sorted(maps.Keys(buf)) {
					if strings.HasPrefix(k, e.Package+" ") {
						fmt.Fprint(w, buf[k].String())
						delete(buf, k)
					}
				}
				continue
			}
			if b := buf[key]; b != nil {
				fmt.Fprint(w, b.String())
			}
			delete(buf, key)
		case "pass":
			if e.Test != "" && e.Test == top {
				o.passed[test{e.Package, top}] = true
			}
			delete(buf, key)
		case "skip":
			if e.Test == "" {
				continue // a package without tests
			}
			if sawSkipMsg[key] {
				o.realParts[test{e.Package, top}] = true
			} else {
				o.otherSkips = append(o.otherSkips, e.Package+" "+e.Test)
			}
			delete(buf, key)
		}
	}
	return o, sc.Err()
}

// unit follows the unit tier's output and writes the real-parts tests to out.
func unit(r io.Reader, w io.Writer, out string, ci bool) error {
	o, err := follow(r, w)
	if err != nil {
		return err
	}
	if err := writeList(out, slices.Collect(maps.Keys(o.realParts))); err != nil {
		return err
	}
	fmt.Fprintf(w, "testtier: %d tests left to the real-parts tier, listed in %s\n", len(o.realParts), out)
	var errs []error
	if o.failed {
		errs = append(errs, errors.New("unit tier failed"))
	}
	if len(o.otherSkips) > 0 {
		msg := fmt.Sprintf("skipped in the unit tier for another reason than %q (so run in no tier):\n  %s",
			realPartsSkip, strings.Join(o.otherSkips, "\n  "))
		if ci {
			errs = append(errs, errors.New(msg))
		} else {
			fmt.Fprintln(w, "testtier: warning:", msg)
		}
	}
	return errors.Join(errs...)
}

// writeList writes tests to path, one "package test" a line, sorted; readList reads it.
func writeList(path string, tests []test) error {
	lines := make([]string, 0, len(tests))
	for _, t := range tests {
		lines = append(lines, t.pkg+" "+t.name)
	}
	slices.Sort(lines)
	return os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

// readList reads the file unit wrote.
func readList(path string) ([]test, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s does not exist: `make test-unit` lists the tests of the real-parts tier there", path)
	}
	if err != nil {
		return nil, err
	}
	var out []test
	for l := range strings.Lines(string(b)) {
		pkg, name, ok := strings.Cut(strings.TrimSpace(l), " ")
		if ok {
			out = append(out, test{pkg, name})
		}
	}
	return out, nil
}

// runArgs returns the go test arguments running tests, skipping the named ones: one
// -run pattern of their names over their packages. A unit test of another listed package
// with the same name as a listed test runs too, which costs time but hides nothing.
func runArgs(tests []test, skip []string) []string {
	var names, pkgs []string
	for _, t := range tests {
		if !slices.Contains(names, t.name) {
			names = append(names, t.name)
		}
		if !slices.Contains(pkgs, t.pkg) {
			pkgs = append(pkgs, t.pkg)
		}
	}
	quote := func(ns []string) string {
		q := make([]string, len(ns))
		for i, n := range ns {
			q[i] = regexp.QuoteMeta(n)
		}
		return "^(" + strings.Join(q, "|") + ")$"
	}
	args := []string{"-run", quote(names)}
	if len(skip) > 0 {
		args = append(args, "-skip", quote(skip))
	}
	return append(args, pkgs...)
}

// e2e runs the listed tests, those named in alone last and on their own, and checks that
// every one of them ran and passed.
func e2e(list, raceFreeList string, alone []string, flags []string, ci bool) error {
	tests, err := readList(list)
	if err != nil {
		return err
	}
	if len(tests) == 0 {
		return fmt.Errorf("%s lists no test: the unit tier skipped nothing as real-parts", list)
	}
	var raceFree []test
	if raceFreeList != "" {
		if raceFree, err = readList(raceFreeList); err != nil {
			return err
		}
	}
	var first, last []test
	for _, t := range tests {
		if slices.Contains(alone, t.name) {
			last = append(last, t)
		} else {
			first = append(first, t)
		}
	}
	noRace := slices.DeleteFunc(slices.Clone(flags), func(f string) bool { return f == "-race" })
	fmt.Printf("testtier: running %d real-parts tests (%d of them without -race, %d on their own, last)\n",
		len(tests)+len(raceFree), len(raceFree), len(last))
	var o outcome
	o.passed, o.realParts = map[test]bool{}, map[test]bool{}
	for _, group := range []struct {
		tests []test
		skip  []string
		flags []string
	}{{first, alone, flags}, {raceFree, nil, noRace}, {last, nil, flags}} {
		if len(group.tests) == 0 {
			continue
		}
		args := append(append([]string{"test", "-json"}, group.flags...), runArgs(group.tests, group.skip)...)
		g, err := goTest(args)
		if err != nil {
			return err
		}
		o.failed = o.failed || g.failed
		for t := range g.passed {
			o.passed[t] = true
		}
		o.otherSkips = append(o.otherSkips, g.otherSkips...)
		for t := range g.realParts {
			o.otherSkips = append(o.otherSkips, t.pkg+" "+t.name+" (real-parts skip without -short?)")
		}
	}
	tests = append(tests, raceFree...)
	return checkRan("e2e tier", tests, o, ci)
}

// checkRan checks the outcome of a run of tests: none failed, every one ran and passed,
// and none was skipped (a failure under CI=true, a warning otherwise).
func checkRan(what string, tests []test, o outcome, ci bool) error {
	var errs []error
	if o.failed {
		errs = append(errs, errors.New(what+" failed"))
	}
	var missing []string
	for _, t := range tests {
		if !o.passed[t] {
			missing = append(missing, t.pkg+" "+t.name)
		}
	}
	if len(missing) > 0 && !o.failed {
		errs = append(errs, fmt.Errorf("listed but not run and passed:\n  %s", strings.Join(missing, "\n  ")))
	}
	if len(o.otherSkips) > 0 {
		msg := "skipped in the " + what + " (a tool or service is missing):\n  " + strings.Join(o.otherSkips, "\n  ")
		if ci {
			errs = append(errs, errors.New(msg))
		} else {
			fmt.Println("testtier: warning:", msg)
		}
	}
	return errors.Join(errs...)
}

// goTest runs the go command with args and follows its -json output.
func goTest(args []string) (outcome, error) {
	goTool := os.Getenv("GO")
	if goTool == "" {
		goTool = "go"
	}
	cmd := exec.Command(goTool, args...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return outcome{}, err
	}
	fmt.Println("testtier:", goTool, strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		return outcome{}, err
	}
	o, ferr := follow(stdout, os.Stdout)
	werr := cmd.Wait()
	if ferr != nil {
		return o, ferr
	}
	var exit *exec.ExitError
	if werr != nil && !errors.As(werr, &exit) {
		return o, werr
	}
	if werr != nil {
		o.failed = true
	}
	return o, nil
}
