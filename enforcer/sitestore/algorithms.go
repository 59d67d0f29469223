package sitestore

import (
	"fmt"
	"strings"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// siteAlgorithms is the Redis side's registration table: every algorithm that site scope
// keeps in Redis, each implemented by one Lua file and one Go file of the same name
// (bucket for the TAT family). The script, the arguments, the decisions and the range
// checks find an algorithm only through it. An algorithm of package algo missing here must
// be named in notInRedis with the reason.
var siteAlgorithms = map[algo.Algorithm]siteAlgorithm{
	algo.SlidingWindow:         slidingWindowSite,
	algo.SlidingWindowEstimate: slidingWindowEstimateSite,
	algo.TokenBucket:           bucketSite,
	algo.LeakyBucket:           bucketSite,
	algo.FixedWindow:           fixedWindowSite(algo.Epoch),
	algo.SlidingLog:            slidingLogSite,
	algo.GCRA:                  bucketSite,

	algo.FixedWindowOn(algo.Month): fixedWindowSite(algo.Month),
	algo.FixedWindowOn(algo.Year):  fixedWindowSite(algo.Year),
}

// notInRedis names the algorithms of package algo that site scope does not keep in Redis,
// with the reason; their site limits are decided in process. None so far.
var notInRedis = map[algo.Algorithm]string{}

// siteAlgorithm is one algorithm's Redis implementation.
type siteAlgorithm struct {
	// lua is the name of the Lua table its file defines, and src the file (script.lua
	// says what the table holds).
	lua, src string
	// args appends the op's argsPerAlgorithm parameters for its Lua decide at now (unix
	// ns).
	args func(args []any, now int64, op *algo.Op) []any
	// decide turns the state the script reported for op into op's Decision at now (unix
	// ns), with package algo's decision function, so that both stores decide alike; with
	// commit, an admitted op's own take is reflected in Remaining and ResetAfter.
	decide func(op *algo.Op, now int64, st opState, commit bool) algo.Decision
	// check rejects limits outside what its Lua computes exactly, beyond the range every
	// algorithm shares (CheckLimit); nil: none.
	check func(lim algo.Limit) error
}

// argsPerAlgorithm is how many script arguments an op's algorithm takes; argsPerOp adds
// the five every op has (algorithm code, window, n, allowance, capacity).
const (
	argsPerAlgorithm = 5
	argsPerOp        = 5 + argsPerAlgorithm
)

// siteScript is the site-scope script: script.lua with every registered algorithm's Lua put
// in at its "-- ALGORITHMS" line, each file once, and each algorithm code mapped to its
// table.
var siteScript = buildScript()

func buildScript() string {
	const mark = "-- ALGORITHMS\n"
	if !strings.Contains(scriptSrc, mark) {
		panic("sitestore: script.lua has no " + strings.TrimSpace(mark) + " line")
	}
	var b strings.Builder
	b.WriteString("local algos = {}\n")
	seen := map[string]bool{}
	for _, a := range algo.Algorithms() {
		sa, ok := siteAlgorithms[a]
		if !ok {
			continue
		}
		if !seen[sa.lua] {
			seen[sa.lua] = true
			b.WriteString(sa.src)
		}
		fmt.Fprintf(&b, "algos['%d'] = %s\n", a, sa.lua)
	}
	return strings.Replace(scriptSrc, mark, b.String(), 1)
}
