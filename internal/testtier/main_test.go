package main

import (
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

func TestSkipMessageIsTestenvs(t *testing.T) {
	if realPartsSkip != testenv.RealPartsSkip {
		t.Fatalf("realPartsSkip %q, testenv.RealPartsSkip %q", realPartsSkip, testenv.RealPartsSkip)
	}
}

// A -short run as go test -json reports it: a unit test that passes, one that fails, a
// real-parts test, a test with a real-parts subtest, and one skipped for another reason.
const unitRun = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestUnit"}
{"Action":"output","Package":"p","Test":"TestUnit","Output":"=== RUN   TestUnit\n"}
{"Action":"output","Package":"p","Test":"TestUnit","Output":"    x_test.go:1: quiet\n"}
{"Action":"pass","Package":"p","Test":"TestUnit"}
{"Action":"run","Package":"p","Test":"TestBroken"}
{"Action":"output","Package":"p","Test":"TestBroken","Output":"    x_test.go:2: loud\n"}
{"Action":"output","Package":"p","Test":"TestBroken","Output":"--- FAIL: TestBroken (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestBroken"}
{"Action":"run","Package":"p","Test":"TestKafka"}
{"Action":"output","Package":"p","Test":"TestKafka","Output":"    testenv.go:9: real-parts tier (make test-e2e)\n"}
{"Action":"skip","Package":"p","Test":"TestKafka"}
{"Action":"run","Package":"q","Test":"TestMixed/bash"}
{"Action":"output","Package":"q","Test":"TestMixed/bash","Output":"    tier.go:9: real-parts tier (make test-e2e)\n"}
{"Action":"skip","Package":"q","Test":"TestMixed/bash"}
{"Action":"pass","Package":"q","Test":"TestMixed"}
{"Action":"output","Package":"q","Test":"TestOther","Output":"    x_test.go:3: no tool\n"}
{"Action":"skip","Package":"q","Test":"TestOther"}
{"Action":"output","Package":"p","Output":"FAIL\n"}
{"Action":"fail","Package":"p"}
{"Action":"run","Package":"q","Test":"TestHangs"}
{"Action":"output","Package":"q","Test":"TestHangs","Output":"goroutine 7 [chan receive]:\n"}
{"Action":"output","Package":"q","Test":"TestHangs","Output":"exit status 2\n"}
{"Action":"output","Package":"r","Output":"FAIL\tr\t9.9s\n"}
{"Action":"fail","Package":"r"}
{"Action":"output","Package":"q","Output":"FAIL\tq\t153.7s\n"}
{"Action":"fail","Package":"q"}
{"Action":"pass","Package":"q"}
`

func TestUnit(t *testing.T) {
	out := filepath.Join(t.TempDir(), "list")
	var w strings.Builder
	err := unit(strings.NewReader(unitRun), &w, out, true)
	if err == nil || !strings.Contains(err.Error(), "unit tier failed") || !strings.Contains(err.Error(), "q TestOther") {
		t.Errorf("error %v: want the failure and, under CI, the other skip", err)
	}
	printed := w.String()
	for _, want := range []string{"loud", "--- FAIL: TestBroken", "FAIL\n", "goroutine 7 [chan receive]", "FAIL\tq\t153.7s"} {
		if !strings.Contains(printed, want) {
			t.Errorf("output lacks %q:\n%s", want, printed)
		}
	}
	if strings.Contains(printed, "quiet") || strings.Contains(printed, "=== RUN") {
		t.Errorf("output shows a passing test's log:\n%s", printed)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "p TestKafka\nq TestMixed\n"; got != want {
		t.Errorf("list %q, want %q", got, want)
	}
	tests, err := readList(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := []test{{"p", "TestKafka"}, {"q", "TestMixed"}}; !reflect.DeepEqual(tests, want) {
		t.Errorf("readList: %v, want %v", tests, want)
	}
}

func TestRunArgs(t *testing.T) {
	got := runArgs([]test{{"p", "TestA"}, {"q", "TestA"}, {"q", "TestB.x"}}, []string{"TestWAN"})
	want := []string{"-run", `^(TestA|TestB\.x)$`, "-skip", `^(TestWAN)$`, "p", "q"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("runArgs = %q, want %q", got, want)
	}
}

// The race-free pass finds exactly the tests of files that compile without -race and not
// with it, in the package of their directory, and nothing in testdata or hidden folders.
func TestRaceFreeTests(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"go.mod":                  "module example.com/m\n\ngo 1.26\n",
		"a/alloc_test.go":         "//go:build !race\n\npackage a\n\nimport \"testing\"\n\nfunc TestAllocs(t *testing.T) {}\nfunc helper(t *testing.T) {}\nfunc Testlower(t *testing.T) {}\n",
		"a/plain_test.go":         "package a\n\nimport \"testing\"\n\nfunc TestPlain(t *testing.T) {}\n",
		"a/race_test.go":          "//go:build race\n\npackage a\n\nimport \"testing\"\n\nfunc TestOnlyRace(t *testing.T) {}\n",
		"a/b/sim_test.go":         "// A comment first.\n\n//go:build !race && (linux || darwin || windows || " + runtime.GOOS + ")\n\npackage b_test\n\nimport \"testing\"\n\nfunc TestSim(t *testing.T) {}\n",
		"a/other_test.go":         "//go:build ignore\n\npackage a\n\nimport \"testing\"\n\nfunc TestIgnored(t *testing.T) {}\n",
		"a/testdata/x_test.go":    "//go:build !race\n\npackage x\n\nimport \"testing\"\n\nfunc TestData(t *testing.T) {}\n",
		"a/.hidden/h_test.go":     "//go:build !race\n\npackage h\n\nimport \"testing\"\n\nfunc TestHidden(t *testing.T) {}\n",
		"a/comment_after_test.go": "package a\n\n//go:build !race\n\nimport \"testing\"\n\nfunc TestLateLine(t *testing.T) {}\n",
	}
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := raceFreeTests(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []test{{"example.com/m/a", "TestAllocs"}, {"example.com/m/a/b", "TestSim"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// The module's own race-free tests include the allocation counts and the simulator's runs
// (a tag lost from their files would move them back into the -race pass, ten times slower).
func TestModuleRaceFreeTests(t *testing.T) {
	got, err := raceFreeTests("../..")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tt := range got {
		names[tt.name] = true
	}
	for _, want := range []string{"TestNoAllocation", "TestDCSimulationManySitesAndChurn", "TestSimAccuracy", "TestSimDCCommand"} {
		if !names[want] {
			t.Errorf("%s is not race-free; found %v", want, got)
		}
	}
}
