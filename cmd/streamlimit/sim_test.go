//go:build !race

// The simulator's commands run the simulator, one goroutine's computation at scale: -race
// finds nothing there and makes it ten times slower, so make test runs these tests in its
// first, race-free pass (their names contain "Sim").

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `sim dc` (docs/accuracy.md's first command) prints the table and every target's verdict;
// a scenario it does not know is an error.
func TestSimDCCommand(t *testing.T) {
	out, _, err := runSplit(t, "sim", "dc", "--scenarios", "bursty,migrating", "--clients", "20", "--windows", "2")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| scenario | clients |", "| bursty | 1 |", "| migrating | 20 |", "- bursty: max/limit ≤ 1.02: "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// docs/accuracy.md's many-process run (small here): --procs makes every data center
	// that many sites.
	out, _, err = runSplit(t, "sim", "dc", "--scenarios", "mix", "--clients", "20", "--procs", "6", "--windows", "2")
	if err != nil || !strings.Contains(out, "| mix | 20 |") {
		t.Fatalf("--procs 6: %v\n%s", err, out)
	}
	// Its churn control: --no-churn runs a churn scenario without its starts and stops.
	out, _, err = runSplit(t, "sim", "dc", "--scenarios", "leave", "--clients", "20", "--windows", "2", "--no-churn")
	if err != nil || !strings.Contains(out, "| leave without churn | 20 |") {
		t.Fatalf("--no-churn: %v\n%s", err, out)
	}
	// docs/operations.md's clock runs (small here): --clock-skew spreads offsets over the
	// hosts, --clock-offsets puts a data center's processes off, and the clocks line says
	// which processes' skew meters took them out of service.
	out, _, err = runSplit(t, "sim", "dc", "--scenarios", "mix", "--clients", "20", "--windows", "2", "--clock-skew", "500ms")
	if err != nil || !strings.Contains(out, "- clocks, mix: processes -500ms to 500ms off true time") {
		t.Fatalf("--clock-skew 500ms: %v\n%s", err, out)
	}
	out, _, err = runSplit(t, "sim", "dc", "--scenarios", "mix", "--clients", "20", "--windows", "2", "--clock-offsets", "0,0,-2s")
	if err != nil || !strings.Contains(out, "unready (CheckClock): dc3 -2s") {
		t.Fatalf("--clock-offsets 0,0,-2s: %v\n%s", err, out)
	}
	if _, _, err := runSplit(t, "sim", "dc", "--scenarios", "mix", "--clock-offsets", "0,0,0,1s"); err == nil {
		t.Fatal("--clock-offsets for 4 data centers of 3 accepted")
	}
	if _, _, err := runSplit(t, "sim", "dc", "--scenarios", "mix", "--procs", "17"); err == nil {
		t.Fatal("--procs 17 accepted, want out of range")
	}
	if _, _, err := runSplit(t, "sim", "dc", "--scenarios", "nope"); err == nil || !strings.Contains(err.Error(), "unknown scenario") {
		t.Fatalf("unknown scenario: %v", err)
	}
}

// `sim dc --sweep-reserve-margin` and `--sweep-serving-span` (docs/accuracy.md, "The
// reserve rule and its margin", "The serving span") print a row per scenario and value,
// the enforcer's default marked, then the reference points, and plot them.
func TestSimDCSweepCommand(t *testing.T) {
	for _, tc := range []struct {
		flag, values string
		want         []string
	}{
		{"--sweep-reserve-margin", "--margins=-1ms,250ms", []string{"| scenario | reserve margin | max/limit |", "| migrating | none |",
			"| migrating | 250ms (default) |", "| migrating | *every served data center* |", "| migrating | *per-site split* |"}},
		{"--sweep-serving-span", "--spans=-1ms,1s", []string{"| scenario | serving span | max/limit |", "| migrating | off |",
			"| migrating | 1s (default) |", "| migrating | *per-site split* |"}},
	} {
		svg := filepath.Join(t.TempDir(), "sweep.svg")
		out, _, err := runSplit(t, "sim", "dc", tc.flag, "--scenarios", "migrating", "--clients", "20",
			"--windows", "2", tc.values, "--svg", svg)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range tc.want {
			if !strings.Contains(out, want) {
				t.Errorf("%s: output lacks %q:\n%s", tc.flag, want, out)
			}
		}
		b, err := os.ReadFile(svg)
		if err != nil || !strings.Contains(string(b), `id="sweep-migrating"`) || !strings.Contains(string(b), "exact central limiter") {
			t.Fatalf("%s --svg: %v\n%.300s", tc.flag, err, b)
		}
	}
	if _, _, err := runSplit(t, "sim", "dc", "--sweep-reserve-margin", "--sweep-serving-span"); err == nil {
		t.Error("two sweeps at once accepted")
	}
}

// `sim tiers` prints one row per third of the ramp.
func TestSimTiersCommand(t *testing.T) {
	out, _, err := runSplit(t, "sim", "tiers", "--clients", "100", "--capacity", "500")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "| offered (× capacity) |") || strings.Count(out, "\n| 0.")+strings.Count(out, "\n| 1.") != 3 {
		t.Fatalf("output:\n%s", out)
	}
}

// `sim wan` prints the multi-cluster test's table.
func TestSimWANCommand(t *testing.T) {
	out, _, err := runSplit(t, "sim", "wan", "--wan", "100ms")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "client      phase  requests") || strings.Count(out, "\n") != 22 {
		t.Fatalf("output:\n%s", out)
	}
}
