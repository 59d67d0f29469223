-- Sliding log: the list beside the counter's hash holds one entry per admission time,
-- oldest first, each "<ns>:<hits>" (the decimal ns of its admission and the hits admitted
-- then); a bare "<ns>", the format that kept one entry per hit, counts as one hit, so a
-- list written before entries carried counts is read as it was meant. The hash's cur holds
-- the hits of the list's entries; 0 with a non-empty list means a list of that earlier
-- format, whose hits are counted by reading it whole until a call that changes the list
-- records them in cur.
-- Parameters: the window (ns), its ms, and the most entries a log keeps (algo's
-- MaxLogEntries, passed from Go). Past that many entries, new hits join the newest entry,
-- whose time moves to now, as in algo; so do hits admitted at the newest entry's own time.
-- Reports r1 = hits in the window, r2 = the newest entry - now, r3 = the time of the j-th
-- oldest hit - now where j = r1 + n - allowance, when denied.
local sliding_log = {fields = {'cur'}}
function sliding_log.new(hk, lk, alg, w)
  return {hk = hk, lk = lk, alg = alg, w = w, ttl = 0, dirty = false, reset = false, moved = false,
    cur = 0, drop = 0, push = 0}
end

-- entry parses a list element into its time (decimal ns string) and its hits.
local function entry(s)
  local c = string.find(s, ':', 1, true)
  if c == nil then return s, 1 end
  return string.sub(s, 1, c - 1), tonumber(string.sub(s, c + 1))
end

-- hits of the list's elements from index from to its end, read in pages
local function sumhits(lk, from)
  local sum = 0
  while true do
    local page = redis.call('LRANGE', lk, from, from + 999)
    for _, s in ipairs(page) do
      local _, h = entry(s)
      sum = sum + h
    end
    if #page < 1000 then return sum end
    from = from + 1000
  end
end

-- oldest returns the time - now of the j-th oldest hit of the log as this call sees it:
-- the list's entries from st.drop on, then the hits this call adds at now (st.push; when
-- they join the newest entry, that entry's hits are all at now).
-- It reads the list from its oldest entry in pages that grow, since the hit is most often
-- among the first few (a full log denies a request of n until its n oldest hits leave).
local function oldest(st, j)
  local held, from, size = 0, st.drop, 8
  while from < st.llen do
    local page = redis.call('LRANGE', st.lk, from, from + size - 1)
    for k, s in ipairs(page) do
      local t, h = entry(s)
      held = held + h
      if held >= j then
        if st.push > 0 and st.merge and from + k == st.llen then return 0 end
        return rel(t)
      end
    end
    from, size = from + size, math.min(2 * size, 1024)
  end
  return 0 -- added by this call, at now
end

function sliding_log.decide(st, b, n, a)
  local wn, cap = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 8])
  local r2, r3, ttl = 0, 0, 0
  if st.llen == nil then
    st.llen = redis.call('LLEN', st.lk)
    if st.llen == 0 then
      st.cur = 0
    elseif st.cur == 0 then
      st.cur = sumhits(st.lk, 0)
    end
  end
  -- Drop the entries that left the window (now - ts >= w); this never changes a decision.
  while st.llen - st.drop > 0 do
    local t, h = entry(redis.call('LINDEX', st.lk, st.drop))
    if -rel(t) < wn then break end
    st.drop, st.cur = st.drop + 1, st.cur - h
  end
  local count = st.cur
  local entries = st.llen - st.drop
  if st.push > 0 then
    r2 = 0
  elseif entries > 0 then
    st.last = redis.call('LINDEX', st.lk, -1)
    local t = entry(st.last)
    r2 = rel(t)
  end
  local allowed = n <= a and count + n <= a
  if not allowed and n <= a then r3 = oldest(st, count + n - a) end
  allowed = allowed or force
  if allowed and commit and n > 0 then
    if st.push == 0 then
      -- as algo records: into the newest entry when it is at now or the log is full
      st.merge = entries > 0 and (entries >= cap or entry(st.last) == now_str)
    end
    st.push, st.cur, st.dirty = st.push + n, st.cur + n, true
    ttl = tonumber(ARGV[b + 7])
  end
  return allowed, count, r2, r3, ttl
end

-- save writes the list: the entries dropped and the hits added when the request was
-- taken (the hash's cur, written by the script, then counts them), and the expired
-- entries dropped even when it was not (that changes no decision), with cur to match.
function sliding_log.save(st, taken, ttl)
  if taken then
    if st.reset then
      redis.call('DEL', st.lk)
    elseif st.drop > 0 then
      redis.call('LTRIM', st.lk, st.drop, -1)
    end
    if st.merge then
      local _, h = entry(st.last)
      redis.call('LSET', st.lk, -1, now_str .. ':' .. (h + st.push))
    else
      redis.call('RPUSH', st.lk, now_str .. ':' .. st.push)
    end
    redis.call('PEXPIRE', st.lk, ttl)
  elseif not st.reset and st.drop > 0 then
    redis.call('LTRIM', st.lk, st.drop, -1)
    redis.call('HSET', st.hk, 'cur', st.cur - st.push)
  end
end
