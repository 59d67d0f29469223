-- streamlimit batch: the requests of concurrent callers in one atomic script call, each
-- decided as if it were its own call, one after the other (batch.go). Put together in Go:
-- this file follows script.lua and counter.lua (each without its closing call), whose
-- site_request and counter_request read a request's part of KEYS and ARGV at the offsets
-- they are given.
--
-- ARGV[1] = number of requests; then one ARGV per request, its kind ('s' site scope, 'c'
-- global site counts); then every request's arguments in order. KEYS: every request's keys
-- in order. A request's numbers of keys and arguments follow from its own arguments (its
-- number of ops, and whether it is a write back). Returns one reply per request, as its
-- own script would return it.
local nreq = tonumber(ARGV[1])
local res = {}
local kb, ab = 0, 1 + nreq
for r = 1, nreq do
  local nops = tonumber(ARGV[ab + 2])
  if ARGV[1 + r] == 's' then
    nops = tonumber(ARGV[ab + 6])
    res[r] = site_request(kb, ab)
    local wb = 0
    if ARGV[ab + 5] == '2' then wb = 1 end
    kb, ab = kb + 2 * nops + wb, ab + 6 + 10 * nops + wb
  else
    res[r] = counter_request(kb, ab)
    local wb = 0
    if ARGV[ab + 1] == '2' then wb = 1 end
    kb, ab = kb + nops + wb, ab + 2 + 10 * nops + wb
  end
end
return res
