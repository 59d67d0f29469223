package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/streamlimit/streamlimit/cmd/streamlimit/internal/demo"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestDemoCommand runs `streamlimit demo --duration 10s` as the README's first command
// does, with output into a buffer (not a terminal: plain lines), and checks that its
// summary reports the abusive client held to its global limit, in the lines the README
// shows. The command runs in a testing/synctest bubble with the embedded broker's
// connections in memory, so that its verdict does not depend on the machine's load;
// TestDemoCommandOnLoopback runs it on sockets and the wall clock.
func TestDemoCommand(t *testing.T) {
	synctest.Test(t, testDemoCommand)
}

func testDemoCommand(t *testing.T) {
	var network kfake.VirtualNetwork
	cmd := newDemoCmdOn(&network)
	var buf bytes.Buffer
	cmd.SetOut(&buf)
	cmd.SetErr(&buf)
	cmd.SetArgs([]string{"--duration", "10s", "--seed", "7"})
	err := cmd.ExecuteContext(context.Background())
	out := buf.String()
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

// TestDemoCommandOnLoopback runs the README's first command as a user's machine does, the
// embedded broker on loopback sockets and everything on the wall clock: the pipeline
// starts, hits cross between the sites (the lag probes arrive), and the run ends with its
// summary and a verdict. Which verdict is TestDemoCommand's to check, on virtual time: here
// the figures move with the machine's load, so they are logged, not held to a bound.
func TestDemoCommandOnLoopback(t *testing.T) {
	testenv.RealParts(t) // real time on real sockets; the unit tier runs the command on virtual time
	stalls := testenv.StartStalls(t)
	out, err := run(t, "demo", "--duration", "6s", "--seed", "3", "--sites", "2")
	stalls.Stop()
	if err != nil && !errors.Is(err, errVerdict) {
		t.Fatalf("demo on loopback: %v\n%s", err, out)
	}
	// The lag line is printed once a probe's hit has reached every site.
	for _, want := range []string{"Summary after", "site        admitted   denied", "Pipeline lag, from a hit at one site until every site counted it", "VERDICT: "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	verdict := out[strings.LastIndex(out, "VERDICT: "):]
	t.Logf("FIGURE demo on loopback: %s; %v", strings.TrimSpace(verdict), stalls.Summary(time.Time{}, time.Time{}, 20*time.Millisecond))
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
