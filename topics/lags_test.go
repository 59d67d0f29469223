package topics

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestLagReportRoundTrip(t *testing.T) {
	r := LagReport{Instance: "agg-eu-1", AsOf: 1763740000123, Local: map[string]int64{"eu-1": 7, "eu-2": -3}, Remote: map[string]int64{"us-1": 912}}
	v, err := r.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeLagReport(v)
	if err != nil || !reflect.DeepEqual(got, r) {
		t.Fatalf("DecodeLagReport(%s) = %+v, %v; want %+v", v, got, err, r)
	}
	// A field this version does not know is ignored, so that a later one may add some.
	if _, err := DecodeLagReport([]byte(`{"instance":"a","asof":1,"later":{"x":1}}`)); err != nil {
		t.Fatalf("a report with a field added later: %v", err)
	}
	if !IsLagReport([]byte(LagReportKey)) || IsLagReport([]byte(SiteHeartbeatKey)) {
		t.Fatal("IsLagReport does not tell the lag report's key")
	}
}

// Every field is checked: a report carries dates of every site an aggregator hears, and a
// bad one is refused whole by reason, like any bad record.
func TestLagReportRefused(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  error
	}{
		{`{"instance":"a","asof":0}`, ErrBadTime},
		{`{"instance":"a","asof":1,"local":{"":1}}`, ErrEmptySite},
		{`{"instance":"a","asof":1,"remote":{"` + strings.Repeat("s", MaxSiteLen+1) + `":1}}`, ErrSiteTooLong},
		{`{"instance":"a","asof":1,"local":{"eu":1.5}}`, ErrBadJSON},
		{`[1]`, ErrUnknownVersion},
	} {
		if _, err := DecodeLagReport([]byte(tc.value)); !errors.Is(err, tc.want) {
			t.Errorf("DecodeLagReport(%.60s) = %v, want %v", tc.value, err, tc.want)
		}
	}
}
