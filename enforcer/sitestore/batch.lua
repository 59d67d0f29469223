-- streamlimit batch: the requests of concurrent callers in one atomic script call, each
-- decided as if it were its own call, one after the other (batch.go). Put together in Go:
-- this file follows script.lua and counter.lua (each without its closing call), whose
-- site_request and counter_request read a request's part of KEYS and ARGV at the offsets
-- they are given.
--
-- ARGV[1] = number of requests; then one ARGV per request, its kind ('s' site scope, 'c'
-- global site counts, 'j' both of one request); then every request's arguments in order.
-- KEYS: every request's keys in order. A request's numbers of keys and arguments follow
-- from its own arguments (its number of ops, and whether it is a write back). Returns one
-- reply per request, as its own script would return it.
--
-- A 'j' request is a commit of global site counts followed by a site-scope take, each with
-- its own keys and arguments, decided all or nothing: the counts are checked against their
-- caps; only if every one fits are the site limits decided (and taken if they all admit);
-- only if they are taken are the counts added. Its reply is {the counter's reply, the site
-- reply}, the site reply empty when the counts did not fit and the site limits were not
-- asked.
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
  elseif ARGV[1 + r] == 'j' then
    local sk, sa = kb + nops, ab + 2 + CA * nops
    local sn = tonumber(ARGV[sa + 6])
    local out, matched, rw, rh, rat = counter_check(kb, ab)
    local site = {}
    if matched then
      site = site_request(sk, sa)
      if site[1] == 1 then counter_add(kb, ab, matched, rw, rh, rat) end
    end
    res[r] = {out, site}
    kb, ab = sk + 2 * sn, sa + 6 + 10 * sn
  else
    res[r] = counter_request(kb, ab)
    local wb = 0
    if ARGV[ab + 1] == '2' then wb = 1 end
    kb, ab = kb + nops + wb, ab + 2 + 10 * nops + wb
  end
end
return res
