-- streamlimit site-scope counters: one atomic step over all ops of one request.
-- A request's KEYS and ARGV start after kb keys and ab arguments (0 when the script runs
-- alone; the batch script, batch.lua, passes each request's offsets). Below, ARGV[i] and
-- KEYS[i] mean the request's own i-th, that is ARGV[ab + i] and KEYS[kb + i].
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
-- nanoseconds. Products that could pass 2^53 are compared exactly with 24-bit limbs. An
-- integer handed to redis.call as a number is written as Redis writes a Lua number
-- (%.17g), which for an integer below 10^17 is its exact decimal form.
--
-- The request is decided by site_request(kb, ab): run alone, the script ends by calling
-- it with offsets 0; the batch script calls it for each of its site-scope requests.
local now_s, now_ns, now_str, slack, commit, force, nops
-- Globals looked up once per script call: each use of a global is a table lookup, of a
-- local none (the algorithms below use these too).
local ARGV, KEYS, tonumber, rcall = ARGV, KEYS, tonumber, redis.call
local E9 = 1000000000
local L = 16777216

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

-- The algorithms: one file each (bucket.lua, fixed_window.lua, sliding_window.lua,
-- sliding_window_estimate.lua, sliding_log.lua), each defining a table with decide(st, b, n, a, c) -> allowed, r1, r2,
-- r3, ttl (b: the op's ARGV offset, the request's included; r1..r3 what its Go file turns
-- into a Decision; ttl in ms, when it took), fields: the hash fields it keeps, new(hk, lk,
-- alg, w): a counter's state table, with every field the script and its decide set (the
-- common hk, lk, alg, w, ttl, dirty, reset, moved, and its own, at their empty values: a
-- table built with all its fields is never grown), optionally save(st, taken, ttl) for
-- state beyond the hash, and window_ttl when its key's expiry depends only on the window
-- the counter holds (decide sets st.moved when the window changes; a hit that does not
-- move it writes only its count field, count, by default cur). Go puts them here, and
-- the table algos that maps each algorithm code to one of them.
-- ALGORITHMS

local states, order

-- read returns the state of a counter (its hash hk, its list lk) for an op of algorithm
-- alg, window w and allowance a, as its hash holds it: the hash's alg and w, and the
-- fields its algorithm keeps (its table's fields: the bucket family ts, tn, tr and d, the
-- window algorithms st, cur and prev, the sub-bucket sliding window ring, the sliding log
-- cur). A counter used with another
-- algorithm or window starts empty (reset: its alg and w are written with its fields); a
-- hash keeps other algorithms' fields, which are never read.
local function read(hk, lk, alg, w, a)
  local A = algos[alg]
  local F = A.fields
  local v
  if #F == 3 then
    v = rcall('HMGET', hk, 'alg', 'w', F[1], F[2], F[3])
  elseif #F == 4 then
    v = rcall('HMGET', hk, 'alg', 'w', F[1], F[2], F[3], F[4])
  else
    v = rcall('HMGET', hk, 'alg', 'w', F[1])
  end
  local st = A.new(hk, lk, alg, w)
  if v[1] == alg and v[2] == w then
    for j = 1, #F do
      local f, x = F[j], v[2 + j]
      if f == 'st' or f == 'ring' then st[f] = x or '' else st[f] = tonumber(x) or 0 end
    end
  else
    st.d, st.llen, st.reset = a, 0, true
  end
  return st
end

-- load is read for a request of several ops, which may share a counter: what earlier ops
-- of the request did to it (in states) is the state later ones see (with what this call
-- has done to its list, for the sliding log), and a counter reused with another algorithm
-- or window by an earlier op starts empty again.
local function load(hk, lk, alg, w, a)
  local st = states[hk]
  if st == nil then
    st = read(hk, lk, alg, w, a)
    states[hk] = st
    order[#order + 1] = st
  elseif st.alg ~= alg or st.w ~= w then
    st.alg, st.w, st.ts, st.tn, st.tr, st.d, st.st, st.cur, st.prev = alg, w, 0, 0, 0, a, '', 0, 0
    st.llen, st.drop, st.push, st.ring, st.p, st.reset = 0, 0, 0, '', false, true
  end
  return st
end

-- store writes st's algorithm's fields to its hash (with alg and w when it was reset), and
-- its expiry: for an algorithm whose keys expire with their window (window_ttl), only when
-- decide moved the counter to another window (st.moved: the expiry's absolute time is the
-- same for every request of one window, as set by the first), else on every write. A
-- window algorithm's write within its window changes its count alone (the window start and
-- the previous count stay), and only cur is written.
local function store(st, ttl)
  local A = algos[st.alg]
  local F, hk = A.fields, st.hk
  if A.window_ttl and not st.moved and not st.reset then
    -- the same window (or sub-bucket): only its count changed, and the expiry is the
    -- window's; the count is in cur, or the table's count field
    local f = A.count or 'cur'
    rcall('HSET', hk, f, st[f])
    return
  end
  if st.reset then
    if #F == 3 then
      rcall('HSET', hk, 'alg', st.alg, 'w', st.w, F[1], st[F[1]], F[2], st[F[2]], F[3], st[F[3]])
    elseif #F == 4 then
      rcall('HSET', hk, 'alg', st.alg, 'w', st.w, F[1], st[F[1]], F[2], st[F[2]], F[3], st[F[3]], F[4], st[F[4]])
    else
      rcall('HSET', hk, 'alg', st.alg, 'w', st.w, F[1], st[F[1]])
    end
  elseif #F == 3 then
    rcall('HSET', hk, F[1], st[F[1]], F[2], st[F[2]], F[3], st[F[3]])
  elseif #F == 4 then
    rcall('HSET', hk, F[1], st[F[1]], F[2], st[F[2]], F[3], st[F[3]], F[4], st[F[4]])
  else
    rcall('HSET', hk, F[1], st[F[1]])
  end
  rcall('PEXPIRE', hk, ttl)
end

local function site_request(kb, ab)
now_s = tonumber(ARGV[ab + 1])
now_ns = tonumber(ARGV[ab + 2])
now_str = ARGV[ab + 3]
slack = tonumber(ARGV[ab + 4])
commit = ARGV[ab + 5] ~= '0'
force = ARGV[ab + 5] == '2'
nops = tonumber(ARGV[ab + 6])
if force and not rcall('SET', KEYS[kb + 2 * nops + 1], '1', 'NX', 'PX', ARGV[ab + 7 + 10 * nops]) then
  return {1}
end
if nops == 1 then
  -- one op (the common request): its counter alone, without the tables of states
  local b = ab + 6
  local alg, w = ARGV[b + 1], ARGV[b + 2]
  local n, a, c = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local st = read(KEYS[kb + 1], KEYS[kb + 2], alg, w, a)
  local A = algos[alg]
  local allowed, r1, r2, r3, ttl = A.decide(st, b, n, a, c)
  if commit then
    local taken = allowed and st.dirty
    if taken then store(st, ttl + slack) end
    if A.save then A.save(st, taken, ttl + slack) end
  end
  if allowed then return {1, 1, r1, r2, r3} end
  return {0, 0, r1, r2, r3}
end
states, order = {}, {}
local out = {1}
local all = true
for i = 1, nops do
  local b = ab + 6 + (i - 1) * 10
  local alg, w = ARGV[b + 1], ARGV[b + 2]
  local n, a, c = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local st = load(KEYS[kb + 2 * i - 1], KEYS[kb + 2 * i], alg, w, a)
  local allowed, r1, r2, r3, ttl = algos[alg].decide(st, b, n, a, c)
  if ttl > st.ttl then st.ttl = ttl end
  if not allowed then all = false end
  local k = 4 * i - 2
  if allowed then out[k] = 1 else out[k] = 0 end
  out[k + 1], out[k + 2], out[k + 3] = r1, r2, r3
end

if commit then
  for _, st in ipairs(order) do
    local taken = all and st.dirty
    local ttl = st.ttl + slack
    if taken then store(st, ttl) end
    local save = algos[st.alg].save
    if save then save(st, taken, ttl) end
  end
end
if not all then out[1] = 0 end
return out
end
-- RUN
return site_request(0, 0)
