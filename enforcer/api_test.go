package enforcer

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestExportedNames holds the package's exported surface (names, and methods of exported
// types) to this list, at most 31 names: the package is the Limiter and what a caller
// passes to it or gets back (31 since Tuning, the settings every layer above embeds). A new exported name is a choice made here, with the package
// documentation, not a side effect; a plug point or a helper belongs in a package of its
// own (as sitecount does) or unexported.
func TestExportedNames(t *testing.T) {
	want := []string{
		"Code", "Code.String", "CodeOK", "CodeOverLimit", "CodeUnknown",
		"Config", "Defaults", "Denial", "ErrQueueFull",
		"Limiter", "Limiter.Await", "Limiter.Config", "Limiter.Decide", "Limiter.DecideAt",
		"Limiter.DecideInto", "Limiter.RecentDenials", "Limiter.Reporter", "Limiter.Sites",
		"New", "Override", "Publisher", "Quota", "Reporter", "Reporter.Report",
		"Request", "Result", "SiteStatus", "SiteStore", "Status", "Status.Soft", "Tuning",
	}
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				name := d.Name.Name
				if d.Recv != nil {
					typ := d.Recv.List[0].Type
					if star, ok := typ.(*ast.StarExpr); ok {
						typ = star.X
					}
					id := typ.(*ast.Ident)
					if !id.IsExported() {
						continue
					}
					name = id.Name + "." + name
				}
				got = append(got, name)
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch spec := spec.(type) {
					case *ast.TypeSpec:
						if spec.Name.IsExported() {
							got = append(got, spec.Name.Name)
						}
					case *ast.ValueSpec:
						for _, n := range spec.Names {
							if n.IsExported() {
								got = append(got, n.Name)
							}
						}
					}
				}
			}
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("exported names:\n got %d %v\nwant %d %v", len(got), got, len(want), want)
	}
	if len(want) > 31 {
		t.Errorf("%d exported names, the bound is 31", len(want))
	}
}
