package sim

import (
	"context"
	"reflect"
	"strings"
	"testing"
)

// Runs are deterministic: the same configuration gives the same result on one goroutine
// and on two (under -race: the parallel runs share nothing), and the table reports each
// target.
func TestDCScenariosDeterministicAndReported(t *testing.T) {
	ctx := context.Background()
	c := DCConfig{Scenario: DCMigrating, Clients: 30, Windows: 2, Seed: 7}
	a, err := RunDCScenarios(ctx, c, []DCScenario{DCMigrating, DCBursty}, 2)
	if err != nil {
		t.Fatal(err)
	}
	b, err := RunDCScenarios(ctx, c, []DCScenario{DCMigrating, DCBursty}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two runs differ:\n%+v\n%+v", a, b)
	}
	var out strings.Builder
	if err := WriteDCTable(&out, a, DefaultDCTargets()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| migrating | 30 |", "| bursty | 1 |", "- migrating: max/limit ≤ 1.02: ", "- bursty: admitted/oracle ≥ 0.98: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := RunDC(ctx, DCConfig{Scenario: "nope"}); err == nil {
		t.Fatal("unknown scenario accepted")
	}
}
