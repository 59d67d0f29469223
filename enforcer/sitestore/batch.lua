-- streamlimit batch: the requests of concurrent callers in one atomic script call, each
-- decided as if it were its own call, one after the other (batch.go). Put together in Go:
-- this file follows script.lua and counter.lua (each without its closing call), after a
-- line that makes KEYS and ARGV chunk locals, which the loop below sets to each request's
-- part so that site_request and counter_request read it as their own.
--
-- ARGV[1] = number of requests; then three ARGV per request: its kind ('s' site scope,
-- 'c' global site counts), its number of keys and of arguments; then every request's
-- arguments in order. KEYS: every request's keys in order. Returns one reply per request,
-- as its own script would return it.
local BK, BA = KEYS, ARGV
local nreq = tonumber(BA[1])
local res = {}
local kb, ab = 0, 1 + 3 * nreq
for r = 1, nreq do
  local h = 1 + 3 * (r - 1)
  local nk, na = tonumber(BA[h + 2]), tonumber(BA[h + 3])
  local k, a = {}, {}
  for i = 1, nk do k[i] = BK[kb + i] end
  for i = 1, na do a[i] = BA[ab + i] end
  kb, ab = kb + nk, ab + na
  KEYS, ARGV = k, a
  if BA[h + 1] == 's' then
    res[r] = site_request()
  else
    res[r] = counter_request()
  end
end
return res
