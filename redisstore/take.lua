-- take.lua: the request function of the Redis store, take(KEYS, ARGV). It
-- is appended to the exact-integer library and the algorithms
-- (redisstore/internal/luasrc), so the tables int and algo are in scope; the
-- store loads the whole as a function library (see store.go), where these
-- definitions run once, not on every call. It mirrors memstore's takeMany: every hit of the
-- request is evaluated first, then, if every enforced hit allows, all are
-- committed; otherwise nothing is consumed, a denying hit with block_for
-- starts its block, and hits that would have allowed report a peek.
--
-- ARGV: [1] now in ns ("" = Redis TIME), [2] mode ("t" take, "r" refund),
-- [3] the number of hits, then per hit: kind, rate, period, capacity,
-- interval, cost, shadow (0/1), block_for (ns, 0 = none), prev (1-based
-- index of the previous hit on the same state, 0 = none), and for a sketch
-- the depth and that many counter indexes. In refund mode two undo strings
-- per hit follow the hits (see refund below).
--
-- KEYS per hit: the state key (a string, or a list for sliding_log), or for
-- a sketch its meta key and the two window keys; then the block key if
-- block_for > 0.
--
-- Reply: 8 strings per hit: allowed, remaining, reset, retry (ns), block
-- time left (ns, 0 = not blocked), committed (0/1), and two undo strings.

local X = int
local step, log_step, log_append = algo.step, algo.log_step, algo.log_append
local slide_result, sketch_window = algo.slide_result, algo.sketch_window
local add_sat, zero_limit = algo.add_sat, algo.zero_limit
local MAXSWC = int.MAX_SLIDING_WINDOW_CAPACITY
local NS_PER_MS = 1000000
local MAXU32 = 4294967295

-- When the caller supplies now (tests, with a clock of their own), Redis
-- still expires keys on its own clock: an hour more keeps a state alive
-- for as long as the caller's clock needs it.
local TTL_SLACK = 0 -- set by take for each call

local function ttl_ms(at, now)
  local q = X.add(X.divceil(X.sub(at, now), NS_PER_MS), TTL_SLACK)
  if X.lt(q, 1) then q = 1 end
  return X.str(q)
end

local function zero_state(kind)
  if kind == 4 then return {a = 0, prev = 0, curr = 0} end
  return {a = 0, b = 0}
end

-- read_state returns the state of a table key as the algorithms see it (an
-- idle state is a fresh key) and the raw value.
local function read_state(kind, key, now)
  local v = redis.call('GET', key)
  if not v then return zero_state(kind), '' end
  if kind == 4 then
    local a, pv, cu = string.match(v, '^(%d+) (%d+) (%d+)$')
    if a then
      a = X.parse(a)
      if X.lt(now, a) then return {a = a, prev = X.parse(pv), curr = X.parse(cu)}, v end
    end
  else
    local a, b = string.match(v, '^(%d+) (%d+)$')
    if a then
      a = X.parse(a)
      if X.lt(now, a) then return {a = a, b = X.parse(b)}, v end
    end
  end
  return zero_state(kind), v
end

local function encode_state(kind, st)
  if kind == 4 then
    return X.str(st.a) .. ' ' .. X.str(st.prev) .. ' ' .. X.str(st.curr)
  end
  return X.str(st.a) .. ' ' .. X.str(st.b)
end

-- write_raw stores a raw state value with the TTL of its idle-at time, or
-- deletes the key when the value is empty or already idle.
-- a is the value's idle-at time when the caller knows it, else nil.
local function write_raw(key, v, now, a)
  if v ~= '' then
    if not a then a = X.parse(string.match(v, '^(%d+)') or '') end
    if a and X.lt(now, a) then
      redis.call('SET', key, v, 'PX', ttl_ms(a, now))
      return
    end
  end
  redis.call('DEL', key)
end

local function read_log(key)
  local raw = redis.call('LRANGE', key, 0, -1)
  local es = {}
  for i = 1, #raw do
    local at, n = string.match(raw[i], '^(%d+) (%d+)$')
    if at then es[#es + 1] = {at = X.parse(at), n = X.parse(n)} end
  end
  return es
end

-- window_parity returns 0 or 1: which of the sketch's two window keys holds
-- the window starting at ws.
local function window_parity(ws, per)
  local q = X.divmod(ws, per)
  local _, r = X.divmod(q, 2)
  return r
end

local function bitfield_read(key, cells)
  local args = {'BITFIELD_RO', key}
  for i = 1, #cells do
    args[#args + 1] = 'GET'
    args[#args + 1] = 'u32'
    args[#args + 1] = '#' .. cells[i]
  end
  local vals = redis.call(unpack(args))
  local m = MAXU32
  for i = 1, #vals do
    if vals[i] < m then m = vals[i] end
  end
  return m, vals
end

-- read_meta returns a sketch's latest window start (nil if none) and its
-- write sequence number, from its meta key: "start seq".
local function read_meta(key)
  local v = redis.call('GET', key)
  if not v then return nil, 0 end
  local ws, seq = string.match(v, '^(%d+) (%d+)$')
  if not ws then return nil, 0 end
  return X.parse(ws), tonumber(seq)
end

-- sketch_prepare brings the sketch's windows forward to now (as
-- CMSketch.rotate does on every Check) and records on o the keys of the
-- evaluation window and its start and elapsed time.
local function sketch_prepare(o, now)
  local per = o.p.period
  local start, seq = read_meta(o.meta)
  local ws, e, rel = sketch_window(per, start, now)
  local cur
  if rel == 'back' then cur = start else cur = ws end
  o.parity = window_parity(cur, per)
  if o.parity == 0 then
    o.curk, o.prevk = o.k0, o.k1
  else
    o.curk, o.prevk = o.k1, o.k0
  end
  if rel == 'next' then
    redis.call('DEL', o.curk)
  elseif rel == 'reset' then
    redis.call('DEL', o.k0, o.k1)
  end
  if rel == 'next' or rel == 'reset' then
    redis.call('SET', o.meta, X.str(ws) .. ' ' .. seq, 'PX', ttl_ms(add_sat(now, add_sat(per, per)), now))
  end
  o.ws, o.e = ws, e
end

local function sketch_check(o, now, n)
  local p = o.p
  local per = p.period
  if X.eq(p.rate, 0) then
    return zero_limit(n, X.sub(add_sat(o.ws, per), now))
  end
  local curr = bitfield_read(o.curk, o.cells)
  local prev = bitfield_read(o.prevk, o.cells)
  return slide_result(per, X.min(p.cap, MAXSWC), now, n, prev, curr, o.ws, o.e)
end

-- sketch_add counts n hits of o's key in the current window with the
-- conservative update, and returns the undo strings of a refund: the
-- sketch's meta value after this add, and the window's parity
-- followed by every changed counter and its old value.
local function sketch_add(o, now, n)
  local est, vals = bitfield_read(o.curk, o.cells)
  local add = MAXU32
  if X.lt(n, MAXU32) then add = n end
  local target = math.min(est + add, MAXU32)
  local args = {'BITFIELD', o.curk}
  local undo = {tostring(o.parity)}
  for i = 1, #o.cells do
    if vals[i] < target then
      args[#args + 1] = 'SET'
      args[#args + 1] = 'u32'
      args[#args + 1] = '#' .. o.cells[i]
      args[#args + 1] = tostring(target)
      undo[#undo + 1] = o.cells[i] .. ':' .. vals[i]
    end
  end
  if #args > 2 then redis.call(unpack(args)) end
  local ttl = ttl_ms(add_sat(now, add_sat(o.p.period, o.p.period)), now)
  local start, seq = read_meta(o.meta)
  seq = seq + 1
  local meta = X.str(start or o.ws) .. ' ' .. seq
  redis.call('SET', o.meta, meta, 'PX', ttl)
  redis.call('PEXPIRE', o.curk, ttl)
  return meta, table.concat(undo, ' ')
end

-- fields splits a raw state value into its numbers (as strings).
local function fields(v)
  local t = {}
  for f in string.gmatch(v, '%d+') do t[#t + 1] = f end
  return t
end

-- refund_window takes back from a window counter (fixed window: B; sliding
-- window: curr) what a take counted, if the counter is still in the window
-- the take counted in. before and after are what the take read and wrote.
local function refund_window(o, cur, before, after)
  local c, b, w = fields(cur), fields(before), fields(after)
  if c[1] ~= w[1] then return end
  local idx = 2
  if o.kind == 4 then idx = 3 end
  local took = X.parse(w[idx])
  if b[1] == w[1] then took = X.sub(took, X.parse(b[idx])) end
  c[idx] = X.str(X.sub(X.parse(c[idx]), took))
  redis.call('SET', o.key, table.concat(c, ' '), 'KEEPTTL')
end

local function commits(o)
  return o.r.allowed and not X.eq(o.cost, 0) and not o.untl
end

-- take decides one request; see the top of this file.
local function take(KEYS, ARGV)
  if ARGV[1] ~= '' then TTL_SLACK = 3600000 else TTL_SLACK = 0 end
  local now
  if ARGV[1] ~= '' then
    now = X.parse(ARGV[1])
  else
    local t = redis.call('TIME')
    now = X.add(X.mul(X.parse(t[1]), 1000000000), X.mul(X.parse(t[2]), 1000))
  end
  if not X.lt(now, X.MAXI64) then now = X.sub(X.MAXI64, 1) end
  local mode = ARGV[2]
  local nhits = tonumber(ARGV[3])

  local ops = {}
  local a, k = 4, 1
  for i = 1, nhits do
    local kind = tonumber(ARGV[a])
    local o = {
      kind = kind,
      p = {kind = kind, rate = X.parse(ARGV[a + 1]), period = X.parse(ARGV[a + 2]),
           cap = X.parse(ARGV[a + 3]), interval = X.parse(ARGV[a + 4])},
      cost = X.parse(ARGV[a + 5]),
      shadow = ARGV[a + 6] == '1',
      blockfor = X.parse(ARGV[a + 7]),
      prev = tonumber(ARGV[a + 8]),
    }
    a = a + 9
    if mode == 'r' then o.cost = 0 end
    if kind == 6 then
      local depth = tonumber(ARGV[a])
      o.cells = {}
      for j = 1, depth do o.cells[j] = ARGV[a + j] end
      a = a + depth + 1
      o.meta, o.k0, o.k1 = KEYS[k], KEYS[k + 1], KEYS[k + 2]
      k = k + 3
    else
      o.key = KEYS[k]
      k = k + 1
    end
    if not X.eq(o.blockfor, 0) then
      o.bkey = KEYS[k]
      k = k + 1
    end
    ops[i] = o
  end

  -- refund ---------------------------------------------------------------------
  --
  -- Undo the consumption of a take whose request another slot denied. For a
  -- state key: if it still holds what the take wrote, the value before it is
  -- restored; a window counter changed since by others is decremented in the
  -- same window; anything else stays (the state errs towards denying). For a
  -- sliding log the hits are taken off the entry they were logged in. Sketch
  -- counters are put back if no other hit was added to the sketch since;
  -- otherwise they stay.

  if mode == 'r' then
    for i = nhits, 1, -1 do
      local o = ops[i]
      local before, after = ARGV[a + 2 * (i - 1)], ARGV[a + 2 * (i - 1) + 1]
      if o.kind <= 4 and after ~= '' then
        local cur = redis.call('GET', o.key)
        if cur == after then
          write_raw(o.key, before, now)
        elseif cur and (o.kind == 0 or o.kind == 4) then
          refund_window(o, cur, before, after)
        end
      elseif o.kind == 6 and before ~= '' then
        -- before: the sketch's meta value (window start and sequence
        -- number) after the take's add; if no add and no rotation came
        -- since, put the counters back and step the number back.
        local start, seq = read_meta(o.meta)
        if start and redis.call('GET', o.meta) == before then
          local parity, cells = string.match(after, '^(%d) ?(.*)$')
          local key = o.k0
          if parity == '1' then key = o.k1 end
          local args = {'BITFIELD', key}
          for cell, old in string.gmatch(cells, '(%d+):(%d+)') do
            args[#args + 1] = 'SET'
            args[#args + 1] = 'u32'
            args[#args + 1] = '#' .. cell
            args[#args + 1] = old
          end
          if #args > 2 then redis.call(unpack(args)) end
          redis.call('SET', o.meta, X.str(start) .. ' ' .. (seq - 1), 'KEEPTTL')
        end
      elseif o.kind == 5 and before ~= '' then
        -- before: the time of the entry the hits went into; after: their number
        local raw = redis.call('LRANGE', o.key, 0, -1)
        for j = #raw, 1, -1 do
          local at, n = string.match(raw[j], '^(%d+) (%d+)$')
          if at == before then
            local left = X.sub(X.parse(n), X.parse(after))
            if X.eq(left, 0) then
              redis.call('LSET', o.key, j - 1, '-')
              redis.call('LREM', o.key, 1, '-')
            else
              redis.call('LSET', o.key, j - 1, at .. ' ' .. X.str(left))
            end
            break
          end
        end
      end
    end
  end

  -- evaluate -------------------------------------------------------------------

  local allowed = true
  for i = 1, nhits do
    local o = ops[i]
    if o.bkey then
      local v = redis.call('GET', o.bkey)
      if v then
        local u = X.parse(v)
        if X.lt(now, u) then o.untl = u end
      end
    end
    local q = nil
    if o.prev > 0 then q = ops[o.prev] end
    if o.kind <= 4 then
      if q and commits(q) then
        o.base, o.raw = q.next, q.written
      elseif q then
        o.base, o.raw = q.base, q.raw
      else
        o.base, o.raw = read_state(o.kind, o.key, now)
      end
      if o.untl then
        o.r = {allowed = false, remaining = 0, reset = 0, retry = 0}
      else
        o.next, o.r = step(o.p, o.base, now, o.cost)
        if commits(o) then o.written = encode_state(o.kind, o.next) end
      end
    elseif o.kind == 5 then
      if q and commits(q) then
        o.log = log_append(q.log, q.expired, now, q.cost)
      elseif q then
        o.log = q.log
      else
        o.log = read_log(o.key)
      end
      if o.untl then
        o.r = {allowed = false, remaining = 0, reset = 0, retry = 0}
      else
        o.expired, o.r = log_step(o.p, o.log, now, o.cost)
      end
    else
      o.pend = 0
      if q then
        o.pend = q.pend
        if commits(q) then o.pend = X.add(o.pend, q.cost) end
      end
      sketch_prepare(o, now)
      if o.untl then
        o.r = {allowed = false, remaining = 0, reset = 0, retry = 0}
      else
        o.r = sketch_check(o, now, X.add(o.cost, o.pend))
      end
    end
    if not o.r.allowed and not o.shadow then allowed = false end
  end

  -- commit ---------------------------------------------------------------------

  for i = 1, nhits do
    local o = ops[i]
    o.undo1, o.undo2 = '', ''
    if allowed and commits(o) then
      o.committed = true
      if o.kind <= 4 then
        o.undo1, o.undo2 = o.raw, o.written
        write_raw(o.key, o.written, now, o.next.a)
      elseif o.kind == 5 then
        local keep = #o.log - o.expired
        if o.expired > 0 then redis.call('LTRIM', o.key, o.expired, -1) end
        local last = o.log[#o.log]
        local at
        if keep > 0 and X.le(now, last.at) then
          at = last.at
          redis.call('LSET', o.key, -1, X.str(at) .. ' ' .. X.str(add_sat(last.n, o.cost)))
        else
          at = now
          redis.call('RPUSH', o.key, X.str(now) .. ' ' .. X.str(o.cost))
        end
        redis.call('PEXPIRE', o.key, ttl_ms(add_sat(at, o.p.period), now))
        o.undo1, o.undo2 = X.str(at), X.str(o.cost)
      else
        o.undo1, o.undo2 = sketch_add(o, now, o.cost)
      end
    elseif not o.r.allowed and not o.untl and o.bkey and not X.eq(o.cost, 0) then
      -- A denial (by an enforced limit, or by a shadow limit that reports
      -- what enforcing it would do) starts a block_for penalty.
      o.untl = add_sat(now, o.blockfor)
      redis.call('SET', o.bkey, X.str(o.untl), 'PX', ttl_ms(o.untl, now))
    end
  end

  if not allowed then
    -- Nothing was consumed: a hit that would have allowed reports the state as
    -- it stands, as a peek at what the first hit on its state saw.
    for i = 1, nhits do
      local o = ops[i]
      if o.r.allowed and not o.untl and not X.eq(o.cost, 0) then
        local first = o
        while first.prev > 0 do first = ops[first.prev] end
        if o.kind <= 4 then
          local _, r = step(o.p, first.base, now, 0)
          o.r = r
        elseif o.kind == 5 then
          local _, r = log_step(o.p, first.log, now, 0)
          o.r = r
        else
          o.r = sketch_check(o, now, 0)
        end
      end
    end
  end

  local out = {}
  for i = 1, nhits do
    local o = ops[i]
    local r = o.r
    local left = '0'
    if o.untl then left = X.str(X.sub(o.untl, now)) end
    local ok = '0'
    if r.allowed and not o.untl then ok = '1' end
    local c = '0'
    if o.committed then c = '1' end
    out[#out + 1] = ok
    out[#out + 1] = X.str(r.remaining)
    out[#out + 1] = X.str(r.reset)
    out[#out + 1] = X.str(r.retry)
    out[#out + 1] = left
    out[#out + 1] = c
    out[#out + 1] = o.undo1
    out[#out + 1] = o.undo2
  end
  return out
end
