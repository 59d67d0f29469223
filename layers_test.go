package streamlimit_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The module's layers, bottom up, as docs/architecture.md draws them: a package may import
// packages of its own layer or below, never above; and the three sides (producer,
// aggregator, enforcer) never import each other. Each package is placed by its longest
// matching prefix, and the folders are the layers: everything under enforcer/ is the
// decision core, everything that serves it is under serve/, and the root package (which
// assembles a side of each for a Go service) is imported only from serve/ and above.
var layers = []struct {
	name     string
	prefixes []string
}{
	{"foundations", []string{"clock", "topics", "topicadmin", "window", "internal"}},
	{"the three sides", []string{"producer", "aggregator", "enforcer"}},
	// The accuracy simulator runs the three sides together on a virtual clock, for the
	// command's `sim` and for the tests of the layers above.
	{"simulation", []string{"internal/sim"}},
	{"serving", []string{".", "serve"}},
	{"command", []string{"cmd"}},
	{"tools and tests", []string{"bench", "e2e", "deploy", "examples"}},
}

// place returns pkg's layer index and, for the sides, which side it is on.
func place(pkg string) (layer int, side string) {
	best := -1
	for i, l := range layers {
		for _, p := range l.prefixes {
			if pkg == p || p != "." && strings.HasPrefix(pkg, p+"/") {
				if len(p) > best {
					best, layer = len(p), i
				}
			}
		}
	}
	if best < 0 {
		return -1, ""
	}
	if layer == 1 {
		side, _, _ = strings.Cut(pkg, "/")
	}
	return layer, side
}

// TestLayers reads the imports of every Go file of the module (tests included: a test's
// import makes the same dependency) and fails on any that points up a layer or across
// the sides.
func TestLayers(t *testing.T) {
	const module = "github.com/streamlimit/streamlimit"
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "." || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		pkg := filepath.ToSlash(filepath.Dir(path))
		from, fromSide := place(pkg)
		if from < 0 {
			t.Errorf("%s: package %s is in no layer; place it in layers", path, pkg)
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p != module && !strings.HasPrefix(p, module+"/") {
				continue
			}
			target := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
			if target == "" {
				target = "."
			}
			to, toSide := place(target)
			checked++
			switch {
			case to > from:
				t.Errorf("%s (%s) imports %s (%s): up a layer", path, layers[from].name, target, layers[to].name)
			case from == 1 && to == 1 && fromSide != toSide:
				t.Errorf("%s (%s) imports %s (%s): across the sides", path, fromSide, target, toSide)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("only %d imports of the module checked: the walk missed the packages", checked)
	}
}
