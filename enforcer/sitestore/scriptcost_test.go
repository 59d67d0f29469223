package sitestore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/testenv"
)

// bareScript is the floor a site-scope decision is measured against: per request, only
// the commands a window counter needs (HMGET of its three fields, HSET of them, PEXPIRE),
// with no decision, in batches laid out as batch.lua's.
const bareScript = `
local nreq = tonumber(ARGV[1])
local kb, ab = 0, 1 + nreq
for r = 1, nreq do
  local nops = tonumber(ARGV[ab + 6])
  for i = 1, nops do
    local hk = KEYS[kb + 2 * i - 1]
    local v = redis.call('HMGET', hk, 'alg', 'w', 'st', 'cur', 'prev')
    redis.call('HSET', hk, 'st', ARGV[ab + 3], 'cur', (tonumber(v[4]) or 0) + 1, 'prev', 0)
    redis.call('PEXPIRE', hk, 60000)
  end
  kb, ab = kb + 2 * nops, ab + 6 + 10 * nops
end
return {}
`

// BenchmarkScriptCost measures what Redis spends running site-scope decisions: batches
// of 16 requests (one op each) on 10 000 keys (160 hot ones for sliding_window/full_ring),
// as batch.go sends them under load, with a
// limit that admits everything (bench/redis.sh's rule). Each batch is one script call
// (the batcher's queue bypassed, so the batches are full); the figure is Redis's own
// account of the script's time (INFO commandstats, usec of EVALSHA and EVAL over the run)
// per request, as redis-µs/req, nested commands included; redis-cpu-µs/req is Redis's whole
// CPU time (INFO cpu) per request. The keys are touched once (the hot ones for a whole
// window) before the timer starts, and time moves 100 µs per batch, so most requests find their
// counter in the current window. "bare" is bareScript on the same arguments: the
// commands' own cost, which no script can go below. Run it alone on a Redis of its own
// (other clients' scripts would count):
//
//	go test -run '^$' -bench ScriptCost -benchtime 500x ./enforcer/sitestore/
func BenchmarkScriptCost(b *testing.B) {
	const batch = 16
	type variant struct {
		name   string
		alg    algo.Algorithm
		window time.Duration
		script string // "" = the batch script
		keys   int    // 0: 10 000
	}
	variants := []variant{
		{"sliding_window", algo.SlidingWindow, time.Minute, "", 0},
		// 160 keys of 1 s windows, each hit every millisecond: every key's ring holds a hit
		// in each of its 59 sub-buckets of 17 ms, the most it can.
		{"sliding_window/full_ring", algo.SlidingWindow, time.Second, "", 160},
		{"sliding_window_estimate", algo.SlidingWindowEstimate, time.Minute, "", 0},
		{"fixed_window", algo.FixedWindow, time.Minute, "", 0},
		{"token_bucket", algo.TokenBucket, time.Minute, "", 0},
		{"sliding_log", algo.SlidingLog, time.Minute, "", 0},
		{"bare", algo.SlidingWindow, time.Minute, bareScript, 0},
	}
	client := testenv.RedisClient(b)
	ctx := context.Background()
	for _, v := range variants {
		keys := v.keys
		if keys == 0 {
			keys = 10000
		}
		// Set up and warmed once per variant, not for each b.N the benchmark runs with.
		s := newStore(b, client, testenv.KeyPrefix(b)+v.name+":", nil)
		script := s.batch.script
		if v.script != "" {
			script = redis.NewScript(v.script)
		}
		if err := script.Load(ctx, client).Err(); err != nil {
			b.Fatal(err)
		}
		lim := algo.Limit{Requests: 1_000_000_000, Window: v.window}
		if v.alg == algo.SlidingLog {
			lim.Requests = 1_000_000
		}
		ops := make([]algo.Op, keys)
		for i := range ops {
			ops[i] = algo.Op{Key: fmt.Sprintf("api|user=%d#%v", i, v.alg), Algorithm: v.alg, Limit: lim, N: 1}
		}
		now := t0
		k := 0
		send := func() error {
			calls := make([]*call, batch)
			for j := range calls {
				calls[j] = s.siteCall(now, ops[k:k+1], true)
				k = (k + 1) % keys
			}
			now = now.Add(100 * time.Microsecond)
			kk, args := batchArgs(calls)
			if err := script.EvalSha(ctx, client, kk, args...).Err(); err != nil && err != redis.Nil {
				return err
			}
			return nil
		}
		warm := keys / batch
		if v.keys > 0 {
			warm = int(v.window/(100*time.Microsecond)) + 100 // a whole window: rings full
		}
		for range warm {
			if err := send(); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(v.name, func(b *testing.B) {
			before, cpu := scriptUsec(b, client), redisCPU(b, client)
			b.ResetTimer()
			for range b.N {
				if err := send(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			n := float64(b.N * batch)
			b.ReportMetric((scriptUsec(b, client)-before)/n, "redis-µs/req")
			b.ReportMetric((redisCPU(b, client)-cpu)/n, "redis-cpu-µs/req")
		})
	}
}

// redisCPU is the CPU time Redis has used (INFO cpu, user and system), in µs.
func redisCPU(t testing.TB, client redis.UniversalClient) float64 {
	t.Helper()
	return infoSum(t, client, "cpu", func(name, value string) string {
		if name == "used_cpu_user" || name == "used_cpu_sys" {
			return value
		}
		return ""
	}) * 1e6
}

// scriptUsec is the time Redis has spent in EVALSHA and EVAL (INFO commandstats), in µs.
func scriptUsec(t testing.TB, client redis.UniversalClient) float64 {
	t.Helper()
	return infoSum(t, client, "commandstats", func(name, value string) string {
		if name != "cmdstat_evalsha" && name != "cmdstat_eval" {
			return ""
		}
		for _, f := range strings.Split(value, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				return v
			}
		}
		return ""
	})
}

// infoSum adds up the numbers pick finds in the lines of an INFO section (pick returns
// the number's text, or "" for a line that does not count).
func infoSum(t testing.TB, client redis.UniversalClient, section string, pick func(name, value string) string) float64 {
	t.Helper()
	info, err := client.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if v := pick(name, value); v != "" {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			sum += x
		}
	}
	return sum
}
