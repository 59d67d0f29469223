package history

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// Format is an export format.
type Format string

// The export formats.
const (
	// CSV has a header line and one line per row: start (RFC 3339, UTC), key, window_ms,
	// site, admitted, denied.
	CSV Format = "csv"
	// JSONLines has one JSON object per row:
	// {"start":"…","ts":…,"key":"…","w":…,"site":"…","n":…,"d":…}, with the field names of
	// the hit record's JSON form.
	JSONLines Format = "jsonl"
)

// ErrNoParquet is returned by ParseFormat for "parquet": no Parquet library is among the
// project's dependencies, and one is not worth adding for an export that converts
// losslessly from CSV with any data tool.
var ErrNoParquet = errors.New("parquet is not built in: export csv or jsonl and convert (the columns are typed: string key and site, integer times and counts)")

// ParseFormat returns the format named s: "csv", "jsonl" (or "json").
func ParseFormat(s string) (Format, error) {
	switch s {
	case "csv":
		return CSV, nil
	case "jsonl", "json":
		return JSONLines, nil
	case "parquet":
		return "", ErrNoParquet
	}
	return "", fmt.Errorf("unknown format %q (want csv or jsonl)", s)
}

// CSVHeader is the first line of a CSV export.
var CSVHeader = []string{"start", "key", "window_ms", "site", "admitted", "denied"}

// Write writes rows to w in format f.
func Write(w io.Writer, f Format, rows []Row) error {
	switch f {
	case CSV:
		return writeCSV(w, rows)
	case JSONLines:
		return writeJSONLines(w, rows)
	}
	return fmt.Errorf("history: unknown format %q", f)
}

func writeCSV(w io.Writer, rows []Row) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	rec := make([]string, len(CSVHeader))
	for _, r := range rows {
		rec[0] = r.StartTime().Format(time.RFC3339Nano)
		rec[1] = r.Key
		rec[2] = strconv.FormatInt(r.Window, 10)
		rec[3] = r.Site
		rec[4] = strconv.FormatInt(r.Admitted, 10)
		rec[5] = strconv.FormatInt(r.Denied, 10)
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// jsonRow is a row's JSON form.
type jsonRow struct {
	Start  string `json:"start"`
	TS     int64  `json:"ts"`
	Key    string `json:"key"`
	Window int64  `json:"w"`
	Site   string `json:"site"`
	N      int64  `json:"n"`
	D      int64  `json:"d"`
}

func writeJSONLines(w io.Writer, rows []Row) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for _, r := range rows {
		if err := enc.Encode(jsonRow{Start: r.StartTime().Format(time.RFC3339Nano), TS: r.Start, Key: r.Key,
			Window: r.Window, Site: r.Site, N: r.Admitted, D: r.Denied}); err != nil {
			return err
		}
	}
	return bw.Flush()
}
