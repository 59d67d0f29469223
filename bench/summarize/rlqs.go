package main

import (
	"fmt"
	"io"
	"strings"
)

// rlqsRows returns the results of bench/rlqs.sh.
func rlqsRows(r *run) []*result {
	var rows []*result
	for _, res := range r.results {
		if res.pkg == "bench/rlqs" && strings.HasPrefix(res.name, "BenchmarkRLQS/") {
			rows = append(rows, res)
		}
	}
	return rows
}

// writeRLQSTarget writes the Targets row of the RLQS serving benchmark: the reports of
// 10 000 streams × 100 buckets every second served on one core.
func writeRLQSTarget(w io.Writer, r *run, verdict func(ok, met bool) string) {
	res := r.find("bench/rlqs", "BenchmarkRLQS/streams=10000/buckets=100/server=streamlimit")
	if res == nil {
		fmt.Fprintf(w, "| RLQS: 10 000 streams × 100 buckets every second served on one core (served ÷ offered) | ≥ 0.99 | – | not measured |\n")
		return
	}
	got, _ := res.median("reports/s")
	off, _ := res.median("offered-reports/s")
	cpu, _ := res.median("server-cpu-µs/report")
	ratio := 0.0
	if off > 0 {
		ratio = got / off
	}
	fmt.Fprintf(w, "| RLQS: 10 000 streams × 100 buckets every second served on one core (served ÷ offered) | ≥ 0.99 | %.2f (%s of %s reports/s; %s µs of CPU per report) | %s |\n",
		ratio, num(got), num(off), num(cpu), verdict(off > 0, ratio >= 0.99))
}

// writeRLQS writes the table of bench/rlqs.sh.
func writeRLQS(w io.Writer, r *run) {
	rows := rlqsRows(r)
	if len(rows) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("## RLQS serving\n\n")
	p("%s. bench/rlqs.sh: `streamlimit enforcer --no-kafka --rlqs-addr` pinned to core 0 (GOMAXPROCS 1), bench/cmd/rlqsload "+
		"pinned to core 1: each stream an Envoy reporting the usage of its buckets every second (one message per stream, phases spread "+
		"evenly). *Served* is the bucket reports the server handled per second (streamlimit_rlqs_bucket_reports_total), *CPU per report* "+
		"the server process's user + system time over them, so 1 / CPU per report is what one core can serve. Medians over the rounds, "+
		"spread (min–max) in brackets.\n\n", r.metaValue("rlqs"))
	p("| Streams × buckets | Server | offered reports/s | served reports/s | served ÷ offered | server CPU µs/report | one core's capacity, reports/s | server cores | RSS MiB |\n")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range rows {
		parts := map[string]string{}
		for _, kv := range strings.Split(strings.TrimPrefix(res.name, "BenchmarkRLQS/"), "/") {
			k, v, _ := strings.Cut(kv, "=")
			parts[k] = v
		}
		got, _ := res.median("reports/s")
		off, _ := res.median("offered-reports/s")
		cpu, _ := res.median("server-cpu-µs/report")
		ratio, capacity := "", ""
		if off > 0 {
			ratio = fmt.Sprintf("**%.2f**", got/off)
		}
		if cpu > 0 {
			capacity = num(1e6 / cpu)
		}
		p("| %s × %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", parts["streams"], parts["buckets"], parts["server"],
			res.cell("offered-reports/s"), res.cell("reports/s"), ratio, res.cell("server-cpu-µs/report"), capacity, res.cell("server-cores"), res.cell("server-rss-MiB"))
	}
	p("\nA server that falls behind (served ÷ offered below 1) is read with care: the reports it has not read wait in gRPC's " +
		"buffers and its heap grows, so its CPU per report is no longer the cost of a report, and the capacity column is then a " +
		"floor. The in-process cost of a report, without gRPC, is `serve/rlqs BenchmarkHandle` (cpu-ns/bucket); " +
		"[rlqs.md](rlqs.md#serving-cost) reads these figures.\n\n")
}
