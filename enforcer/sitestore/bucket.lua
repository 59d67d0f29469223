-- The TAT family (token bucket, leaky bucket, GCRA). State: the TAT as (ts, tn) seconds
-- and nanoseconds plus tr/d of a nanosecond, d the allowance. Parameters: the capacity as
-- time (ns, rem) and n's span (ns, rem), rem in 1/allowance ns. Reports r1, r2 = max(TAT
-- - now, 0) as ns and rem.
local bucket = {fields = {'ts', 'tn', 'tr', 'd'}}
function bucket.new(hk, lk, alg, w)
  return {hk = hk, lk = lk, alg = alg, w = w, ttl = 0, dirty = false, reset = false, moved = false,
    ts = 0, tn = 0, tr = 0, d = 0}
end
function bucket.decide(st, b, n, a, c)
  if a > 0 and a ~= st.d then
    -- the allowance changed: keep the TAT, rescale its fraction of a nanosecond
    if st.d > 0 then st.tr = math.floor(st.tr * a / st.d) else st.tr = 0 end
    st.d = a
  end
  local allowed, r1, r2, ttl = false, 0, 0, 0
  if a <= 0 or c <= 0 then
    return n == 0, 0, 0, 0, 0
  end
  local cap_ns, cap_rem = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
  local d = (st.ts - now_s) * E9 + (st.tn - now_ns)
  if d >= 0 then r1, r2 = d, st.tr end
  local ons, orem = r1 + tonumber(ARGV[b + 8]), r2 + tonumber(ARGV[b + 9])
  if orem >= a then ons, orem = ons + 1, orem - a end
  allowed = force or (n <= c and not (cap_ns < ons or (cap_ns == ons and cap_rem < orem)))
  if allowed and commit and n > 0 then
    local tot = now_ns + ons
    local carry = math.floor(tot / E9)
    st.ts, st.tn, st.tr, st.d = now_s + carry, tot - carry * E9, orem, a
    st.dirty = true
    if orem > 0 then ons = ons + 1 end
    ttl = math.ceil(ons / 1000000)
  end
  return allowed, r1, r2, 0, ttl
end
