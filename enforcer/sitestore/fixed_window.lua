-- Fixed window. State: st, the window's start (decimal ns), and cur, its count.
-- Parameters: the start of the window containing now, the ms until it ends, and the ms
-- the window after it lasts. Reports r1 = the count in the current window.
local fixed_window = {fields = {'st', 'cur', 'prev'}, window_ttl = true}
function fixed_window.new(hk, lk, alg, w)
  return {hk = hk, lk = lk, alg = alg, w = w, ttl = 0, dirty = false, reset = false, moved = false,
    st = '', cur = 0, prev = 0}
end
function fixed_window.decide(st, b, n, a)
  local ws = ARGV[b + 6]
  local cur, late, ttl = 0, 0, 0
  if st.st == ws then
    cur = st.cur
  elseif after(st.st, ws) then
    -- A request stamped before the window a concurrent caller already started (it
    -- queued longer on its way here): it counts in that newer window, never resets it.
    ws, cur, late = st.st, st.cur, tonumber(ARGV[b + 8])
  end
  local allowed = force or (n <= a and cur + n <= a)
  if allowed and commit and n > 0 then
    if st.st ~= ws then st.moved = true end
    st.st, st.cur, st.prev, st.dirty = ws, cur + n, 0, true
    ttl = tonumber(ARGV[b + 7]) + late
  end
  return allowed, cur, 0, 0, ttl
end
