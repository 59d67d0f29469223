package enforcer

import (
	"slices"
	"testing"

	"github.com/streamlimit/streamlimit/internal/apisurface"
)

// TestExportedNames holds the package's exported surface (names, and methods of exported
// types) to this list, at most 31 names: the package is the Engine and what a caller passes
// to it or gets back (31 since Tuning, the settings every layer above embeds). A new
// exported name is a choice made here, with the package documentation, not a side effect;
// a plug point or a helper belongs in a package of its own (as sitecount does) or
// unexported.
func TestExportedNames(t *testing.T) {
	want := []string{
		"Code", "Code.String", "CodeOK", "CodeOverLimit", "CodeUnknown",
		"Config", "Defaults", "Denial", "ErrQueueFull",
		"Engine", "Engine.Await", "Engine.Config", "Engine.Decide", "Engine.DecideAt",
		"Engine.DecideInto", "Engine.RecentDenials", "Engine.Reporter", "Engine.Sites",
		"New", "Override", "Publisher", "Quota", "Reporter", "Reporter.Report",
		"Request", "Result", "SiteStatus", "SiteStore", "Status", "Status.Soft", "Tuning",
	}
	got, err := apisurface.Exported(".")
	if err != nil {
		t.Fatal(err)
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
