package topics

import "bytes"

// LagReportKey is the record key of an aggregator's lag report (LagReport), which each
// aggregator writes to the partitions it owns of its own data center's hits topic, so that
// replication carries it to the other data centers' aggregators like the hits themselves.
const LagReportKey = ReservedPrefix + "lags"

// MaxLagReportSites bounds the sites of each map of a LagReport.
const MaxLagReportSites = 4096

// LagReport is what an aggregator measured of the sites it hears: for each site, the
// lowest lag (its arrival time by the aggregator's clock minus its date by the site's
// clock, in milliseconds) of that site's records (site heartbeats and leaves) over a recent
// span. The lowest lag is the least delay plus the offset between the two clocks; the
// aggregators of two data centers compare what each measured of the other's sites to tell
// the offset from the delay, assuming the least delay is the same both ways
// (docs/aggregator.md, "Clock offsets").
type LagReport struct {
	// Instance names the aggregator instance that wrote it.
	Instance string `json:"instance"`
	// AsOf is the aggregator's clock when it wrote the report, in unix milliseconds.
	AsOf int64 `json:"asof"`
	// Local holds the lowest lags of the sites of the aggregator's own data center (read
	// from its local hits topic), Remote those of the other data centers' sites.
	Local  map[string]int64 `json:"local,omitempty"`
	Remote map[string]int64 `json:"remote,omitempty"`
}

// IsLagReport reports whether a hits-topic record key is a lag report's.
func IsLagReport(key []byte) bool { return bytes.Equal(key, []byte(LagReportKey)) }

// MarshalBinary encodes r for a hits topic (JSON: reports are few, and readable with any
// consumer).
func (r LagReport) MarshalBinary() ([]byte, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	return jsonMarshal(r)
}

// DecodeLagReport decodes a lag report's value.
func DecodeLagReport(b []byte) (LagReport, error) {
	var r LagReport
	if len(b) == 0 || b[0] != jsonStart {
		return r, errorf(ErrUnknownVersion, "lag report is not a JSON object")
	}
	if err := decodeJSONStrict(b, &r); err != nil {
		return LagReport{}, err
	}
	if err := r.validate(); err != nil {
		return LagReport{}, err
	}
	return r, nil
}

func (r LagReport) validate() error {
	if r.AsOf <= 0 {
		return errorf(ErrBadTime, "lag report without asof")
	}
	for _, m := range []map[string]int64{r.Local, r.Remote} {
		if len(m) > MaxLagReportSites {
			return errorf(ErrBadSites, "%d sites in a lag report, at most %d", len(m), MaxLagReportSites)
		}
		for site := range m {
			if site == "" {
				return errorf(ErrEmptySite, "in a lag report")
			}
			if len(site) > MaxSiteLen {
				return errorf(ErrSiteTooLong, "%d bytes in a lag report, at most %d", len(site), MaxSiteLen)
			}
		}
	}
	return nil
}
