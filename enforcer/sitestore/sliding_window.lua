-- Sliding window over sub-buckets (algo.SlidingWindow). State: ring, the sub-buckets
-- with hits as a MessagePack array {index, hits, index, hits, ...}, oldest first (a field
-- of its own, so that a hash the two-count script wrote, whose fields are st, cur and prev,
-- reads as empty). Parameters: the index of the sub-bucket holding now, of the oldest one
-- the window ending now overlaps, a sub-bucket's width (ms), the ms until the one holding
-- now has left the window, and how many sub-buckets a counter keeps before its newest
-- (algo.SubBuckets.Keeps). Every sub-bucket from the oldest on counts whole.
-- Reports r1 = the count, r2 = the newest sub-bucket with hits and r3 = the one by which,
-- counted from the oldest, the count holds count + n - a hits, both as offsets from the
-- one holding now. The key expires when its newest sub-bucket has left the window, so its
-- expiry moves only with a new newest sub-bucket (window_ttl, st.moved).
local sliding_window = {fields = {'ring'}, window_ttl = true, count = 'ring'}
function sliding_window.new(hk, lk, alg, w)
  return {hk = hk, lk = lk, alg = alg, w = w, ttl = 0, dirty = false, reset = false, moved = false,
    ring = '', p = false}
end
function sliding_window.decide(st, b, n, a)
  local ic, i0, keep = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7]), tonumber(ARGV[b + 10])
  local p = st.p
  if not p then
    if st.ring ~= '' then p = cmsgpack.unpack(st.ring) else p = {} end
  end
  local np = #p
  local at, newest, oldest = ic, ic, ic
  if np > 0 then
    newest = p[np - 1]
    -- Drop the sub-buckets no decision counts any more (those before the oldest the
    -- window ending at newest's start overlaps); this changes none.
    if p[1] < newest - keep then
      local first = 3
      while p[first] < newest - keep do first = first + 2 end
      local q = {}
      for k = first, np do q[#q + 1] = p[k] end
      p, np = q, #q
    end
    -- A request stamped before the newest sub-bucket a concurrent caller already started
    -- is decided, and counts, in that one (algo.SubBuckets.Decides).
    if newest > at then
      at, i0 = newest, newest - keep
    end
  end
  st.p = p
  local count, from = 0, np + 1
  for k = np - 1, 1, -2 do
    if p[k] < i0 then break end
    count, from = count + p[k + 1], k
  end
  local j = count + n - a
  if j >= 1 and j <= count then
    local held = 0
    for k = from, np, 2 do
      held = held + p[k + 1]
      if held >= j then
        oldest = p[k]
        break
      end
    end
  end
  local allowed = force or (n <= a and count + n <= a)
  local ttl = 0
  if allowed and commit and n > 0 then
    if np > 0 and p[np - 1] == at then
      p[np] = p[np] + n
    else
      -- a new newest sub-bucket: the key now expires when this one has left the window
      p[np + 1], p[np + 2], st.moved = at, n, true
    end
    st.ring, st.dirty = cmsgpack.pack(p), true
    ttl = tonumber(ARGV[b + 9]) + (at - ic) * tonumber(ARGV[b + 8])
  end
  return allowed, count, newest - ic, oldest - ic, ttl
end
