-- take.lua: the request function of the Redis store, take(KEYS, ARGV). It
-- is appended to the exact-integer library, the algorithms and their fast
-- paths (redisstore/internal/luasrc), so the tables int, algo and fast are
-- in scope; the store loads the whole as a function library (see library.go),
-- where these definitions run once, not on every call. It mirrors
-- memstore's takeMany: every hit of the request is evaluated first, then,
-- if every enforced hit allows, all are committed; otherwise nothing is
-- consumed, a denying hit with block_for starts its block, and hits that
-- would have allowed report a peek. Sliding logs drop their expired entries
-- either way (algo.Log.Commit).
--
-- Each hit is decided by fast.lua in plain numbers when its case allows
-- (the common one), else by algo.lua's exact arithmetic; both give the same
-- answers and write the same states.
--
-- In order: the helpers that read and write states, sliding logs,
-- sketches and permits; the clock; the lean paths of a request of one hit (decide1,
-- sketch1, log1); the general path, in steps (read_hits, refund,
-- evaluate, commit, reply) and one function a mode (take_all, take_each,
-- refund); decide, which chooses; settle, a reservation's settlement;
-- permits, the release and renewal of permits; and take, the entry.
--
-- ARGV: [1] "mode hits [now]": the mode ("t" take, "u" take and return
-- undo strings, "r" refund, "e" each: the hits decided one by one, as
-- memstore's TakeEach, a denied hit with room left consumed past its
-- limit (algo.overdraw), a peek at a state in debt denied; "s" settle a
-- reservation, "x" release permits and "n" renew them, with arguments and
-- replies of their own: see settle and permits), the number of
-- hits, and now in ns (absent: Redis TIME); then two per hit: its spec
-- (the limit: see luasrc/spec.go; parsed once and cached) and "cost prev"
-- (prev: 1-based index of the previous hit on the same state, 0 = none),
-- followed for a sketch by its counter indexes, and for a Concurrency
-- limit (kind 7) by a third argument, the permit's ID. In refund mode two
-- undo strings per hit follow the hits (see refund below).
--
-- KEYS per hit: the state key (a string, a list for sliding_log, a sorted
-- set for a Concurrency limit's permits), or for a sketch its meta key and
-- the two window keys; then the block key if the limit has block_for.
--
-- Reply: per hit, "allowed remaining reset retry left committed" (ns;
-- left: block time left, 0 = not blocked) as six integers when all are
-- plain numbers (below 2^53), which costs Redis far less than formatting
-- them, or, for a hit allowed and committed with retry and left 0, as two,
-- -1 - remaining and reset; otherwise as one string of the six, followed
-- for the first hit on a Concurrency limit's key that dropped expired
-- permits by their number. In modes "u" and "r" then two undo strings per
-- hit.

local X = int
local step, log_step, log_commit = algo.step, algo.log_step, algo.log_commit
local overdraw, overdraws, log_step_each = algo.overdraw, algo.overdraws, algo.log_step_each
local charges_exhausted, overdraws_exhausted = algo.charges_exhausted, algo.overdraws_exhausted
local slide_result, sketch_window = algo.slide_result, algo.sketch_window
local slide_result_each = algo.slide_result_each
local add_sat, zero_limit = algo.add_sat, algo.zero_limit
local MAXSWC = int.MAX_SLIDING_WINDOW_CAPACITY
local NS_PER_MS = 1000000
local MAXU32 = 4294967295
local E9 = 1000000000
local tonumber, format, match, concat = tonumber, string.format, string.match, table.concat
local call = redis.call

-- When the caller supplies now (tests, with a clock of their own), Redis
-- still expires keys on its own clock: an hour more keeps a state alive
-- for as long as the caller's clock needs it.
local TTL_SLACK = 0 -- set by take for each call

-- ttl_ms is the time to live of a state idle at now + d (d in ns, a plain
-- number): whole milliseconds, rounded up, as a string (Redis would
-- format a number with %.17g, which costs more).
local function ttl_ms(d)
  local q = fast.dmc(d, NS_PER_MS) + TTL_SLACK
  if q < 1 then q = 1 end
  return format('%d', q)
end

-- ttl_ms_x is ttl_ms for an exact idle time at and now.
local function ttl_ms_x(at, now)
  local q = X.add(X.divceil(X.sub(at, now), NS_PER_MS), TTL_SLACK)
  if X.lt(q, 1) then q = 1 end
  return X.str(q)
end

-- str formats a result's number: plain, or int.lua's (int.NEVER included).
local function str(x)
  if x + 0 == x then return format('%d', x) end
  return X.str(x)
end

-- fast_step returns the fast path's step (fast.lua) for a state kind
-- (0-4) of the class cls, nil if it has none.
local function fast_step(kind, cls)
  if cls == 'W' and kind == 0 then return fast.fixed end
  if cls == 'W' and kind == 4 then return fast.sliding end
  if cls == 'G' and kind >= 1 and kind <= 3 then return fast.gcra end
  if cls == 'D' and kind == 1 then return fast.discrete end
  return nil
end

-- specs caches the parsed specs by their string: a limit's spec is the same
-- on every call, and parsing it costs more than a decision.
local specs, nspecs = {}, 0

-- spec parses "kind rate period cap interval shadow block_for class a b c
-- d debit offset" (see luasrc/spec.go): the exact Params for algo.lua, and the fast
-- path's quantities for the class (W window, G gcra, D discrete, L log, -
-- none) and its step for a state kind (sp.fast).
local function spec(s)
  local sp = specs[s]
  if sp then return sp end
  local f, k = {}, 0
  for w in string.gmatch(s, '%S+') do
    k = k + 1
    f[k] = w
  end
  local kind = tonumber(f[1])
  sp = {
    kind = kind,
    p = {kind = kind, rate = X.parse(f[2]), period = X.parse(f[3]), cap = X.parse(f[4]), interval = X.parse(f[5]), offset = X.parse(f[14] or '0'), debit = f[13] == '1'},
    shadow = f[6] == '1',
    blockfor = X.parse(f[7]),
    cls = f[8],
    rate = tonumber(f[2]), -- plain: rates and capacities are at most 2^44
    cap = tonumber(f[4]),
  }
  sp.block = not X.eq(sp.blockfor, 0)
  sp.fast = fast_step(kind, sp.cls)
  sp.ce = charges_exhausted(sp.p)
  local a, b, c, d = tonumber(f[9]), tonumber(f[10]), tonumber(f[11]), tonumber(f[12])
  if sp.cls == 'W' then
    sp.wk, sp.wn, sp.per, sp.c, sp.us = a, b, c, math.min(sp.cap, MAXSWC), d == 1
  elseif sp.cls == 'G' then
    sp.R, sp.Pp, sp.tolp, sp.g = a, b, c, d
  elseif sp.cls == 'D' then
    sp.a, sp.ik, sp.iN, sp.iv = a, b, c, d
  elseif sp.cls == 'L' then
    sp.per = a
  end
  if nspecs >= 4096 then specs, nspecs = {}, 0 end
  specs[s] = sp
  nspecs = nspecs + 1
  return sp
end

-- reqs caches the parsed "cost prev [counters]" of hits: a few strings
-- ("1 0") make almost every call without a sketch, and a sketch's key
-- comes back with the same counters.
local reqs, nreqs = {}, 0

local function zero_state(kind)
  if kind == 4 then return {a = 0, prev = 0, curr = 0} end
  return {a = 0, b = 0}
end

-- parse_state returns the state of a raw table value as the algorithms see
-- it (an idle state is a fresh key).
local function parse_state(kind, v, now)
  if not v then return zero_state(kind) end
  if kind == 4 then
    local a, pv, cu = match(v, '^(%d+) (%d+) (%d+)$')
    if a then
      a = X.parse(a)
      if X.lt(now, a) then return {a = a, prev = X.parse(pv), curr = X.parse(cu)} end
    end
  else
    local a, b = match(v, '^(%d+) (%d+)$')
    if a then
      a = X.parse(a)
      if X.lt(now, a) then return {a = a, b = X.parse(b)} end
    end
  end
  return zero_state(kind)
end

local function encode_state(kind, st)
  if kind == 4 then
    return X.str(st.a) .. ' ' .. X.str(st.prev) .. ' ' .. X.str(st.curr)
  end
  return X.str(st.a) .. ' ' .. X.str(st.b)
end

-- write_raw stores a raw state value with the TTL of its idle-at time, or
-- deletes the key when the value is empty or already idle (refunds).
local function write_raw(key, v, now)
  if v and v ~= '' then
    local a = X.parse(match(v, '^(%d+)') or '')
    if a and X.lt(now, a) then
      call('SET', key, v, 'PX', ttl_ms_x(a, now))
      return
    end
  end
  call('DEL', key)
end

-- Sliding logs are lists: a header "cnt sum seen nat nn exp" (the number
-- of entries, their total, the log's Seen time, the newest entry's time and
-- count, and when the TTL last set on the list ends), then the entries "at
-- n", oldest first. The TTL is set at two periods past the newest entry,
-- and renewed only when an entry would outlive it: once a period, not on
-- every request; a log lives at most a period longer than it must.

local function parse_header(v)
  if not v then return nil end
  local cnt, sum, seen, nat, nn, exp = match(v, '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')
  if not cnt then return nil end
  return {cnt = cnt, sum = sum, seen = seen, nat = nat, nn = nn, exp = exp}
end

-- read_log reads a whole log for algo.log_step: {entries=, sum=, seen=}.
local function read_log(key)
  local raw = call('LRANGE', key, 0, -1)
  local h = parse_header(raw[1])
  local es = {}
  if not h then return {entries = es, sum = 0, seen = 0, junk = raw[1] ~= nil} end
  for i = 2, #raw do
    local at, n = match(raw[i], '^(%d+) (%d+)$')
    if at then es[#es + 1] = {at = X.parse(at), n = X.parse(n)} end
  end
  return {entries = es, sum = X.parse(h.sum), seen = X.parse(h.seen), exp = h.exp}
end

-- write_log applies a commit to a log list: drop the first e entries, put
-- the header hdr, then append: "m" (merge: the last entry becomes ent),
-- "a" (append ent) or nil; existed says whether the list exists, ttl
-- (ms) renews its expiry when set; existed nil: a list to replace. A log
-- left empty is deleted.
local function write_log(key, existed, e, left, hdr, op, ent, ttl)
  if left == 0 and not op then
    call('DEL', key)
    return
  end
  if not existed then
    if existed == nil then call('DEL', key) end -- a list that is no log
    call('RPUSH', key, hdr, ent)
  else
    if e > 0 then
      call('LSET', key, e, hdr)
      call('LTRIM', key, e, -1)
    else
      call('LSET', key, 0, hdr)
    end
    if op == 'm' then
      call('LSET', key, -1, ent)
    elseif op == 'a' then
      call('RPUSH', key, ent)
    end
  end
  if ttl then call('PEXPIRE', key, ttl) end
end

-- commit_log_x writes log2 = log_commit(log, e, now, n) of the exact path.
local function commit_log_x(key, log, e, now, n, per)
  local log2, changed = log_commit(log, e, now, n)
  if not changed then return end
  local es = log2.entries
  local left = #es
  if left == 0 then
    call('DEL', key)
    return
  end
  local last = es[left]
  local exp = log.exp or '0'
  local op, ent, ttl
  if not X.eq(n, 0) then
    ent = X.str(last.at) .. ' ' .. X.str(last.n)
    if left == #log.entries - e then op = 'm' else op = 'a' end
    local until_x = add_sat(last.at, add_sat(per, per))
    ttl, exp = ttl_ms_x(until_x, now), X.str(until_x)
  end
  local hdr = left .. ' ' .. X.str(log2.sum) .. ' ' .. X.str(log2.seen) .. ' ' .. X.str(last.at) .. ' ' .. X.str(last.n) .. ' ' .. exp
  local existed = #log.entries > 0
  if log.junk then existed = nil end
  write_log(key, existed, e, left, hdr, op, ent, ttl)
end

-- A Concurrency limit's permits are a sorted set: each permit's ID scored
-- by its expiry in whole milliseconds (algo.permit_expiry makes them so;
-- a double holds any of them exactly), with a TTL to its latest expiry
-- and one period more, so that a key its holders abandoned disappears a
-- period after it, and a hit meanwhile finds the expired permits and
-- counts them. A permit expired at now is held no more: the request's
-- first hit on a key drops them (nothing the set answers at now or later
-- changes), and so do a renewal and a release; the replies say how many
-- (the store counts them: expired, never released).

local MS = 1000000 -- a millisecond in ns, the scores' unit

-- drop_permits drops the permits of key expired at now (exact) and
-- returns how many it dropped.
local function drop_permits(key, now)
  return call('ZREMRANGEBYSCORE', key, '-inf', X.str(X.div(now, MS)))
end

-- permit_of returns the expiry in ns (exact) of id's permit in key, 0 if
-- it holds none.
local function permit_of(key, id)
  local sc = call('ZSCORE', key, id)
  if not sc then return 0 end
  return X.mul(X.parse(sc), MS)
end

-- read_permits returns how many permits key holds and the earliest
-- expiry among them (ns, exact; 0 for none).
local function read_permits(key)
  local held = call('ZCARD', key)
  local e = call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local earliest = 0
  if e[2] then earliest = X.mul(X.parse(e[2]), MS) end
  return held, earliest
end

-- hold_permit holds id's permit in key until exp (ns, exact, whole
-- milliseconds), the key living at least a period per (ns) longer, as at
-- now, and returns the score it wrote.
local function hold_permit(key, id, exp, per, now)
  local sc = X.str(X.div(exp, MS))
  call('ZADD', key, sc, id)
  local ttl = ttl_ms_x(add_sat(exp, per), now)
  if call('PTTL', key) < tonumber(ttl) then call('PEXPIRE', key, ttl) end
  return sc
end

-- window_parity returns 0 or 1: which of the sketch's two window keys holds
-- the window starting at ws.
local function window_parity(ws, per)
  local q = X.divmod(ws, per)
  local _, r = X.divmod(q, 2)
  return r
end

-- bitfield_read returns the least of the counters that rd (BITFIELD_RO
-- arguments, the key left blank) names in key, and their values.
local function bitfield_read(key, rd)
  rd[2] = key
  local vals = call(unpack(rd))
  local m = MAXU32
  for i = 1, #vals do
    if vals[i] < m then m = vals[i] end
  end
  return m, vals
end

-- read_meta returns a sketch's latest window start (a decimal string, nil
-- if none) and its write sequence number, from its meta key: "start seq".
local function read_meta(key)
  local v = call('GET', key)
  if not v then return nil, 0 end
  local ws, seq = match(v, '^(%d+) (%d+)$')
  if not ws then return nil, 0 end
  return ws, tonumber(seq)
end

-- raise_counters raises to target the counters rd (BITFIELD_RO
-- arguments: see bitfield_read) names in key, the cells of a sketch whose
-- values are vals (nil: all 0): the conservative update. undo, when
-- given, collects "cell:old" for every counter changed. It returns
-- whether every counter was 0 (the key may be new, without a TTL).
local function raise_counters(key, rd, cells, vals, target, undo)
  local ts = format('%d', target)
  local args = {'BITFIELD', key}
  local fresh = true
  for j = 1, #cells do
    local v = vals and vals[j] or 0
    if v > 0 then fresh = false end
    if v < target then
      args[#args + 1] = 'SET'
      args[#args + 1] = 'u32'
      args[#args + 1] = rd[3 * j + 2]
      args[#args + 1] = ts
      if undo then undo[#undo + 1] = cells[j] .. ':' .. v end
    end
  end
  if #args > 2 then call(unpack(args)) end
  return fresh
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
  call('SET', o.key, concat(c, ' '), 'KEEPTTL')
end

local function commits(o)
  return (o.r.allowed or o.r.overdrawn) and o.cost ~= 0 and not o.blocked
end

-- fast_each reports whether a fast path's result r for a hit of cost n
-- of the limit sp stands in mode "e": a peek may meet a debt, a denial
-- with room left overdraws, and so does a denial that finds a limit that
-- charges an exhausted one (sp.ce) exhausted but not in debt (a debit
-- limit, in debt or not), which only the exact path decides (fast.fixed
-- says when the window is in debt).
local function fast_each(r, n, sp)
  if n == 0 then return false end
  if r.allowed then return true end
  local m = r.remaining
  if not (m + 0 == m and m < 1) then return false end
  -- Only fast.fixed says owed (results may share a scratch table).
  return not sp.ce or sp.kind == 0 and r.owed == true and not sp.p.debit
end

-- overdrawn is the result of an overdrawn hit from after, a hit of cost 1
-- on the state it left (algo.Overdraw).
local function overdrawn(after)
  return {allowed = false, remaining = 0, reset = after.reset, retry = after.retry, overdrawn = true}
end

local BLOCKED = {allowed = false, remaining = 0, reset = 0, retry = 0}

-- The clock of the request in progress: now = S*1e9 + F (S nil outside
-- the fast path's domain), and now exact (int.lua), made on demand by
-- now_x.
local S, F, now

-- now_x returns now exact, for the exact path.
local function now_x()
  if not now then now = X.add(X.mul(S, E9), F) end
  if not X.lt(now, X.MAXI64) then now = X.sub(X.MAXI64, 1) end
  return now
end

-- clock sets the clock: given (a decimal ns time, the caller's clock) or
-- Redis TIME ('').
local function clock(given)
  S, F, now = nil, nil, nil
  if given ~= '' then
    TTL_SLACK = 3600000
    S, F = fast.clock(given)
    now = X.parse(given)
    now_x()
    return
  end
  TTL_SLACK = 0
  local t = call('TIME')
  S, F = tonumber(t[1]), tonumber(t[2]) * 1000
  if S < 1000000000 or S >= 9000000000 then
    now = X.add(X.mul(X.parse(t[1]), E9), F)
    S = nil
    now_x()
  end
end

-- log_key is the key of the sliding log that more_entries reads.
local log_key

-- more_entries appends to raw, a log list's first elements (its header
-- then entries), as many more as it holds: the entries fast.log_step
-- reads beyond the first few.
local function more_entries(raw)
  local got = #raw - 1
  local more = call('LRANGE', log_key, got + 1, got + got + 2)
  for m = 1, #more do raw[got + 1 + m] = more[m] end
end

-- log_header parses the header of raw, a log list's first elements, for
-- fast.log_step: the header (nil for no list) and whether the fast path
-- can take it.
local function log_header(raw)
  if not raw[1] then return nil, true end
  local hs = parse_header(raw[1])
  if not hs or #hs.sum > 15 or #hs.nn > 15 then return nil, false end
  local h = {cnt = tonumber(hs.cnt), sum = tonumber(hs.sum), seen = fast.rel(hs.seen, S, F),
             nat = fast.rel(hs.nat, S, F), nn = tonumber(hs.nn), exp = fast.rel(hs.exp, S, F), hs = hs}
  if not h.seen or not h.nat then return nil, false end
  return h, true
end

-- log_write_fast commits what fast.log_step found for a log: the first e
-- entries dropped, then n hits (n > 0) logged at t, or none; live is the
-- total of the entries left. It returns the undo strings of a refund: the
-- entry's time and n.
local function log_write_fast(key, per, h, e, t, live, n)
  local cnt = 0
  if h then cnt = h.cnt end
  local left = cnt - e
  local ts = fast.abs(S, F, t)
  if n == 0 then
    if e == 0 then return '', '' end
    local hs = h.hs
    write_log(key, true, e, left, left .. ' ' .. format('%d', live) .. ' ' .. ts .. ' ' .. hs.nat .. ' ' .. hs.nn .. ' ' .. hs.exp, nil, nil, nil)
    return '', ''
  end
  -- Renew the TTL only when the newest entry would outlive it.
  local ttl, exp = nil, nil
  if h and h.exp and h.exp >= t + per then
    exp = h.hs.exp
  else
    ttl, exp = ttl_ms(t + per + per), fast.abs(S, F, t + per + per)
  end
  local op, ent
  if left > 0 and h.nat == t then
    ent = ts .. ' ' .. format('%d', h.nn + n)
    op = 'm'
  else
    ent = ts .. ' ' .. format('%d', n)
    op = 'a'
    left = left + 1
  end
  write_log(key, h ~= nil, e, left, left .. ' ' .. format('%d', live + n) .. ' ' .. ts .. ' ' .. ent .. ' ' .. exp, op, ent, ttl)
  return ts, format('%d', n)
end

-- scratch holds decide1's result, used before the next.
local scratch = {allowed = false, remaining = 0, reset = 0, retry = 0}

-- reply1 appends to out the answer of a lean path's hit, which is never
-- blocked: allowed ok (0 or 1), the result r (plain numbers but retry,
-- which may be int.NEVER), committed c (0 or 1). See answer.
local function reply1(out, ok, r, c)
  local rty = r.retry
  if c == 1 and rty == 0 then
    -- Allowed and committed, the most common answer: two integers.
    local n = #out
    out[n + 1], out[n + 2] = -1 - r.remaining, r.reset
  elseif rty + 0 == rty then
    local n = #out
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] = ok, r.remaining, r.reset, rty, 0, c
  else
    out[#out + 1] = ok .. ' ' .. str(r.remaining) .. ' ' .. str(r.reset) .. ' ' .. str(rty) .. ' 0 ' .. c
  end
end

-- decide1 decides, if it can, a request of one hit of a table kind
-- without block_for on the fast path, as decide would, with none of its
-- bookkeeping: most requests are such. It returns false when it cannot,
-- having changed nothing.
local function decide1(KEYS, k, ARGV, a, out, each)
  local sp = specs[ARGV[a]] or spec(ARGV[a])
  local fn = sp.fast
  if not fn or sp.block then return false end
  local rq = reqs[ARGV[a + 1]]
  if not rq or rq[2] ~= 0 then return false end
  local cost, key = rq[1], KEYS[k]
  local r, w, ttl = fn(sp, call('GET', key), S, F, cost, scratch)
  if not r or (each and not fast_each(r, cost, sp)) then return false end
  local ok, c = 0, 0
  if r.allowed then
    ok = 1
    if cost ~= 0 then
      c = 1
      if ttl then
        call('SET', key, w, 'PX', ttl_ms(ttl))
      else
        call('SET', key, w, 'KEEPTTL')
      end
    end
  end
  reply1(out, ok, r, c)
  return true
end

-- sketch1 decides, if it can, a request of one hit of a sketch without
-- block_for on the fast path, as decide would, with none of its
-- bookkeeping. It returns false when it cannot; it may then have rotated
-- the sketch's windows, which decide finds done.
local function sketch1(KEYS, k, ARGV, a, out)
  local sp = spec(ARGV[a])
  if sp.kind ~= 6 or sp.block or sp.cls ~= 'W' then return false end
  local rq = reqs[ARGV[a + 1]]
  if not rq or rq[2] ~= 0 or not rq[3] then return false end
  local meta, k0, k1 = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  local start, seq = read_meta(meta)
  local e, wsr, rel = fast.sketch_window(sp, start, S, F)
  if not rel then return false end
  local parity, ws_s
  if rel == 'back' then
    ws_s = start
    parity = fast.parity(sp, start)
  else
    parity = fast.parity_now(sp, S, F)
  end
  local curk, prevk = k0, k1
  if parity == 1 then curk, prevk = k1, k0 end
  local ttl2 = nil
  if rel == 'next' or rel == 'reset' then
    if rel == 'next' then call('DEL', curk) else call('DEL', k0, k1) end
    ws_s = fast.abs(S, F, wsr)
    ttl2 = ttl_ms(sp.per + sp.per)
    call('SET', meta, ws_s .. ' ' .. seq, 'PX', ttl2)
    start = ws_s
  end
  local cells, rd = rq[3], rq[4]
  local n = rq[1]
  local prev, curr, vals = 0, 0, nil
  if sp.rate ~= 0 then
    if rel ~= 'next' and rel ~= 'reset' then curr, vals = bitfield_read(curk, rd) end
    if rel ~= 'reset' then prev = bitfield_read(prevk, rd) end
  end
  local r
  if sp.rate == 0 then
    r = scratch
    r.allowed, r.remaining, r.reset, r.retry = n == 0, 0, wsr + sp.per, 0
    if n ~= 0 then r.retry = X.NEVER end
  else
    r = fast.slide(sp, prev, curr, e, wsr, n, scratch)
    if not r then return false end
  end
  local ok, c = 0, 0
  if r.allowed then
    ok = 1
    if n ~= 0 then
      c = 1
      -- Count the hits in the current window with the conservative update.
      local target = math.min(curr + math.min(n, MAXU32), MAXU32)
      local fresh = raise_counters(curk, rd, cells, vals, target, nil)
      call('SET', meta, start .. ' ' .. (seq + 1), 'KEEPTTL')
      if fresh then call('PEXPIRE', curk, ttl2 or ttl_ms(sp.per + sp.per)) end
    end
  end
  reply1(out, ok, r, c)
  return true
end

-- log1 decides, if it can, a request of one hit of a sliding log without
-- block_for on the fast path, as decide would, with none of its
-- bookkeeping. It returns false when it cannot, having changed nothing.
local function log1(KEYS, k, ARGV, a, out)
  local sp = spec(ARGV[a])
  if sp.kind ~= 5 or sp.block or sp.cls ~= 'L' then return false end
  local rq = reqs[ARGV[a + 1]]
  if not rq or rq[2] ~= 0 then return false end
  local key, n = KEYS[k], rq[1]
  local raw = call('LRANGE', key, 0, 2)
  local h, ok = log_header(raw)
  if not ok then return false end
  log_key = key
  local r, e, t, live = fast.log_step(sp, h, raw, 1, more_entries, S, F, n, scratch)
  if not r then return false end
  local c = 0
  if r.allowed and n ~= 0 then
    c = 1
    log_write_fast(key, sp.per, h, e, t, live, n)
  elseif e > 0 then
    log_write_fast(key, sp.per, h, e, t, live, 0)
  end
  local ok2 = 0
  if r.allowed then ok2 = 1 end
  reply1(out, ok2, r, c)
  return true
end

-- The general path: whatever the lean paths do not take (several hits,
-- chained hits on one state, block_for, the exact arithmetic, the modes
-- "u" and "r", a sketch or a sliding log in mode "e"). A hit is an
-- op, a table that collects what evaluating, committing and answering it
-- learn: its spec (sp), kind, Params (p), cost, prev (the index of the
-- previous hit on the same state, 0 = none) and keys, then its result r,
-- the state it read and would write, whether it committed, and its undo
-- strings.

-- read_req returns the parsed "cost prev [counters]" of a hit: {cost,
-- prev, cells, rd} (a sketch's counters, and the BITFIELD_RO arguments
-- that read them), cached in reqs.
local function read_req(req)
  local rq = reqs[req]
  if rq then return rq end
  local cost, prev, rest = match(req, '^(%d+) (%d+) ?(.*)$')
  rq = {tonumber(cost), tonumber(prev)}
  if rest ~= '' then
    local cells = fields(rest)
    local rd = {'BITFIELD_RO', ''}
    for j = 1, #cells do
      rd[#rd + 1] = 'GET'
      rd[#rd + 1] = 'u32'
      rd[#rd + 1] = '#' .. cells[j]
    end
    rq[3], rq[4] = cells, rd
  end
  if nreqs >= 16384 then reqs, nreqs = {}, 0 end
  reqs[req] = rq
  nreqs = nreqs + 1
  return rq
end

-- read_hits returns the ops of a request's nhits hits, whose keys start at
-- KEYS[k] and hits at ARGV[a] (costs of 0 when peek is set), the indexes
-- after them, and whether a hit follows another on the same state.
local function read_hits(KEYS, k, ARGV, a, nhits, peek)
  local ops, chained = {}, false
  for i = 1, nhits do
    local sp = spec(ARGV[a])
    local rq = read_req(ARGV[a + 1])
    a = a + 2
    local o = {sp = sp, kind = sp.kind, p = sp.p, cost = rq[1], prev = rq[2], shadow = sp.shadow}
    if peek then o.cost = 0 end
    if o.prev > 0 then chained = true end
    if sp.kind == 6 then
      o.cells, o.rd = rq[3], rq[4]
      o.meta, o.k0, o.k1 = KEYS[k], KEYS[k + 1], KEYS[k + 2]
      k = k + 3
    else
      o.key = KEYS[k]
      k = k + 1
    end
    if sp.kind == 7 then
      o.id = ARGV[a]
      a = a + 1
    end
    if sp.block then
      o.bkey = KEYS[k]
      k = k + 1
    end
    ops[i] = o
  end
  return ops, k, a, chained
end

-- first_hit returns the first hit of the request on o's state.
local function first_hit(ops, o)
  while o.prev > 0 do o = ops[o.prev] end
  return o
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

-- refund_state undoes a take on a state key: before and after are the
-- values the take read and wrote.
local function refund_state(o, before, after)
  local cur = call('GET', o.key)
  if cur == after then
    write_raw(o.key, before, now)
  elseif cur and (o.kind == 0 or o.kind == 4) then
    refund_window(o, cur, before, after)
  end
end

-- refund_sketch undoes a take's add to a sketch: before is the sketch's
-- meta value (window start and sequence number) after the add, after the
-- window's parity and the changed counters' old values. If no add and no
-- rotation came since, it puts the counters back and steps the number
-- back.
local function refund_sketch(o, before, after)
  local start, seq = read_meta(o.meta)
  if not start or call('GET', o.meta) ~= before then return end
  local parity, cells = match(after, '^(%d) ?(.*)$')
  local key = o.k0
  if parity == '1' then key = o.k1 end
  local args = {'BITFIELD', key}
  for cell, old in string.gmatch(cells, '(%d+):(%d+)') do
    args[#args + 1] = 'SET'
    args[#args + 1] = 'u32'
    args[#args + 1] = '#' .. cell
    args[#args + 1] = old
  end
  if #args > 2 then call(unpack(args)) end
  call('SET', o.meta, start .. ' ' .. (seq - 1), 'KEEPTTL')
end

-- refund_log undoes a take on a sliding log: before is the time of the
-- entry the hits went into, after their number. It takes them off that
-- entry (and off the header's total), and the entry off the log if none
-- are left.
local function refund_log(o, before, after)
  local raw = call('LRANGE', o.key, 0, -1)
  local h = parse_header(raw[1])
  if not h then return end
  for j = #raw, 2, -1 do
    local at, n = match(raw[j], '^(%d+) (%d+)$')
    if at == before then
      local took = X.parse(after)
      local left = X.sub(X.parse(n), took)
      local cnt = tonumber(h.cnt)
      local nat, nn = h.nat, h.nn
      if X.eq(left, 0) then
        call('LSET', o.key, j - 1, '-')
        call('LREM', o.key, 1, '-')
        cnt = cnt - 1
        if j == #raw then
          if j > 2 then nat, nn = match(raw[j - 1], '^(%d+) (%d+)$') else nat, nn = '0', '0' end
        end
      else
        call('LSET', o.key, j - 1, at .. ' ' .. X.str(left))
        if j == #raw then nn = X.str(left) end
      end
      if cnt == 0 then
        call('DEL', o.key)
      else
        call('LSET', o.key, 0, cnt .. ' ' .. X.str(X.sub(X.parse(h.sum), took)) .. ' ' .. h.seen .. ' ' .. nat .. ' ' .. nn .. ' ' .. h.exp)
      end
      return
    end
  end
end

-- refund_permit undoes a take's permit: before is the score the take
-- found for it ("-": none), after the score it wrote. If the permit still
-- has that score, it is removed, or its score put back.
local function refund_permit(o, before, after)
  local cur = call('ZSCORE', o.key, o.id)
  if not cur or not X.eq(X.parse(cur), X.parse(after)) then return end
  if before == '-' then
    call('ZREM', o.key, o.id)
  else
    call('ZADD', o.key, before, o.id)
  end
end

-- undo_takes undoes the takes of ops, last first, from their undo strings,
-- two a hit from ARGV[a] on (empty: the hit consumed nothing).
local function undo_takes(ops, ARGV, a)
  now_x()
  for i = #ops, 1, -1 do
    local o = ops[i]
    local before, after = ARGV[a + 2 * (i - 1)], ARGV[a + 2 * (i - 1) + 1]
    if o.kind <= 4 and after ~= '' then
      refund_state(o, before, after)
    elseif o.kind == 6 and before ~= '' then
      refund_sketch(o, before, after)
    elseif o.kind == 5 and before ~= '' then
      refund_log(o, before, after)
    elseif o.kind == 7 and before ~= '' then
      refund_permit(o, before, after)
    end
  end
end

-- evaluate -------------------------------------------------------------------
--
-- Every hit is evaluated in order, on the state the previous hit on it
-- (q) would leave if it commits: on the fast path when its spec has one
-- and fastok (no chained hits), else exactly. In mode "e" (each) the hits
-- are decided one by one: a denial with room left overdraws, and so does
-- one that finds a limit that charges an exhausted one exhausted but not
-- in debt (algo.Overdraw, OverdrawsExhausted).

-- read_block sets o.blocked and o.left (the time left) when o's key is
-- serving a block_for penalty.
local function read_block(o, fastok)
  local v = call('GET', o.bkey)
  if not v then return end
  local d = fastok and fast.rel(v, S, F)
  if d then
    if d > 0 then o.blocked, o.left = true, d end
  else
    local u = X.parse(v)
    if u and X.lt(now_x(), u) then o.blocked, o.left = true, X.sub(u, now) end
  end
end

-- evaluate_state evaluates a hit on a state key (kinds 0-4): its result
-- and the state to write if it commits (o.written; o.next, exact).
local function evaluate_state(o, q, fastok, each)
  local sp = o.sp
  local fn = fastok and sp.fast
  if fn and o.blocked then
    o.r = BLOCKED
    return
  elseif fn then
    o.raw = call('GET', o.key)
    local r, w, ttl = fn(sp, o.raw, S, F, o.cost)
    if r and (not each or fast_each(r, o.cost, sp)) then
      o.r, o.written, o.ttl, o.fast = r, w, ttl, fn
      return
    end
  end
  now_x()
  if q and commits(q) then
    o.base, o.raw = q.next, q.written
  elseif q then
    o.base, o.raw = q.base, q.raw
  else
    if o.raw == nil then o.raw = call('GET', o.key) end
    o.base = parse_state(o.kind, o.raw, now)
  end
  if o.blocked then
    o.r = BLOCKED
    return
  end
  if each then
    o.next, o.r = overdraw(o.p, o.base, now, o.cost)
  else
    o.next, o.r = step(o.p, o.base, now, o.cost)
  end
  if commits(o) then o.written = encode_state(o.kind, o.next) end
end

-- evaluate_log evaluates a hit on a sliding log: its result, the entries
-- out of the window (o.expired), and what committing needs (the fast
-- path's header and time, or the exact log).
local function evaluate_log(o, q, fastok, each)
  local sp = o.sp
  if o.blocked then
    -- A blocked key's log is not read, and drops nothing.
    o.r, o.expired = BLOCKED, 0
    if not fastok then o.log = read_log(o.key) end
    return
  end
  if fastok and sp.cls == 'L' then
    local raw = call('LRANGE', o.key, 0, 2)
    local h, ok = log_header(raw)
    if ok then
      log_key = o.key
      local r, e, t, live = fast.log_step(sp, h, raw, 1, more_entries, S, F, o.cost)
      if r and (not each or fast_each(r, o.cost, sp)) then
        o.r, o.expired, o.t, o.h, o.live, o.fast = r, e, t, h, live, true
        o.rawlog = raw
        return
      end
    end
  end
  now_x()
  if q and commits(q) then
    o.log = log_commit(q.log, q.expired, now, q.cost)
  elseif q then
    o.log = q.log
  else
    o.log = read_log(o.key)
  end
  if not each then
    o.expired, o.r = log_step(o.p, o.log, now, o.cost)
    return
  end
  o.expired, o.r = log_step_each(o.p, o.log, now, o.cost)
  if overdraws(o.r, o.cost) or sp.ce and not o.r.allowed and overdraws_exhausted(o.p, o.r, o.cost, function()
        return not select(2, log_step_each(o.p, o.log, now, 0)).allowed
      end) then
    o.r.overdrawn = true
  end
end

-- rotate_sketch brings a sketch's windows forward to now, as
-- CMSketch.rotate does on every Check: it finds the window of now (o.ws_s,
-- its parity, and its key o.curk, the previous window's o.prevk), clears
-- the windows that are over and records a new window's start in the meta
-- key. It returns the time elapsed in the window, the window's start
-- relative to now (fast path; exact: o.wsx, o.ex) and how it rotated
-- ("same", "back", "next", "reset").
local function rotate_sketch(o, fastok)
  local sp = o.sp
  local start, seq = read_meta(o.meta)
  o.seq = seq
  local per = o.p.period
  local e, wsr, rel
  if fastok and sp.cls == 'W' then
    e, wsr, rel = fast.sketch_window(sp, start, S, F)
  end
  if rel then
    if rel == 'back' then o.ws_s = start else o.ws_s = fast.abs(S, F, wsr) end
    o.parity = fast.parity(sp, o.ws_s)
  else
    now_x()
    local st = nil
    if start then st = X.parse(start) end
    local ws
    ws, e, rel = sketch_window(per, st, now)
    local cur = ws
    if rel == 'back' then cur = st end
    o.ws_s = X.str(ws)
    o.parity = window_parity(cur, per)
    o.wsx, o.ex = ws, e
  end
  if o.parity == 0 then
    o.curk, o.prevk = o.k0, o.k1
  else
    o.curk, o.prevk = o.k1, o.k0
  end
  if rel == 'next' then
    call('DEL', o.curk)
  elseif rel == 'reset' then
    call('DEL', o.k0, o.k1)
  end
  if o.ex then
    o.ttl2 = ttl_ms_x(add_sat(now, add_sat(per, per)), now)
  else
    o.ttl2 = ttl_ms(sp.per + sp.per)
  end
  o.start = start
  if rel == 'next' or rel == 'reset' then
    call('SET', o.meta, o.ws_s .. ' ' .. seq, 'PX', o.ttl2)
    o.start = o.ws_s
  end
  return e, wsr, rel
end

-- read_sketch returns the key's estimates in a sketch's previous and
-- current windows (none for a zero limit), keeping the current window's
-- counters in o.vals. Windows just cleared hold nothing: it does not read
-- them.
local function read_sketch(o, rel)
  local prev, curr = 0, 0
  if o.sp.rate == 0 then return prev, curr end
  if rel ~= 'next' and rel ~= 'reset' then
    curr, o.vals = bitfield_read(o.curk, o.rd)
  else
    o.vals = {}
    for j = 1, #o.cells do o.vals[j] = 0 end
  end
  if rel ~= 'reset' then
    prev = bitfield_read(o.prevk, o.rd)
  end
  return prev, curr
end

-- sketch_result is the result of n hits against a sketch's estimates prev
-- and curr, e into the window that starts wsr from now: on the fast path
-- when it can, else exactly (setting o.wsx, o.ex).
local function sketch_result(o, n, prev, curr, e, wsr)
  local sp, per = o.sp, o.p.period
  if o.ex then
    if sp.rate == 0 then return zero_limit(n, X.sub(add_sat(o.wsx, per), now)) end
    return slide_result(per, X.min(o.p.cap, MAXSWC), now, n, prev, curr, o.wsx, o.ex)
  end
  if sp.rate == 0 then
    if n == 0 then
      return {allowed = true, remaining = 0, reset = wsr + sp.per, retry = 0}
    end
    return {allowed = false, remaining = 0, reset = wsr + sp.per, retry = X.NEVER}
  end
  local r = fast.slide(sp, prev, curr, e, wsr, n)
  if r then return r end
  now_x()
  local ws = X.parse(o.ws_s)
  o.wsx, o.ex = ws, e
  return slide_result(per, X.min(o.p.cap, MAXSWC), now, n, prev, curr, ws, e)
end

-- sketch_each decides a sketch hit one by one (mode "e"), exactly, when
-- its answer may differ from sketch_result's: a peek may meet a debt, a
-- denial with room left overdraws, and so does one that finds a limit
-- charged after the fact exhausted but not in debt (CheckEach). Any other
-- answer is the same either way.
local function sketch_each(o, n, prev, curr, e)
  local sp, per = o.sp, o.p.period
  if sp.rate == 0 or
      not (n == 0 or not o.r.allowed and o.cost ~= 0 and (sp.ce or not X.lt(o.r.remaining, 1))) then
    return
  end
  now_x()
  local ws = o.wsx or X.parse(o.ws_s)
  o.wsx, o.ex = ws, o.ex or e
  local c = X.min(o.p.cap, MAXSWC)
  o.r = slide_result_each(per, c, now, n, prev, curr, ws, o.ex)
  if overdraws(o.r, o.cost) or sp.ce and not o.r.allowed and overdraws_exhausted(o.p, o.r, o.cost, function()
        return not slide_result_each(per, c, now, o.pend, prev, curr, ws, o.ex).allowed
      end) then
    o.r.overdrawn = true
  end
end

-- evaluate_sketch evaluates a hit on a sketch: its windows are brought
-- forward to now, then the request, with the hits of this request on the
-- same key before it (o.pend), is checked against the key's estimates.
local function evaluate_sketch(o, q, fastok, each)
  o.pend = 0
  if q then
    o.pend = q.pend
    if commits(q) then o.pend = o.pend + q.cost end
  end
  local e, wsr, rel = rotate_sketch(o, fastok)
  if o.blocked then
    o.r = BLOCKED
    return
  end
  local n = o.cost + o.pend
  local prev, curr = read_sketch(o, rel)
  o.r = sketch_result(o, n, prev, curr, e, wsr)
  if each then sketch_each(o, n, prev, curr, e) end
  o.sk = {e = e, wsr = wsr, prev = prev, curr = curr}
end

-- evaluate_permit evaluates a Concurrency hit (algo.permit_step, exactly)
-- on the set it finds: the stored one, its expired permits dropped by the
-- request's first hit on the key (o.held, o.earliest), with the permits
-- of the earlier hits of the request on it that commit (o.pexp), in
-- order, as memstore's permitView adds them. o.sold is the stored expiry
-- of its own ID.
local function evaluate_permit(ops, o)
  now_x()
  local first = first_hit(ops, o)
  if first == o then
    o.dropped = drop_permits(o.key, now)
    o.held, o.earliest = read_permits(o.key)
  end
  o.sold = permit_of(o.key, o.id)
  local s = {held = first.held, earliest = first.earliest, old = o.sold}
  local chain, q = {}, o
  while q.prev > 0 do
    q = ops[q.prev]
    chain[#chain + 1] = q
  end
  local pend = {}
  for c = #chain, 1, -1 do
    local j = chain[c]
    if not X.eq(j.pexp, 0) then
      if pend[j.id] == nil and X.eq(j.sold, 0) then s.held = X.add(s.held, 1) end
      pend[j.id] = j.pexp
      if X.eq(s.earliest, 0) or X.lt(j.pexp, s.earliest) then s.earliest = j.pexp end
    end
  end
  if pend[o.id] then s.old = pend[o.id] end
  o.r, o.pexp = algo.permit_step(o.p, s, now, o.cost)
end

-- evaluate evaluates every hit of ops and reports whether every enforced
-- one allows.
local function evaluate(ops, fastok, each)
  local allowed = true
  for i = 1, #ops do
    local o = ops[i]
    if o.bkey then read_block(o, fastok) end
    local q = nil
    if o.prev > 0 then q = ops[o.prev] end
    if o.kind <= 4 then
      evaluate_state(o, q, fastok, each)
    elseif o.kind == 5 then
      evaluate_log(o, q, fastok, each)
    elseif o.kind == 7 then
      -- Decided by itself, in mode "e" too: no debt, no block_for.
      evaluate_permit(ops, o)
    else
      evaluate_sketch(o, q, fastok, each)
    end
    if not o.r.allowed and not o.shadow then allowed = false end
  end
  return allowed
end

-- commit ---------------------------------------------------------------------
--
-- A hit that commits writes what evaluating it found, and keeps the undo
-- strings of a refund (o.undo1, o.undo2): for a state key the values
-- before and after; for a sliding log the entry's time and the hits; for
-- a sketch its meta value after the add, and the window's parity followed
-- by every changed counter and its old value; for a permit the score it
-- had ("-": none) and the one written.

-- commit_state writes a hit's new state to its key.
local function commit_state(o)
  o.undo1, o.undo2 = o.raw, o.written
  if o.fast and o.ttl then
    call('SET', o.key, o.written, 'PX', ttl_ms(o.ttl))
  elseif o.fast then
    -- The same window as the stored state: its TTL is already the
    -- window's end.
    call('SET', o.key, o.written, 'KEEPTTL')
  else
    write_raw(o.key, o.written, now)
  end
end

-- commit_log logs a hit's cost in its sliding log, dropping the expired
-- entries.
local function commit_log(o)
  if o.fast then
    o.undo1, o.undo2 = log_write_fast(o.key, o.sp.per, o.h, o.expired, o.t, o.live, o.cost)
  else
    local log2 = log_commit(o.log, o.expired, now, o.cost)
    commit_log_x(o.key, o.log, o.expired, now, o.cost, o.p.period)
    local last = log2.entries[#log2.entries]
    o.undo1, o.undo2 = X.str(last.at), X.str(o.cost)
    if o.r.overdrawn then
      local _, after = log_step(o.p, log2, now, 1)
      o.r = overdrawn(after)
    end
  end
  o.logdone = true
end

-- commit_sketch counts a hit's cost in the current window of its sketch
-- with the conservative update; touched holds the sketches (meta keys)
-- this request added to, undo whether to keep the undo strings. What
-- evaluate read stands unless another hit of this request added to the
-- sketch since.
local function commit_sketch(o, touched, undo)
  local est, vals, start, seq
  if touched[o.meta] or not o.vals then
    est, vals = bitfield_read(o.curk, o.rd)
    start, seq = read_meta(o.meta)
  else
    vals, start, seq = o.vals, o.start, o.seq
    est = MAXU32
    for j = 1, #vals do
      if vals[j] < est then est = vals[j] end
    end
  end
  touched[o.meta] = true
  local add = MAXU32
  if o.cost < MAXU32 then add = o.cost end
  local target = math.min(est + add, MAXU32)
  local changed = undo and {tostring(o.parity)}
  local fresh = raise_counters(o.curk, o.rd, o.cells, vals, target, changed)
  local meta = (start or o.ws_s) .. ' ' .. (seq + 1)
  -- The meta key's TTL was set when the window began (a rotation
  -- writes it), two periods on: as long as the window matters.
  call('SET', o.meta, meta, 'KEEPTTL')
  if fresh then call('PEXPIRE', o.curk, o.ttl2) end
  if changed then o.undo1, o.undo2 = meta, concat(changed, ' ') end
  if o.r.overdrawn then
    o.r = overdrawn(slide_result(o.p.period, X.min(o.p.cap, MAXSWC), now, 1, o.sk.prev, target, o.wsx, o.ex))
  end
end

-- commit_permit holds an admitted Concurrency hit's permit.
local function commit_permit(o)
  local before = call('ZSCORE', o.key, o.id)
  o.undo1, o.undo2 = before or '-', hold_permit(o.key, o.id, o.pexp, o.p.period, now)
end

-- start_block starts the block_for penalty of a hit's key.
local function start_block(o, fastok)
  local bf = o.sp.blockfor
  if fastok and bf + 0 == bf and bf < fast.P52 then
    o.blocked, o.left = true, bf
    call('SET', o.bkey, fast.abs(S, F, bf), 'PX', ttl_ms(bf))
  else
    now_x()
    local u = add_sat(now, bf)
    o.blocked, o.left = true, X.sub(u, now)
    call('SET', o.bkey, X.str(u), 'PX', ttl_ms_x(u, now))
  end
end

-- commit commits, when consume is set, every hit that commits (allowed,
-- or overdrawn, with a cost, not blocked), keeping undo strings when undo
-- is set; and starts the block_for penalty of every denied hit with a
-- cost, by an enforced limit or by a shadow limit that reports what
-- enforcing it would do.
local function commit(ops, consume, undo, fastok)
  local touched = {} -- the sketches (meta keys) added to
  for i = 1, #ops do
    local o = ops[i]
    if consume and commits(o) then
      o.committed = true
      if o.kind <= 4 then
        commit_state(o)
      elseif o.kind == 5 then
        commit_log(o)
      elseif o.kind == 7 then
        commit_permit(o)
      else
        commit_sketch(o, touched, undo)
      end
    end
    if not o.r.allowed and not o.blocked and o.bkey and o.cost ~= 0 then
      start_block(o, fastok)
    end
  end
end

-- drop_expired has the sliding logs on which nothing was logged drop their
-- expired entries all the same (algo.Log.Commit), so that the next request
-- need not read them.
local function drop_expired(ops)
  for i = 1, #ops do
    local o = ops[i]
    if o.kind == 5 and o.prev == 0 and o.expired and o.expired > 0 then
      local logged = false
      for j = i, #ops do
        if ops[j].logdone and first_hit(ops, ops[j]) == o then logged = true end
      end
      if not logged and o.fast then
        log_write_fast(o.key, o.sp.per, o.h, o.expired, o.t, o.live, 0)
      elseif not logged then
        commit_log_x(o.key, o.log, o.expired, now, 0, o.p.period)
      end
    end
  end
end

-- peek returns the result of a peek at o's state as the request found it,
-- before any commit: as first, the request's first hit on it, saw it. A
-- peek at a log reads no entry the request did not already read.
local function peek(o, first)
  if o.kind <= 4 and o.fast then
    return o.fast(o.sp, o.raw, S, F, 0)
  elseif o.kind <= 4 then
    local _, r = step(o.p, first.base, now, 0)
    return r
  elseif o.kind == 5 and o.fast then
    log_key = o.key
    return fast.log_step(o.sp, o.h, o.rawlog, 1, more_entries, S, F, 0)
  elseif o.kind == 5 then
    local _, r = log_step(o.p, first.log, now, 0)
    return r
  elseif o.kind == 7 then
    return (algo.permit_step(o.p, {held = first.held, earliest = first.earliest, old = o.sold}, now, 0))
  end
  local sk = o.sk
  if o.ex then
    return slide_result(o.p.period, X.min(o.p.cap, MAXSWC), now, 0, sk.prev, sk.curr, o.wsx, o.ex)
  end
  return fast.slide(o.sp, sk.prev, sk.curr, sk.e, sk.wsr, 0)
end

-- reply appends the answer of every hit to out, "allowed remaining reset
-- retry left committed" as six integers, or as a string (see the top of
-- this file) with, for the first hit of a request on a Concurrency
-- limit's key that dropped expired permits, " dropped"; then with undo
-- set two undo strings a hit.
local function reply(ops, out, undo)
  for i = 1, #ops do
    local o = ops[i]
    local r = o.r
    local ok = 0
    if r.allowed and not o.blocked then ok = 1 end
    local left = 0
    if o.blocked then left = o.left end
    local c = 0
    if o.committed then c = 1 end
    local rem, rst, rty = r.remaining, r.reset, r.retry
    local dropped = o.dropped and o.dropped > 0
    if not dropped and rem + 0 == rem and rst + 0 == rst and rty + 0 == rty and left + 0 == left then
      local n = #out
      out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] = ok, rem, rst, rty, left, c
    else
      out[#out + 1] = ok .. ' ' .. str(rem) .. ' ' .. str(rst) .. ' ' .. str(rty) .. ' ' .. str(left) .. ' ' .. c
      if dropped then out[#out] = out[#out] .. ' ' .. o.dropped end
    end
  end
  if not undo then return end
  for i = 1, #ops do
    out[#out + 1] = ops[i].undo1 or ''
    out[#out + 1] = ops[i].undo2 or ''
  end
end

-- The modes ------------------------------------------------------------------

-- take_all decides a request all-or-nothing (modes "t" and "u"): every
-- hit is evaluated, then, if every enforced hit allows, all are
-- committed; otherwise nothing is consumed, a denying hit with block_for
-- starts its block, and the hits that would have allowed and consumed
-- report a peek at their state as it stands.
local function take_all(ops, fastok, undo)
  local allowed = evaluate(ops, fastok, false)
  commit(ops, allowed, undo, fastok)
  drop_expired(ops)
  if allowed then return end
  for i = 1, #ops do
    local o = ops[i]
    if o.r.allowed and not o.blocked and o.cost ~= 0 then
      o.r = peek(o, first_hit(ops, o))
    end
  end
end

-- take_each decides the hits of a request one by one (mode "e"), as
-- memstore's TakeEach: each that allows, or overdraws, is committed
-- whatever the others answer.
local function take_each(ops, fastok)
  evaluate(ops, fastok, true)
  commit(ops, true, false, fastok)
  drop_expired(ops)
end

-- refund takes back a take whose request another slot denied (mode "r",
-- the undo strings from ARGV[a] on), then answers a peek at every hit's
-- state (ops have costs of 0: nothing commits, no block starts).
local function refund(ops, ARGV, a)
  undo_takes(ops, ARGV, a)
  evaluate(ops, false, false)
  drop_expired(ops)
end

-- decide decides one request of nhits hits in mode, whose keys start at
-- KEYS[k] and hits at ARGV[a], appending its reply to out; it returns the
-- indexes after them. A request of one hit without block_for takes a lean
-- path when it can.
local function decide(KEYS, k, ARGV, a, mode, nhits, out)
  if nhits == 1 and mode == 'e' and S then
    if decide1(KEYS, k, ARGV, a, out, true) then return k + 1, a + 2 end
  end
  if nhits == 1 and mode == 't' and S then
    if decide1(KEYS, k, ARGV, a, out, false) then return k + 1, a + 2 end
    if sketch1(KEYS, k, ARGV, a, out) then return k + 3, a + 2 end
    if log1(KEYS, k, ARGV, a, out) then return k + 1, a + 2 end
  end
  local ops, chained
  ops, k, a, chained = read_hits(KEYS, k, ARGV, a, nhits, mode == 'r')
  -- The fast path takes hits on their own; a request naming a state twice
  -- takes the exact path, which chains them.
  local fastok = S and not chained and mode ~= 'r'
  if mode == 'r' then
    refund(ops, ARGV, a)
    a = a + 2 * nhits
  elseif mode == 'e' then
    take_each(ops, fastok)
  else
    take_all(ops, fastok, mode == 'u')
  end
  reply(ops, out, mode == 'u' or mode == 'r')
  return k, a
end

-- settle settles a reservation (mode "s", sluice.Limiter.Settle) at now,
-- once: KEYS are the state key and the settlement's marker; ARGV[2] the
-- limit's spec, ARGV[3] "at reset reserved spent marker_ttl" (ns; the
-- marker's time to live in ms). A settlement whose marker exists was
-- applied before and answers "0"; otherwise the state is settled with
-- algo.settle and written as a take writes it, the marker set, and the
-- answer is the hits moved: charged, or "-" and refunded. One that moves
-- nothing writes nothing, not even its marker.
local function settle(KEYS, ARGV)
  local key, marker = KEYS[1], KEYS[2]
  if call('EXISTS', marker) == 1 then return '0' end
  local sp = spec(ARGV[2])
  local at, reset, reserved, spent, mttl = match(ARGV[3], '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
  if not at then error('settle: arguments ' .. ARGV[3]) end
  local kind = sp.kind
  local st = parse_state(kind, call('GET', key), now_x())
  local st2, charged, refunded = algo.settle(sp.p, st, now, X.parse(at), X.parse(reset), X.parse(reserved), X.parse(spent))
  if charged == 0 and refunded == 0 then return '0' end
  write_raw(key, encode_state(kind, st2), now)
  call('SET', marker, '1', 'PX', mttl)
  if refunded ~= 0 then return '-' .. str(refunded) end
  return str(charged)
end

-- permits releases (mode "x"), renews (mode "n") or hands over (mode
-- "h": renewals that add a permit not held whatever the room, the local
-- failure policy's permits given to the store) n permits at now:
-- KEYS are their keys, ARGV from 2 on two per permit, its limit's spec and
-- its ID. Each first drops the key's expired permits (a permit released
-- after its expiry was not released in time: it counts as expired, as
-- memstore counts it). A release then removes the permit, held or not,
-- and answers "1" or "0" (it was not held); a renewal extends the permit
-- if still held, or adds it back if the key has room (algo.permit_renew:
-- without room it is lost) and answers as a take does, "allowed
-- remaining reset retry 0 committed".
-- Either answer ends with " dropped" when it dropped expired permits.
local function permits(KEYS, ARGV, mode, n)
  local out = {}
  now_x()
  for i = 1, n do
    local key, id = KEYS[i], ARGV[2 * i + 1]
    local dropped = drop_permits(key, now)
    if mode == 'x' then
      out[i] = tostring(call('ZREM', key, id))
    else
      local sp = spec(ARGV[2 * i])
      local held, earliest = read_permits(key)
      local r, exp = algo.permit_renew(sp.p, {held = held, earliest = earliest, old = permit_of(key, id)}, now, mode == 'h')
      local ok, c = 0, 0
      if r.allowed then
        ok, c = 1, 1
        hold_permit(key, id, exp, sp.p.period, now)
      end
      out[i] = ok .. ' ' .. str(r.remaining) .. ' ' .. str(r.reset) .. ' ' .. str(r.retry) .. ' 0 ' .. c
    end
    if dropped > 0 then out[i] = out[i] .. ' ' .. dropped end
  end
  return out
end

-- heads caches the parsed headers of calls, "mode n [now]", and of a
-- batch's requests, "[e]hits keys args [now]" (see take), without a clock
-- of their own: a few strings ("b 9", "1 1 2") make almost every call,
-- and parsing one costs more than a table lookup. The two forms differ
-- (a call's starts with a letter other than e, a request's with e or a
-- digit), so they share the cache.
local heads, nheads = {}, 0

-- read_head parses a request's header into {mode, hits, keys, args, now}
-- (now: its own clock, '' for none), or with call set a call's into
-- {mode, n, nil, nil, now}, cached in heads when it has no clock.
local function read_head(h, call)
  local hd
  if call then
    local mode, n, given = match(h, '^(%a) (%d+) ?(%d*)$')
    if not mode then error('take: header ' .. h) end
    hd = {mode, tonumber(n), nil, nil, given}
  else
    local one, nhits, nk, na, own = match(h, '^(e?)(%d+) (%d+) (%d+) ?(%d*)$')
    if not one then error('take: request header ' .. h) end
    local m = 't'
    if one == 'e' then m = 'e' end
    hd = {m, tonumber(nhits), tonumber(nk), tonumber(na), own}
  end
  local own = hd[5]
  if own == '' then
    if nheads >= 1024 then heads, nheads = {}, 0 end
    heads[h] = hd
    nheads = nheads + 1
  end
  return hd
end

-- The batch in progress (take, run_batch): its KEYS, ARGV and answers,
-- the index bi of the next request of bn, where its keys and arguments
-- start (bk, ba), whether Redis TIME was read; and of the request being
-- decided, its hits, keys and arguments, and the answers before it.
local bK, bA, bout, bi, bn, bk, ba, btimed, bhits, bnk, bna, bbefore

-- run_batch decides the batch's requests from bi on, in order, until one
-- fails (an error reply on one of its keys: it raises the error, and take
-- answers that request's hits with it and calls run_batch again for the
-- rest) or none is left. One protected call for the batch, rather than
-- one a request, unless requests fail.
local function run_batch()
  local KEYS, ARGV, out = bK, bA, bout
  while bi <= bn do
    bhits = nil
    local hd = heads[ARGV[ba]] or read_head(ARGV[ba])
    local m, nhits, own = hd[1], hd[2], hd[5]
    bhits, bnk, bna, bbefore = nhits, hd[3], hd[4], #out
    if own ~= '' then
      clock(own)
    elseif not btimed then
      clock('')
      btimed = true
    end
    if not (nhits == 1 and S and decide1(KEYS, bk, ARGV, ba + 1, out, m == 'e')) then
      decide(KEYS, bk, ARGV, ba + 1, m, nhits, out)
    end
    bk, ba, bi = bk + bnk, ba + 1 + bna, bi + 1
  end
end

-- take decides the requests of one call: ARGV[1] is "mode hits [now]" for
-- one request, or "b requests [now]" for a batch of independent requests
-- (each all-or-nothing on its own, in mode "t", or "e"), each of which
-- starts with an argument "[e]hits keys args [now]" (its hits, the KEYS
-- and the further ARGV it takes, now: the request's own clock). See the
-- top of this file. A request of a batch that fails (an error reply on
-- one of its keys) is answered with "!error" for each of its hits; the
-- others are decided as if it were not there.
local function take(KEYS, ARGV)
  local hd = heads[ARGV[1]] or read_head(ARGV[1], true)
  local mode, n, given = hd[1], hd[2], hd[5]
  local out = {}
  if mode == 's' then
    clock(given)
    return settle(KEYS, ARGV)
  end
  if mode == 'x' or mode == 'n' or mode == 'h' then
    clock(given)
    return permits(KEYS, ARGV, mode, n)
  end
  if mode ~= 'b' then
    clock(given)
    decide(KEYS, 1, ARGV, 2, mode, n, out)
    return out
  end
  bK, bA, bout, bi, bn, bk, ba, btimed = KEYS, ARGV, out, 1, n, 1, 2, false
  while true do
    local ok, err = pcall(run_batch)
    if ok then break end
    if not bhits then
      bK, bA, bout = nil, nil, nil
      error(err) -- a malformed header: the call fails
    end
    for i = #out, bbefore + 1, -1 do out[i] = nil end
    if type(err) == 'table' then err = err.err end
    local reply = '!' .. tostring(err or 'error')
    for _ = 1, bhits do out[#out + 1] = reply end
    bk, ba, bi = bk + bnk, ba + 1 + bna, bi + 1
  end
  bK, bA, bout = nil, nil, nil
  return out
end
