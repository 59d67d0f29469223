-- Sliding window estimate (two counts). State: st, the current window's start (decimal ns), cur its
-- count and prev the previous window's. Parameters: the start of the window containing
-- now and of the one before it, the time left in the current window (the previous one's
-- weight), the window (ns), and the ms until the current window's count has left the
-- sliding window. Reports r1, r2 = the counts in the current and previous window.
local sliding_window_estimate = {fields = {'st', 'cur', 'prev'}, window_ttl = true}
function sliding_window_estimate.new(hk, lk, alg, w)
  return {hk = hk, lk = lk, alg = alg, w = w, ttl = 0, dirty = false, reset = false, moved = false,
    st = '', cur = 0, prev = 0}
end
function sliding_window_estimate.decide(st, b, n, a)
  local ws, pws = ARGV[b + 6], ARGV[b + 7]
  local x, wn = tonumber(ARGV[b + 8]), tonumber(ARGV[b + 9])
  local cur, prev, late, ttl = 0, 0, 0, 0
  if st.st == ws then
    cur, prev = st.cur, st.prev
  elseif st.st == pws then
    prev = st.cur
  elseif after(st.st, ws) then
    -- A request stamped before the window a concurrent caller already started: it
    -- counts in that newer window, with the previous one weighed whole (the strictest
    -- estimate), and never resets it.
    ws, cur, prev, x, late = st.st, st.cur, st.prev, wn, math.ceil(wn / 1000000)
  end
  local k = a - n - cur
  -- the estimate cur + floor(prev*x/w) + n fits when floor(prev*x/w) <= k,
  -- that is prev*x < (k+1)*w
  local allowed = force or (n <= a and k >= 0 and (prev <= k or mulcmp(prev, x, k + 1, wn) < 0))
  if allowed and commit and n > 0 then
    if st.st ~= ws then st.moved = true end
    st.st, st.cur, st.prev, st.dirty = ws, cur + n, prev, true
    ttl = tonumber(ARGV[b + 10]) + late
  end
  return allowed, cur, prev, 0, ttl
end
