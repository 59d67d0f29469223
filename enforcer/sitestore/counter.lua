-- streamlimit global-scope site counts: the ring of package window (see counter.go) in one
-- Redis hash per counter key. Fields: 'w' = the window in ms the ring was made for, 'h' =
-- the newest bucket index held (the ring's head), and one field per non-empty bucket named
-- by its absolute index (decimal), valued by its count. Only buckets in (h - slots, h] are
-- kept: a head move deletes the ones that fall out.
--
-- ARGV[1] = '1' to commit, '0' to read counts; ARGV[2] = number of ops. Then 10 ARGV per op
-- (computed in Go with package window's arithmetic, so that Lua only adds and compares):
--   1 window ms as the op has it (compared with 'w'; a mismatch means an empty ring)
--   2 window ms of the layout (stored in 'w' when the ring is made)
--   3 ring slots
--   4 index of now's bucket (where the add goes)
--   5 i0, the index of the bucket holding the window start
--   6 the fraction of bucket i0 inside the window
--   7 the amount added to now's bucket (N, clamped so that saturation matches)
--   8 N as a float, for the check
--   9 the cap, or 'inf' (no cap: always fits) or '-inf' (never fits)
--  10 the key's TTL in ms, set on every commit: window + bucket width + expiry slack
-- KEYS: one hash per op.
--
-- Both return {ok, count of op 1, ..., count of op n}: ok is '1', or for a commit in which
-- some op did not fit and nothing was added '0'; each count is the op's count at now before
-- the request, as a decimal string (%.17g, exact for a double).
--
-- Lua numbers are doubles; every integer here is below 2^53 (bucket indices of unix ms,
-- sums of at most a few hundred uint32 counts), so the arithmetic is exact, and the one
-- float operation (whole + oldest * frac) is the same IEEE sequence as package window's.
--
-- A request's KEYS and ARGV start after kb keys and ab arguments (0 when the script runs
-- alone; the batch script, batch.lua, passes each request's offsets). It is decided by
-- counter_request(kb, ab): run alone, the script ends by calling it with offsets 0. Its two
-- halves, counter_check (counts, and for a commit whether every op fits) and counter_add,
-- are apart so that the batch script can decide a request's site limits between them.
local CA = 10
local MAX = 4294967295

local function cfmt(x) return string.format('%.0f', x) end

-- count of the ring in key at the op's instant (0 when the ring was made for another
-- window), whether the ring exists for the op's window, and what a commit at bucket idx
-- needs of it: its head and bucket idx's count
local function count(key, wm, i0, frac, idx)
  local all = redis.call('HGETALL', key)
  local w, h, whole, oldest, at = nil, nil, 0, 0, nil
  for j = 1, #all, 2 do
    local f = all[j]
    if f == 'w' then
      w = tonumber(all[j + 1])
    elseif f == 'h' then
      h = tonumber(all[j + 1])
    else
      local i = tonumber(f)
      local v = tonumber(all[j + 1])
      if i == idx then at = v end
      if i == i0 then
        oldest = v
      elseif i > i0 then
        whole = whole + v
      end
    end
  end
  if w ~= wm then return 0, false, w, h, at end
  return whole + oldest * frac, true, w, h, at
end

-- counter_check returns the request's reply as a read or a commit that adds nothing would
-- give it, and, when it is a commit that fits (out[1] == '1'), the rings as read, which
-- counter_add takes to add the request.
local function counter_check(kb, ab)
local commit = ARGV[ab + 1] ~= '0'
local nops = tonumber(ARGV[ab + 2])
-- ARGV[1] = '2' writes back hits counted elsewhere (the caps are 'inf'), once: KEYS[nops + 1]
-- is the batch's marker and the last ARGV its TTL (ms); a marker that exists means the
-- batch was written already, and nothing is done.
if ARGV[ab + 1] == '2' and not redis.call('SET', KEYS[kb + nops + 1], '1', 'NX', 'PX', ARGV[ab + 3 + CA * nops]) then
  local out = {'1'}
  for i = 1, nops do out[i + 1] = '0' end
  return out
end

-- Counts of every op on the state before the request, and the ring as read.
local out, matched, rw, rh, rat = {'1'}, {}, {}, {}, {}
for i = 1, nops do
  local b = ab + 2 + (i - 1) * CA
  local c
  c, matched[i], rw[i], rh[i], rat[i] = count(KEYS[kb + i], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 5]),
    tonumber(ARGV[b + 6]), tonumber(ARGV[b + 4]))
  out[i + 1] = string.format('%.17g', c)
end
if not commit then return out end

-- Check: earlier ops of the request on the same key add their N, as if already taken.
for i = 1, nops do
  local b = ab + 2 + (i - 1) * CA
  local cap = ARGV[b + 9]
  if cap == '-inf' then
    out[1] = '0'
    return out
  end
  if cap ~= 'inf' then
    local cur = tonumber(out[i + 1])
    for j = 1, i - 1 do
      if KEYS[kb + j] == KEYS[kb + i] then cur = cur + tonumber(ARGV[ab + 2 + (j - 1) * CA + 8]) end
    end
    if cur + tonumber(ARGV[b + 8]) > tonumber(cap) then
      out[1] = '0'
      return out
    end
  end
end

return out, matched, rw, rh, rat
end

-- counter_add adds a request that counter_check found to fit, op by op (window.Ring.Add
-- with the add in now's bucket). An op whose key no earlier op of the request changed uses
-- the ring as counter_check read it; the others read it again.
local function counter_add(kb, ab, matched, rw, rh, rat)
local nops = tonumber(ARGV[ab + 2])
local touched = {}
for i = 1, nops do
  local b = ab + 2 + (i - 1) * CA
  local key = KEYS[kb + i]
  local wm, sw, slots = tonumber(ARGV[b + 1]), ARGV[b + 2], tonumber(ARGV[b + 3])
  local idx, add, ttl = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 7]), ARGV[b + 10]
  local w, head, at = rw[i], rh[i], rat[i]
  if touched[key] then
    local v = redis.call('HMGET', key, 'w', 'h', cfmt(idx))
    w, head, at = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
  end
  touched[key] = true
  local ok = true
  local set = {'HSET', key}
  if w == wm then
    -- the ring this op was checked on (head as read)
  elseif matched[i] then
    -- The ring this op was checked on was replaced by an earlier op of the request with
    -- another window: enforcer.LocalCounter adds such an op to the replaced ring, which is
    -- lost. Same here.
    ok = false
  else
    -- a new ring, or one made for another window: start empty with the head at now
    if w then redis.call('DEL', key) end
    set[3], set[4], set[5], set[6] = 'w', sw, 'h', idx
    head, at = idx, nil
  end
  if ok and idx > head then
    local drop = {}
    for j = head - slots + 1, math.min(head, idx - slots) do drop[#drop + 1] = j end
    if #drop > 0 then redis.call('HDEL', key, unpack(drop)) end
    if #set == 2 then set[3], set[4] = 'h', idx end
  elseif ok and idx <= head - slots then
    ok = false -- older than every bucket the ring holds: not counted
  end
  if ok then
    local c = (at or 0) + add
    if add > MAX or c > MAX or c < 0 then c = MAX end
    set[#set + 1] = idx
    set[#set + 1] = c
  end
  if #set > 2 then redis.call(unpack(set)) end
  redis.call('PEXPIRE', key, ttl)
end
end

local function counter_request(kb, ab)
  local out, matched, rw, rh, rat = counter_check(kb, ab)
  if matched then counter_add(kb, ab, matched, rw, rh, rat) end
  return out
end
-- RUN
return counter_request(0, 0)
