-- driver.lua: the test driver appended to luasrc.Lib. ARGV[1] is the mode;
-- every further argument is one case (a trace, or operands) as
-- space-separated decimal tokens, and the reply has one string per case.
local mode = ARGV[1]
local parse, str = int.parse, int.str

-- words splits s at spaces and parses every token into an int.
local function words(s)
	local t, k = {}, 0
	for w in string.gmatch(s, "%S+") do
		k = k + 1
		if w == "-" then
			t[k] = false
		else
			t[k] = parse(w) or error("not an integer: " .. w)
		end
	end
	return t
end

local MT = getmetatable(int.MAXI64)
local floor, format, match = math.floor, string.format, string.match

-- canonical reports whether x is in int.lua's canonical form.
local function canonical(x)
	if type(x) == "number" then
		return x >= 0 and x < int.P53 and x == floor(x)
	end
	local n = #x
	if getmetatable(x) ~= MT or n < 3 or x[n] == 0 or (n == 3 and x[3] < 32) then
		return false
	end
	for i = 1, n do
		local l = x[i]
		if type(l) ~= "number" or l < 0 or l >= 16777216 or l ~= floor(l) then
			return false
		end
	end
	return true
end

-- f formats an int, checking its form.
local function f(x)
	if type(x) == "number" and x >= 0 and x < 1e15 and x == floor(x) then
		return format("%d", x)
	end
	if not canonical(x) then
		return "NONCANONICAL"
	end
	return str(x)
end

-- s formats ints, booleans and strings, checking the ints' form.
local function s(...)
	local out = { ... }
	for i = 1, select("#", ...) do
		local x = out[i]
		if type(x) == "boolean" then
			out[i] = x and "1" or "0"
		elseif type(x) ~= "string" then
			out[i] = f(x)
		end
	end
	return table.concat(out, " ")
end

local function result(r)
	return (r.allowed and "1 " or "0 ") .. f(r.remaining) .. " " .. f(r.reset) .. " " .. f(r.retry)
end

-- params reads "kind rate period cap x": x is the refill interval of a
-- token bucket and the window offset of a fixed or sliding window (each is zero in the
-- other kinds; see fmtParams).
local function params(w)
	local p = { kind = w[1], rate = w[2], period = w[3], cap = w[4], interval = w[5], offset = 0 }
	if int.eq(p.kind, 0) or int.eq(p.kind, 4) then
		p.interval, p.offset = 0, w[5]
	end
	return p
end

local function state_str(st, kind)
	if kind == 4 then
		return f(st.a) .. " " .. f(st.prev) .. " " .. f(st.curr)
	end
	return f(st.a) .. " " .. f(st.b)
end

local function entries_str(es)
	local out = {}
	for i = 1, #es do
		out[i] = f(es[i].at) .. " " .. f(es[i].n)
	end
	return table.concat(out, ",")
end

local cases = {}

-- int: "a b" -> results of every operation on the pair.
function cases.int(w)
	local a, b = w[1], w[2]
	local out = {
		s(int.add(a, b), int.sub(a, b), int.mul(a, b)),
		s(tostring(int.cmp(a, b)), int.lt(a, b), int.le(a, b), int.eq(a, b)),
		s(int.min(a, b), int.max(a, b), int.sat(a)),
	}
	if b ~= 0 then
		local q, r = int.divmod(a, b)
		out[#out + 1] = s(q, r, int.divceil(a, b), int.div(a, b), int.mod(a, b))
	end
	return table.concat(out, " ")
end

-- parse: a string, unsplit -> its canonical digits, or "nil".
function cases.parse(raw)
	local x = parse(raw)
	if x == nil then
		return "nil"
	end
	return s(x)
end

-- step: "kind rate period cap interval a b|prev curr (now n)..." -> one
-- line a step: the result, "=" when st2 is st else "*", and the state.
-- state_of reads the state after the params of w, for kind: the state and
-- the index of the first step.
local function state_of(w, kind)
	if kind == 4 then
		return { a = w[6], prev = w[7], curr = w[8] }, 9
	end
	return { a = w[6], b = w[7] }, 8
end

function cases.step(w)
	local p = params(w)
	local kind = p.kind
	local st, i = state_of(w, kind)
	local lines = {}
	local before = state_str(st, kind) -- to tell that step leaves st alone
	while w[i] do
		local now, n = w[i], w[i + 1]
		i = i + 2
		local st2, r = algo.step(p, st, now, n)
		local same = st2 == st and "=" or "*"
		local after = state_str(st2, kind)
		if (same == "=" and after or state_str(st, kind)) ~= before then
			same = "MUTATED"
		end
		if r.allowed then
			st, before = st2, after
		end
		lines[#lines + 1] = result(r) .. " " .. same .. " " .. after
	end
	return table.concat(lines, "\n")
end

-- overdraw: as step (with debit after the params), through
-- algo.overdraw: one line a step: the result,
-- "o" when overdrawn else "-", and the state after it (kept when allowed
-- or overdrawn).
function cases.overdraw(w)
	local p = params(w)
	-- After the params, debit (0 or 1), then the state as for step.
	p.debit = w[6] == 1
	table.remove(w, 6)
	local kind = p.kind
	local st, i = state_of(w, kind)
	local lines = {}
	while w[i] do
		local now, n = w[i], w[i + 1]
		i = i + 2
		local st2, r = algo.overdraw(p, st, now, n)
		if r.allowed or r.overdrawn then
			st = st2
		end
		lines[#lines + 1] = result(r) .. " " .. (r.overdrawn and "o" or "-") .. " " .. state_str(st, kind)
	end
	return table.concat(lines, "\n")
end

-- settle: "kind rate period cap x a b|prev curr" then ops, each "0 now n"
-- (algo.step, the state kept when allowed) or "1 now at reset reserved
-- spent" (algo.settle, the state kept) -> one line an op: for a step the
-- result, for a settlement the hits moved (charged, or minus refunded);
-- then the state after it. A settlement that changes its argument, or
-- both charges and refunds, says so.
function cases.settle(w)
	local p = params(w)
	local kind = p.kind
	local st, i = state_of(w, kind)
	local lines = {}
	while w[i] do
		local op = w[i]
		local line
		if op == 0 then
			local st2, r = algo.step(p, st, w[i + 1], w[i + 2])
			i = i + 3
			if r.allowed then
				st = st2
			end
			line = result(r)
		else
			local before = state_str(st, kind)
			local st2, charged, refunded = algo.settle(p, st, w[i + 1], w[i + 2], w[i + 3], w[i + 4], w[i + 5])
			i = i + 6
			if charged ~= 0 and refunded ~= 0 then
				line = "BOTH " .. s(charged, refunded)
			elseif refunded ~= 0 then
				line = "-" .. f(refunded)
			else
				line = f(charged)
			end
			if state_str(st, kind) ~= before then
				line = line .. " MUTATED"
			end
			st = st2
		end
		lines[#lines + 1] = line .. " " .. state_str(st, kind)
	end
	return table.concat(lines, "\n")
end

-- log: "kind rate period cap interval seen k (at n)*k (now n)..." -> one
-- line a step: expired, the result, then the log after its commit (every
-- step commits: the expired entries go, the hits of an allowed one are
-- logged): "seen sum" and its entries.
function cases.log(w)
	local p = params(w)
	local seen, k = w[6], w[7]
	local es = {}
	local sum = 0
	local i = 8
	for j = 1, k do
		es[j] = { at = w[i], n = w[i + 1] }
		sum = int.add_sat(sum, w[i + 1])
		i = i + 2
	end
	local log = { entries = es, sum = sum, seen = seen }
	local lines = {}
	while w[i] do
		local now, n = w[i], w[i + 1]
		i = i + 2
		local before = entries_str(log.entries) .. s(log.sum, log.seen)
		local expired, r = algo.log_step(p, log, now, n)
		local line = s(expired) .. " " .. result(r)
		local cost = 0
		if r.allowed then
			cost = n
		end
		local log2 = algo.log_commit(log, expired, now, cost)
		if entries_str(log.entries) .. s(log.sum, log.seen) ~= before then
			line = line .. " MUTATED"
		end
		log = log2
		lines[#lines + 1] = line .. " " .. s(log.seen, log.sum) .. " " .. entries_str(log.entries)
	end
	return table.concat(lines, "\n")
end

-- The fast paths take their words unparsed: decimal strings and plain
-- numbers.
local function fwords(c)
	local t = {}
	for x in string.gmatch(c, "%S+") do
		t[#t + 1] = x
	end
	return t
end

-- fspec parses a spec as take.lua does, for the fast path's functions.
local function fspec(s)
	local f = fwords(s)
	local sp = { kind = tonumber(f[1]), rate = tonumber(f[2]), cap = tonumber(f[4]), cls = f[8] }
	local a, b, c, d = tonumber(f[9]), tonumber(f[10]), tonumber(f[11]), tonumber(f[12])
	if sp.cls == "W" then
		sp.wk, sp.wn, sp.per, sp.c, sp.us = a, b, c, math.min(sp.cap, int.MAX_SLIDING_WINDOW_CAPACITY), d == 1
	elseif sp.cls == "G" then
		sp.R, sp.Pp, sp.tolp, sp.g = a, b, c, d
	elseif sp.cls == "D" then
		sp.a, sp.ik, sp.iN, sp.iv = a, b, c, d
	elseif sp.cls == "L" then
		sp.per = a
	end
	return sp, f
end

local function fnum(x)
	if x + 0 == x then
		return format("%d", x)
	end
	return str(x)
end

local function fresult(r)
	return (r.allowed and "1 " or "0 ") .. fnum(r.remaining) .. " " .. fnum(r.reset) .. " " .. fnum(r.retry)
end

local fastfn = { [0] = fast.fixed, [2] = fast.gcra, [3] = fast.gcra, [4] = fast.sliding }

-- fstep: "spec|state|now n|now n|..." (state "-" for none) runs a trace
-- of one key through the fast path of its kind, falling back to algo.step
-- where it answers nil, as take.lua does; one line a step: "f" (fast) or
-- "x" (exact), the result, and the state string after the step ("-": none).
-- A fast step's time to live must be its state's idle-at time less now.
function cases.fstep(c)
	local parts = {}
	for x in string.gmatch(c, "[^|]+") do
		parts[#parts + 1] = x
	end
	local sp, f = fspec(parts[1])
	local p = { kind = sp.kind, rate = parse(f[2]), period = parse(f[3]), cap = parse(f[4]), interval = parse(f[5]), offset = parse(f[14] or "0") }
	local fn = fastfn[sp.kind]
	if sp.kind == 1 then
		fn = (sp.cls == "D" and fast.discrete) or (sp.cls == "G" and fast.gcra) or nil
	elseif sp.cls == "-" then
		fn = nil
	end
	local v = parts[2]
	if v == "-" then
		v = nil
	end
	local lines = {}
	for j = 3, #parts do
		local nw, ns = match(parts[j], "^(%d+) (%d+)$")
		local n = tonumber(ns)
		local S, F = fast.clock(nw)
		local r, w, ttl
		if fn and S then
			r, w, ttl = fn(sp, v, S, F, n)
		end
		local tag = "f"
		if r then
			if w then
				-- The time to live is the new state's idle-at time, or
				-- nil when it is the stored state's.
				local d = fast.rel(match(w, "^(%d+)"), S, F)
				if ttl ~= d and (ttl ~= nil or not v or match(v, "^(%d+)") ~= match(w, "^(%d+)")) then
					tag = "TTL"
				end
				v = w
			end
		else
			tag = "x"
			local now = parse(nw)
			local st
			if sp.kind == 4 then
				st = { a = 0, prev = 0, curr = 0 }
				if v then
					local a, pv, cu = match(v, "^(%d+) (%d+) (%d+)$")
					if int.lt(now, parse(a)) then
						st = { a = parse(a), prev = parse(pv), curr = parse(cu) }
					end
				end
			else
				st = { a = 0, b = 0 }
				if v then
					local a, b = match(v, "^(%d+) (%d+)$")
					if int.lt(now, parse(a)) then
						st = { a = parse(a), b = parse(b) }
					end
				end
			end
			local st2
			st2, r = algo.step(p, st, now, n)
			if r.allowed and n ~= 0 then
				v = state_str(st2, sp.kind)
			end
		end
		lines[#lines + 1] = tag .. " " .. fresult(r) .. " " .. (v or "-")
	end
	return table.concat(lines, "\n")
end

-- flog: "spec|seen sum|at n|...|#|now n|now n|..." runs a trace of one
-- sliding log through fast.log_step (relative times, entries read on
-- demand), falling back to algo.log_step where it answers nil, and commits
-- with algo.log_commit; one line a step: "f" or "x", expired, the result.
function cases.flog(c)
	local parts = {}
	for x in string.gmatch(c, "[^|]+") do
		parts[#parts + 1] = x
	end
	local sp, f = fspec(parts[1])
	local p = { kind = 5, rate = parse(f[2]), period = parse(f[3]), cap = parse(f[4]), interval = 0, offset = 0 }
	local seen, sum = match(parts[2], "^(%d+) (%d+)$")
	local log = { entries = {}, sum = parse(sum), seen = parse(seen) }
	local j = 3
	while parts[j] ~= "#" do
		local at, n = match(parts[j], "^(%d+) (%d+)$")
		log.entries[#log.entries + 1] = { at = parse(at), n = parse(n) }
		j = j + 1
	end
	local lines = {}
	for k = j + 1, #parts do
		local nw, ns = match(parts[k], "^(%d+) (%d+)$")
		local n = tonumber(ns)
		local S, F = fast.clock(nw)
		local r, e
		local es = log.entries
		if sp.cls == "L" and S and (#es == 0 or true) then
			local h = nil
			local ok = true
			if #es > 0 then
				local last = es[#es]
				h = { cnt = #es, sum = tonumber(str(log.sum)), seen = fast.rel(str(log.seen), S, F), nat = fast.rel(str(last.at), S, F) }
				if not h.seen or not h.nat or not h.sum or h.sum >= 2 ^ 52 then
					ok = false
				end
			end
			if ok then
				-- The entries as raw strings, the first two read, the
				-- rest on demand.
				local raw = {}
				for i = 1, math.min(2, #es) do
					raw[i] = str(es[i].at) .. " " .. str(es[i].n)
				end
				local function more(t)
					for i = #t + 1, math.min(2 * #t + 2, #es) do
						t[i] = str(es[i].at) .. " " .. str(es[i].n)
					end
				end
				r, e = fast.log_step(sp, h, raw, 0, more, S, F, n)
			end
		end
		local tag = "f"
		if not r then
			tag = "x"
			e, r = algo.log_step(p, log, parse(nw), n)
		end
		local cost = 0
		if r.allowed then
			cost = n
		end
		log = algo.log_commit(log, e, parse(nw), cost)
		lines[#lines + 1] = tag .. " " .. format("%d", e) .. " " .. fresult(r)
	end
	return table.concat(lines, "\n")
end

-- slide: "per c now n prev curr ws e" -> the result.
function cases.slide(w)
	return result(algo.slide_result(w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8]))
end

-- window: "per start|- now" -> "ws e rel".
function cases.window(w)
	local ws, e, rel = algo.sketch_window(w[1], w[2] or nil, w[3])
	return s(ws, e, rel)
end

-- sketch: "rate cap per1 per2 (which now n)..." runs one key through a
-- sketch kept as the Redis store would keep it: the period and start of
-- the current window and the key's counts in it and the one before. One
-- line a step: the result, then period, start, cur and prev.
function cases.sketch(w)
	local rate, cap = w[1], int.min(w[2], int.MAX_SLIDING_WINDOW_CAPACITY)
	local pers = { w[3], w[4] }
	local period, start, cur, prev = 0, nil, 0, 0
	local function rotate(per, now)
		if not int.eq(period, per) then
			start = nil
		end
		local ws, e, rel = algo.sketch_window(per, start, now)
		if rel == "next" then
			prev, cur = cur, 0
		elseif rel == "reset" then
			prev, cur = 0, 0
		end
		if rel ~= "back" then
			start = ws
		end
		period = per
		return ws, e
	end
	local lines = {}
	local i = 5
	while w[i] do
		local per, now, n = pers[w[i]], w[i + 1], w[i + 2]
		i = i + 3
		local ws, e = rotate(per, now)
		local r
		if rate == 0 then
			r = algo.zero_limit(n, int.sub(algo.add_sat(ws, per), algo.clamp_now(now)))
		else
			r = algo.slide_result(per, cap, now, n, prev, cur, ws, e)
		end
		if r.allowed and n ~= 0 then
			rotate(period, now)
			cur = int.min(int.add(cur, int.min(n, 4294967295)), 4294967295)
		end
		lines[#lines + 1] = result(r) .. " " .. s(period, start, cur, prev)
	end
	return table.concat(lines, "\n")
end

-- bench: "kind rate period cap interval now dt n steps" runs steps
-- requests dt apart and returns how many were allowed.
function cases.bench(w)
	local p = params(w)
	local now, dt, n = w[6], w[7], w[8]
	local st
	if p.kind == 4 then
		st = { a = 0, prev = 0, curr = 0 }
	else
		st = { a = 0, b = 0 }
	end
	local allowed = 0
	for _ = 1, w[9] do
		now = int.add(now, dt)
		local st2, r = algo.step(p, st, now, n)
		if r.allowed then
			st = st2
			allowed = allowed + 1
		end
	end
	return str(allowed)
end

-- benchlog: "rate period cap now dt n steps" runs a sliding log.
function cases.benchlog(w)
	local p = { kind = 5, rate = w[1], period = w[2], cap = w[3], interval = 0, offset = 0 }
	local now, dt, n = w[4], w[5], w[6]
	local log = { entries = {}, sum = 0, seen = 0 }
	local allowed = 0
	for _ = 1, w[7] do
		now = int.add(now, dt)
		local expired, r = algo.log_step(p, log, now, n)
		local cost = 0
		if r.allowed then
			cost = n
			allowed = allowed + 1
		end
		log = algo.log_commit(log, expired, now, cost)
	end
	return str(allowed)
end

-- permit: "kind rate period cap x (now op id)..." -> one line an op on
-- a set kept in a table as a store keeps it (the expired dropped first):
-- op 0 peeks and 1 acquires (algo.permit_step), 2 renews and 4 hands
-- over (algo.permit_renew), each printing its result and exp; 3 releases,
-- printing "-"; then every line the permits held and the earliest
-- expiry after it, and how many expired permits it dropped first.
function cases.permit(w)
	local p = params(w)
	local set = {}
	local lines = {}
	local i = 6
	while w[i] do
		local now, op, id = w[i], w[i + 1], w[i + 2]
		i = i + 3
		local held, earliest, dropped = 0, 0, 0
		for k, e in pairs(set) do
			if int.le(e, now) then
				set[k] = nil
				dropped = dropped + 1
			end
		end
		for _, e in pairs(set) do
			held = held + 1
			if earliest == 0 or int.lt(e, earliest) then
				earliest = e
			end
		end
		local st = { held = held, earliest = earliest, old = set[id] or 0 }
		local line
		if op == 3 then
			set[id] = nil
			line = "-"
		else
			local r, exp
			if op == 2 or op == 4 then
				r, exp = algo.permit_renew(p, st, now, op == 4)
			else
				r, exp = algo.permit_step(p, st, now, op)
			end
			line = result(r) .. " " .. f(exp)
			if not int.eq(exp, 0) then
				set[id] = exp
			end
		end
		held, earliest = 0, 0
		for _, e in pairs(set) do
			held = held + 1
			if earliest == 0 or int.lt(e, earliest) then
				earliest = e
			end
		end
		lines[#lines + 1] = line .. " " .. f(held) .. " " .. f(earliest) .. " " .. f(dropped)
	end
	return table.concat(lines, "\n")
end

local run = cases[mode] or error("unknown mode " .. tostring(mode))
local out = {}
for j = 2, #ARGV do
	if mode == "parse" or mode == "fstep" or mode == "flog" then
		out[j - 1] = run(ARGV[j])
	else
		out[j - 1] = run(words(ARGV[j]))
	end
end
return out
