-- One participant's report to a pool (package rlqs, share.go: assign is
-- this script in Go, step for step; a differential test holds them
-- together). KEYS[1]: the pool, a hash of participant -> "demand share prev
-- prevUntil expires". ARGV: participant, demand, ttl ms, grace ms,
-- hysteresis, and now in ms ('' for Redis TIME; tests only).
-- Returns {share, fair} as strings.
local function fmt(x) return string.format('%.17g', x) end
local now
if ARGV[6] ~= '' then
  now = tonumber(ARGV[6])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local id, demand = ARGV[1], tonumber(ARGV[2])
local ttl, grace, hyst = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local raw = redis.call('HGETALL', KEYS[1])
local es, dead, me = {}, {}, nil
for i = 1, #raw, 2 do
  local d, s, p, pu, ex = string.match(raw[i + 1], '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
  local e = {id = raw[i], demand = tonumber(d), share = tonumber(s), prev = tonumber(p),
             prevUntil = tonumber(pu), expires = tonumber(ex)}
  if e.expires == nil or e.demand == nil or e.share == nil or e.prev == nil or e.prevUntil == nil
     or e.expires <= now then
    dead[#dead + 1] = raw[i]
  else
    es[#es + 1] = e
    if e.id == id then me = e end
  end
end
for i = 1, #dead, 1000 do
  redis.call('HDEL', KEYS[1], unpack(dead, i, math.min(i + 999, #dead)))
end
if me == nil then
  me = {id = id, share = 0, prev = 0, prevUntil = 0}
  es[#es + 1] = me
end
me.demand = demand
table.sort(es, function(a, b)
  if a.demand ~= b.demand then return a.demand < b.demand end
  return a.id < b.id
end)

local n, remaining, fairOf = #es, 1.0, {}
for k = 1, n do
  local give = math.min(es[k].demand, remaining / (n - k + 1))
  fairOf[k] = give
  remaining = remaining - give
end
if remaining < 0 then remaining = 0 end
local used, need, fair = 0.0, 0.0, 0
for k = 1, n do
  local e = es[k]
  if e == me then
    fair = fairOf[k] + remaining / n
  else
    local c = e.share
    if e.prevUntil > now and e.prev > e.share then c = e.prev end
    used = used + c
    need = need + math.max(c, fairOf[k] + remaining / n)
  end
end
local avail = math.max(0, 1 - used)
local target = math.min(fair, avail)
if me.share > 0 and math.abs(target - me.share) <= hyst * me.share and me.share <= avail
   and me.share + need <= 1 then
  target = me.share
end
if target < me.share and me.prevUntil > now then
  target = me.share
end
if target < me.share then
  me.prev, me.prevUntil = me.share, now + grace
end
me.share = target
me.expires = now + ttl + grace
redis.call('HSET', KEYS[1], id,
  fmt(me.demand) .. ' ' .. fmt(me.share) .. ' ' .. fmt(me.prev) .. ' ' .. fmt(me.prevUntil) .. ' ' .. fmt(me.expires))
redis.call('PEXPIRE', KEYS[1], ttl + grace)
return {fmt(target), fmt(fair)}
