// Command keyflood measures what a flood of distinct keys, and a few very large requests,
// make an enforcer's decision structures hold: it decides -keys requests each naming a new
// user and IP on a Limiter in process, applies a count per user to the snapshot, and
// prints resident memory, Go heap and each structure's bytes after each step (-max-memory
// as `streamlimit enforcer --max-memory`; -log-hits then sends two requests of that many
// hits and twice as many to a sliding_log limit).
//
//	go run ./bench/keyflood -keys 1000000 -log-hits 10000000
//
// docs/hardening.md has the figures.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/memsize"
	"github.com/streamlimit/streamlimit/topics"
)

const rulesYAML = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 100, scope: local}
  - key: upload
    rate_limit: {unit: hour, requests_per_unit: 1000000000, scope: local, algorithm: sliding_log}
`

func main() {
	keys := flag.Int("keys", 1_000_000, "distinct users (and IPs) to flood with")
	maxKeys := flag.Int("max-keys", 1<<20, "bound on keys per structure, as the enforcer's --max-keys")
	logHits := flag.Int64("log-hits", 10_000_000, "hits of the first large sliding_log request (the second has twice as many); 0 to skip")
	memprofile := flag.String("memprofile", "", "write a heap profile here at the end")
	maxMemory := flag.Int64("max-memory", 0, "memory target in bytes, as the enforcer's --max-memory; 0: none (bound by -max-keys only)")
	flag.Parse()
	err := run(*keys, *maxKeys, *maxMemory, *logHits)
	if err == nil && *memprofile != "" {
		err = writeHeap(*memprofile)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "keyflood:", err)
		os.Exit(1)
	}
}

func run(keys, maxKeys int, maxMemory, logHits int64) error {
	rc, err := rules.Parse("rules.yaml", []byte(rulesYAML))
	if err != nil {
		return err
	}
	mem := memsize.Split(maxMemory)
	if maxMemory > 0 {
		debug.SetMemoryLimit(maxMemory)
	}
	snap, err := snapshot.NewMemory(snapshot.Config{Site: "eu", MaxKeys: maxKeys, MaxBytes: mem.Snapshot})
	if err != nil {
		return err
	}
	local := algo.New(algo.Options{MaxKeys: maxKeys, MaxBytes: mem.Local})
	counter := sitecount.NewLocal(sitecount.LocalOptions{MaxKeys: maxKeys, MaxBytes: mem.Counter})
	lim, err := enforcer.New(enforcer.Config{
		Tuning:        enforcer.Tuning{MaxKeys: maxKeys},
		Rules:         rules.Static(rc),
		Site:          "eu",
		Snapshot:      snap,
		Local:         local,
		Counter:       counter,
		KeyCacheBytes: mem.KeyCache,
	})
	if err != nil {
		return err
	}
	report("start")
	held := func() {
		fmt.Printf("  accounted: local counters %d MiB (%d keys), site counter %d MiB (%d keys), snapshot %d MiB (%d keys)\n",
			local.Bytes()>>20, local.Len(), counter.Bytes()>>20, counter.Len(), snap.Bytes()>>20, snap.Len())
	}

	ctx := context.Background()
	var res enforcer.Result
	start := time.Now()
	for i := range keys {
		u, ip := strconv.Itoa(i), fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		lim.DecideInto(ctx, enforcer.Request{Domain: "api", Descriptors: [][]rules.Entry{
			{{Key: "user", Value: u}}, {{Key: "ip", Value: ip + "/" + strconv.Itoa(i>>24)}},
		}}, &res)
	}
	report(fmt.Sprintf("%d new users and IPs decided (%.1f s)", keys, time.Since(start).Seconds()))
	held()

	now := time.Now().UnixMilli()
	refused := 0
	for i := range keys {
		c := topics.Count{Key: "api|user=" + strconv.Itoa(i) + "#60s", Window: 60_000, AsOf: now, Total: 3,
			Sites: []topics.SiteCount{{Site: "eu", Count: 1, Demand: 1}, {Site: "us", Count: 2, Demand: 2}}}
		v, err := c.MarshalBinary()
		if err != nil {
			return err
		}
		if err := snap.Apply([]byte(c.Key), v); err != nil {
			refused++
		}
	}
	report(fmt.Sprintf("%d counts applied to the snapshot (%d refused, %d held)", keys, refused, snap.Len()))
	held()

	if logHits > 0 {
		for _, n := range []int64{logHits, 2 * logHits} {
			lim.DecideInto(ctx, enforcer.Request{Domain: "api", Descriptors: [][]rules.Entry{{{Key: "upload", Value: "big"}}}, Hits: n}, &res)
			report(fmt.Sprintf("sliding_log request of %d hits: %s", n, res.Code))
		}
	}
	runtime.KeepAlive(lim)
	return nil
}

func writeHeap(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.WriteHeapProfile(f)
}

// report prints the resident set (now and its peak) and the live Go heap after a GC.
func report(step string) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, hwm := procStatus("VmRSS:"), procStatus("VmHWM:")
	fmt.Printf("%-62s RSS %5d MiB (peak %5d MiB), Go heap in use %5d MiB\n", step, rss>>10, hwm>>10, ms.HeapInuse>>20)
}

// procStatus returns a /proc/self/status field in KiB, 0 when unavailable.
func procStatus(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field); ok {
			v, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return v
		}
	}
	return 0
}
