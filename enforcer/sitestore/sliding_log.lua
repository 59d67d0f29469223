-- Sliding log: one list entry per admitted hit, each the decimal ns of its admission, in
-- the list beside the counter's hash. Parameters: the window (ns) and its ms. Reports r1
-- = live entries, r2 = the newest - now, r3 = the j-th oldest - now where j = r1 + n -
-- allowance, when denied.
local sliding_log = {}

local function logat(st, i)
  local idx = st.drop + i
  if idx < st.llen then return rel(redis.call('LINDEX', st.lk, idx)) end
  return 0 -- pushed by this call, at now
end

function sliding_log.decide(st, b, n, a)
  local wn = tonumber(ARGV[b + 6])
  local r2, r3, ttl = 0, 0, 0
  if st.llen == nil then st.llen = redis.call('LLEN', st.lk) end
  local count = st.llen - st.drop + st.push
  while count > 0 and -logat(st, 0) >= wn do
    st.drop = st.drop + 1
    count = count - 1
  end
  if count > 0 then r2 = logat(st, count - 1) end
  local allowed = n <= a and count + n <= a
  if not allowed and n <= a then r3 = logat(st, count + n - a - 1) end
  allowed = allowed or force
  if allowed and commit and n > 0 then
    st.push, st.dirty = st.push + n, true
    ttl = tonumber(ARGV[b + 7])
  end
  return allowed, count, r2, r3, ttl
end

-- save writes the list: the entries pushed and dropped when the request was taken, and
-- the expired ones dropped even when it was not (that changes no decision).
function sliding_log.save(st, taken, ttl)
  if taken then
    if st.reset then
      redis.call('DEL', st.lk)
    elseif st.drop > 0 then
      redis.call('LTRIM', st.lk, st.drop, -1)
    end
    local left = st.push
    while left > 0 do
      local batch = {}
      for j = 1, math.min(left, 1000) do batch[j] = now_str end
      redis.call('RPUSH', st.lk, unpack(batch))
      left = left - #batch
    end
    redis.call('PEXPIRE', st.lk, ttl)
  elseif not st.reset and st.drop > 0 then
    redis.call('LTRIM', st.lk, st.drop, -1)
  end
end
