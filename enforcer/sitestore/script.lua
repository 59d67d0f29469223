-- streamlimit site-scope counters: one atomic step over all ops of one request.
-- Time is the caller's: ARGV[1] = now, whole seconds since the Unix epoch; ARGV[2] = the
-- nanoseconds within that second; ARGV[3] = now as a decimal nanosecond string.
-- ARGV[4] = expiry slack (ms); ARGV[5] = '1' to take (AllowAll), '0' to peek, or '2' to
-- write back hits admitted elsewhere (every op takes its n whether it fits or not);
-- ARGV[6] = number of ops. Then 10 ARGV per op: algorithm code, window (decimal ns), n,
-- allowance, capacity and five parameters of its algorithm (its Go file's args). KEYS: 2
-- per op, the counter's hash and its sliding-log list. A write back also has a marker key
-- after them and its TTL (ms) as the last ARGV: when the marker exists, the batch was
-- written already and nothing is done (so a retried write back never counts twice).
--
-- Lua numbers are doubles: every value this script does arithmetic on is an integer below
-- 2^53 (the Go side routes limits outside that range to the in-process store), and times
-- are handled as (seconds, nanoseconds) pairs or as offsets from now, never as absolute
-- nanoseconds. Products that could pass 2^53 are compared exactly with 24-bit limbs.
--
-- The request is decided by site_request, which reads KEYS and ARGV: run alone, the script
-- ends by calling it; in the batch script (batch.lua) KEYS and ARGV are chunk locals that
-- the batch sets to each request's part in turn.
local now_s, now_ns, now_str, slack, commit, force, nops
local E9 = 1000000000
local L = 16777216

local function fmt(x) return string.format('%.0f', x) end

-- whether decimal instant a (non-negative, no leading zeros) is after b
local function after(a, b)
  return #a > #b or (#a == #b and a > b)
end

local function limbs(x)
  local l0 = x % L
  x = (x - l0) / L
  local l1 = x % L
  return l0, l1, (x - l1) / L
end

local function mul(a, b)
  local a0, a1, a2 = limbs(a)
  local b0, b1, b2 = limbs(b)
  local r = {a0 * b0, a0 * b1 + a1 * b0, a0 * b2 + a1 * b1 + a2 * b0, a1 * b2 + a2 * b1, a2 * b2}
  local carry = 0
  for i = 1, 5 do
    local v = r[i] + carry
    local l = v % L
    r[i] = l
    carry = (v - l) / L
  end
  r[6] = carry
  return r
end

-- sign of a*b - c*d, exactly, for non-negative integers below 2^53
local function mulcmp(a, b, c, d)
  local x, y = mul(a, b), mul(c, d)
  for i = 6, 1, -1 do
    if x[i] ~= y[i] then
      if x[i] < y[i] then return -1 end
      return 1
    end
  end
  return 0
end

-- offset from now, in ns, of a decimal nanosecond timestamp (exact below 2^53 ns)
local function rel(t)
  local len = #t
  if len > 9 then
    return (tonumber(string.sub(t, 1, len - 9)) - now_s) * E9 + (tonumber(string.sub(t, len - 8)) - now_ns)
  end
  return -now_s * E9 + (tonumber(t) - now_ns)
end

local states, order

-- load returns the state of op i's counter: its hash's fields (the bucket family keeps ts,
-- tn, tr and d, the window algorithms st, cur and prev), and what this call has done to
-- its list (sliding log). A counter used with another algorithm or window starts empty.
local function load(i, alg, w, a)
  local hk = KEYS[2 * i - 1]
  local st = states[hk]
  if st == nil then
    local v = redis.call('HMGET', hk, 'alg', 'w', 'ts', 'tn', 'tr', 'd', 'st', 'cur', 'prev')
    st = {hk = hk, lk = KEYS[2 * i], alg = v[1], w = v[2], ts = tonumber(v[3]) or 0,
      tn = tonumber(v[4]) or 0, tr = tonumber(v[5]) or 0, d = tonumber(v[6]) or 0,
      st = v[7] or '', cur = tonumber(v[8]) or 0, prev = tonumber(v[9]) or 0,
      drop = 0, push = 0, reset = false, dirty = false, ttl = 0}
    states[hk] = st
    order[#order + 1] = st
  end
  if st.alg ~= alg or st.w ~= w then
    -- a new counter, or one reused with another algorithm or window: start empty
    st.alg, st.w, st.ts, st.tn, st.tr, st.d, st.st, st.cur, st.prev = alg, w, 0, 0, 0, a, '', 0, 0
    st.llen, st.drop, st.push, st.reset = 0, 0, 0, true
  end
  return st
end

-- The algorithms: one file each (bucket.lua, fixed_window.lua, sliding_window.lua,
-- sliding_log.lua), each defining a table with decide(st, b, n, a, c) -> allowed, r1, r2,
-- r3, ttl (b: the op's ARGV offset; r1..r3 what its Go file turns into a Decision; ttl in
-- ms, when it took), optionally save(st, taken, ttl) for state beyond the hash, and
-- windows = true when it keeps only st, cur and prev in the hash. Go puts
-- them here, and the table algos that maps each algorithm code to one of them.
-- ALGORITHMS

local function site_request()
now_s = tonumber(ARGV[1])
now_ns = tonumber(ARGV[2])
now_str = ARGV[3]
slack = tonumber(ARGV[4])
commit = ARGV[5] ~= '0'
force = ARGV[5] == '2'
nops = tonumber(ARGV[6])
if force and not redis.call('SET', KEYS[2 * nops + 1], '1', 'NX', 'PX', ARGV[7 + 10 * nops]) then
  return {1}
end
states, order = {}, {}
local out = {1}
local all = true
for i = 1, nops do
  local b = 6 + (i - 1) * 10
  local alg, w = ARGV[b + 1], ARGV[b + 2]
  local n, a, c = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local st = load(i, alg, w, a)
  local allowed, r1, r2, r3, ttl = algos[alg].decide(st, b, n, a, c)
  if ttl > st.ttl then st.ttl = ttl end
  if not allowed then all = false end
  local ai = 0
  if allowed then ai = 1 end
  out[#out + 1] = ai
  out[#out + 1] = r1
  out[#out + 1] = r2
  out[#out + 1] = r3
end

if commit then
  for _, st in ipairs(order) do
    local taken = all and st.dirty
    local ttl = st.ttl + slack
    if taken and algos[st.alg].windows then
      -- the window algorithms keep st, cur and prev only (load reads any other field of a
      -- hash written by another algorithm as that algorithm's, and ignores it)
      redis.call('HSET', st.hk, 'alg', st.alg, 'w', st.w, 'st', st.st, 'cur', fmt(st.cur), 'prev', fmt(st.prev))
      redis.call('PEXPIRE', st.hk, ttl)
    elseif taken then
      redis.call('HSET', st.hk, 'alg', st.alg, 'w', st.w, 'ts', fmt(st.ts), 'tn', fmt(st.tn),
        'tr', fmt(st.tr), 'd', fmt(st.d), 'st', st.st, 'cur', fmt(st.cur), 'prev', fmt(st.prev))
      redis.call('PEXPIRE', st.hk, ttl)
    end
    local save = algos[st.alg].save
    if save then save(st, taken, ttl) end
  end
end
if not all then out[1] = 0 end
return out
end
-- RUN
return site_request()
