package main

import (
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit/cmd/streamlimit/internal/demo"
)

// TestDemoCommand runs `streamlimit demo --duration 10s` as the README's first command
// does, with output into a buffer (not a terminal: plain lines), and checks that its
// summary reports the abusive client held to its global limit, in the lines the README
// shows.
func TestDemoCommand(t *testing.T) {
	out, err := run(t, "demo", "--duration", "10s", "--seed", "7")
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	t.Logf("output:\n%s", out)
	for _, want := range []string{
		"mallory sent 5× its limit",
		"Light clients were never denied",
		"VERDICT: the global limit HELD",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(out, "\x1b[") {
		t.Errorf("output into a buffer contains ANSI escape sequences")
	}
	// The README shows a run's summary: each of its lines is one of this run's, but for
	// the figures.
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, shown, ok := strings.Cut(string(readme), "```\nmallory sent 5×")
	if !ok {
		t.Fatal("README shows no demo summary")
	}
	shown, _, _ = strings.Cut("mallory sent 5×"+shown, "```")
	figures := regexp.MustCompile(`[0-9]+(\.[0-9]+)?`)
	shape := func(l string) string { return strings.Join(strings.Fields(figures.ReplaceAllString(l, "N")), " ") }
	var ran []string
	for l := range strings.Lines(out) {
		ran = append(ran, shape(l))
	}
	for l := range strings.Lines(shown) {
		if !slices.Contains(ran, shape(l)) {
			t.Errorf("README's demo line %q is not in the demo's output", strings.TrimSpace(l))
		}
	}
}

func TestDemoRulesAndBadFlags(t *testing.T) {
	out, err := run(t, "demo", "--print-rules")
	if err != nil || !strings.Contains(out, "domain: demo") || !strings.Contains(out, "requests_per_unit: 50") {
		t.Fatalf("demo --print-rules: %v\n%s", err, out)
	}
	if _, err := run(t, "demo", "--duration", "3s"); err == nil || !strings.Contains(err.Error(), "must exceed the limit's window") {
		t.Fatalf("demo --duration 3s: %v", err)
	}
	if _, err := run(t, "demo", "--sites", "9"); err == nil || !strings.Contains(err.Error(), "sites 9") {
		t.Fatalf("demo --sites 9: %v", err)
	}
}

// TestDemoVerdictExitStatus checks that the demo command's error (its exit status) follows
// the verdict: a limit that did not hold fails, a held one or an interrupted run does not.
func TestDemoVerdictExitStatus(t *testing.T) {
	failed := demo.Summary{Verdict: "the global limit did NOT hold: mallory got up to 80 per 5s"}
	err := verdictError(failed)
	if !errors.Is(err, errVerdict) || !strings.Contains(err.Error(), "did NOT hold") {
		t.Errorf("failed verdict: error %v, want errVerdict quoting the verdict", err)
	}
	if err := verdictError(demo.Summary{Held: true}); err != nil {
		t.Errorf("held verdict: error %v, want nil", err)
	}
	if err := verdictError(demo.Summary{Interrupted: true}); err != nil {
		t.Errorf("interrupted run: error %v, want nil", err)
	}
	if err := verdictError(demo.Summary{Verdict: "NOT MEASURED"}); !errors.Is(err, errVerdict) {
		t.Errorf("unmeasured, uninterrupted run: error %v, want errVerdict", err)
	}
}
