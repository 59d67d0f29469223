-- Sliding window over sub-buckets (algo.SlidingWindow). State: ring, the sub-buckets
-- with hits as a MessagePack array {index, hits, index, hits, ...}, oldest first (a field
-- of its own, so that a hash the two-count script wrote, whose fields are st, cur and prev,
-- reads as empty). Parameters: the index of the sub-bucket holding now, of the oldest one
-- the window ending now overlaps, a sub-bucket's width (ms), and the ms until the one
-- holding now has left the window. Every sub-bucket from the oldest on counts whole.
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
  local ic, i0 = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
  local p = st.p
  if not p then
    if st.ring ~= '' then p = cmsgpack.unpack(st.ring) else p = {} end
  end
  -- Drop the sub-buckets that left the window; this never changes a decision.
  local np = #p
  if np > 0 and p[1] < i0 then
    local first = 3
    while first < np and p[first] < i0 do first = first + 2 end
    local q = {}
    for k = first, np do q[#q + 1] = p[k] end
    p, np = q, #q
  end
  st.p = p
  local count = 0
  for k = 2, np, 2 do count = count + p[k] end
  -- A request stamped before the newest sub-bucket a concurrent caller already started
  -- counts in that one.
  local at, newest, oldest = ic, ic, ic
  if np > 0 then
    newest = p[np - 1]
    if newest > at then at = newest end
  end
  local j = count + n - a
  if j >= 1 and j <= count then
    local held = 0
    for k = 1, np, 2 do
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
