// Package apisurface lists a package's exported surface, for the tests that pin it: a new
// exported name is then a choice made in that test, with the package's documentation, not a
// side effect.
package apisurface

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Exported returns, sorted, the exported names declared by the non-test Go files of dir:
// types, functions, constants, variables, and methods of exported types as "Type.Method".
func Exported(dir string) ([]string, error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var got []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		Each(f.Decls, false, func(parts ...string) {
			for _, p := range parts {
				if !ast.IsExported(p) {
					return
				}
			}
			got = append(got, strings.Join(parts, "."))
		})
	}
	slices.Sort(got)
	return got, nil
}

// Each calls f with every name decls declare, exported or not: each top-level name alone,
// each method with its receiver's type name first, and, with members, each struct field
// and interface method (embedded ones by their type's name) with its type's name first.
func Each(decls []ast.Decl, members bool, f func(parts ...string)) {
	for _, decl := range decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				f(d.Name.Name)
			} else if len(d.Recv.List) == 1 {
				if recv := typeName(d.Recv.List[0].Type); recv != "" {
					f(recv, d.Name.Name)
				}
			}
		case *ast.GenDecl:
			for _, sp := range d.Specs {
				switch sp := sp.(type) {
				case *ast.ValueSpec:
					for _, n := range sp.Names {
						f(n.Name)
					}
				case *ast.TypeSpec:
					f(sp.Name.Name)
					if members {
						eachMember(sp.Type, func(m string) { f(sp.Name.Name, m) })
					}
				}
			}
		}
	}
}

// typeName returns the name of the type e refers to (through pointers and type
// arguments), or "".
func typeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return typeName(e.X)
	case *ast.Ident:
		return e.Name
	case *ast.IndexExpr:
		return typeName(e.X)
	case *ast.IndexListExpr:
		return typeName(e.X)
	}
	return ""
}

// eachMember calls f with each field and method name of a struct or interface type.
func eachMember(e ast.Expr, f func(string)) {
	var list *ast.FieldList
	switch e := e.(type) {
	case *ast.StructType:
		list = e.Fields
	case *ast.InterfaceType:
		list = e.Methods
	default:
		return
	}
	for _, fld := range list.List {
		for _, n := range fld.Names {
			f(n.Name)
		}
		if len(fld.Names) == 0 { // embedded
			if n := typeName(fld.Type); n != "" {
				f(n)
			} else if sel, ok := fld.Type.(*ast.SelectorExpr); ok {
				f(sel.Sel.Name)
			} else if st, ok := fld.Type.(*ast.StarExpr); ok {
				if sel, ok := st.X.(*ast.SelectorExpr); ok {
					f(sel.Sel.Name)
				}
			}
		}
	}
}
