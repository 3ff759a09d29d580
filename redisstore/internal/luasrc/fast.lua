-- fast.lua: the common cases of the algorithms in plain Lua numbers, for
-- the Redis store's hot path. algo.lua computes on nanosecond times (about
-- 2^60.6 today) with int.lua's exact integers, where every absolute time is
-- a table of limbs; most of a decision's cost went there. Here a time is
-- split into whole seconds S and nanoseconds F (now = S*1e9 + F), the
-- stored absolute times are read relative to now, and every quantity is a
-- plain number below 2^52, exact in a double. A function returns nil
-- whenever its case leaves that domain (a time more than 52 days from now,
-- a product too large, time gone backwards across windows, a state no
-- algorithm writes), and the caller then takes the exact path of algo.lua.
-- Within its domain every function returns exactly what algo.lua (and Go's
-- algo) returns, bit for bit; the differential tests hold them to it.
--
-- A spec (see redisstore's spec.go) carries what the Go side computed
-- exactly for a limit: the window class (a period of whole seconds, or one
-- dividing a second), the GCRA quantities scaled by gcd(Rate, Period), the
-- tokens per tick of a discrete bucket. Results are {allowed=, remaining=,
-- reset=, retry=} with plain numbers, retry = int.NEVER for never, in the
-- caller's table rt when given (sparing an allocation), else a new one. A new
-- state is returned as the string to store, with its time to live in ns.
--
--   fast.clock(s) -> S, F        a decimal ns time, nil outside the domain
--   fast.rel(a, S, F) -> d       a decimal ns time minus now, or nil
--   fast.abs(S, F, d) -> string  now + d (0 <= d < 2^52) in decimal ns
--   fast.fixed, fast.gcra, fast.discrete, fast.sliding
--                  (sp, v, S, F, n[, rt]) -> r, state, ttl_ns   (kinds 0-4;
--                  ttl_ns nil: the stored state's time to live stands)
--   fast.sketch_window(sp, start, S, F) -> e, wsr, rel
--   fast.parity(sp, t) -> 0 or 1          floor(t/Period) mod 2
--   fast.parity_now(sp, S, F) -> 0 or 1   the same for the window of now
--   fast.slide(sp, prev, curr, e, wsr, n) -> r, fits
--   fast.log_step(sp, h, es, base, more, S, F, n[, rt]) -> r, expired, t, live
--
-- What it buys, measured: sluice serve --store redis as built, against
-- the same built with -tags sluice_exactlua (every hit on algo.lua's
-- exact path), 7 alternating rounds of 10 s each, one redis-server
-- (7.0.15), gRPC load from sluice bench (2 connections, 32 in flight), on
-- a 2-core AMD EPYC VM shared with other work (load average 6 to 15);
-- medians:
--
--                                    Redis CPU µs a request      req/s
--   scenario                         fast   exact  exact/fast   fast   exact  fast/exact
--   10k keys within their limit      14.0   28.4   2.03         10412   6774  1.54
--   one key over its limit,          10.6   22.3   2.11         11750  10388  1.13
--     --local-cache-size 0
--   one key over its limit, the      0.19   0.31   (1 request   23216  22921  1.01
--     local cache on (the default)                 in 200 reaches Redis)
--
-- The exact path costs Redis twice the CPU of this one per decision;
-- with the local cache on (the default), an over-limit key is answered
-- by the node and this path does not matter. Reproduce with
--   B_TAGS=sluice_exactlua SERVERS="redis redis-b" SCENARIOS="10k hot" \
--   REDIS_SERVE_FLAGS="--local-cache-size 0" bench/redis.sh
-- (results: bench/results/2026-11-27-redis-fastpath*; the journal:
-- docs/internals/redis-fast-path.md).
local fast = {}
do
	local floor, tonumber, sub, byte, match, format = math.floor, tonumber, string.sub, string.byte, string.match, string.format
	local NEVER = int.NEVER
	local E9 = 1000000000
	local P52 = 4503599627370496 -- every plain quantity stays below 2^52
	local MINS = 1000000000 -- seconds: times before 2001 take the exact path
	local MAXS = 9000000000 -- seconds: and times after 2255
	local SPAN = 4500000 -- seconds within which a time relative to now is below 2^52 ns

	-- dm returns floor(a/b) and a mod b for integers 0 <= a, 1 <= b with
	-- a + b < 2^53, exactly: the double quotient corrected by one.
	local function dm(a, b)
		local q = floor(a / b)
		local r = a - q * b
		if r < 0 then
			q, r = q - 1, r + b
		elseif r >= b then
			q, r = q + 1, r - b
		end
		return q, r
	end

	-- dmc returns ceil(a/b) under dm's conditions.
	local function dmc(a, b)
		local q, r = dm(a, b)
		if r > 0 then
			return q + 1
		end
		return q
	end

	-- res returns a result: in t when given (a caller's scratch table,
	-- which spares an allocation), else in a new table.
	local function res(t, allowed, remaining, reset, retry)
		if t then
			t.allowed, t.remaining, t.reset, t.retry = allowed, remaining, reset, retry
			return t
		end
		return { allowed = allowed, remaining = remaining, reset = reset, retry = retry }
	end

	local function zero_limit(rt, n, reset)
		if n == 0 then
			return res(rt, true, 0, reset, 0)
		end
		return res(rt, false, 0, reset, NEVER)
	end

	-- clock splits a decimal ns time into S and F.
	function fast.clock(s)
		local n = #s
		if n < 10 or n > 19 then
			return nil
		end
		local S, F = tonumber(sub(s, 1, n - 9)), tonumber(sub(s, n - 8))
		if not S or S < MINS or S >= MAXS then
			return nil
		end
		return S, F
	end

	-- rel returns the decimal ns time a minus now (S, F), or nil when a
	-- is more than SPAN seconds from now.
	local function rel(a, S, F)
		local n = #a
		if n < 10 or n > 19 then
			return nil
		end
		local ds = tonumber(sub(a, 1, n - 9)) - S
		if ds > SPAN or ds < -SPAN then
			return nil
		end
		return ds * E9 + (tonumber(sub(a, n - 8)) - F)
	end
	fast.rel = rel

	-- abs returns now + d in decimal ns, for 0 <= d < 2^52.
	local function abs(S, F, d)
		local q, f = dm(F + d, E9)
		return format("%d%09d", S + q, f)
	end
	fast.abs = abs

	-- into returns the time elapsed in the epoch-aligned window of the
	-- spec's period (wk whole seconds, or wn ns dividing a second) that
	-- holds now, or nil when the period is of neither kind.
	local function into(wk, wn, S, F)
		if wk > 0 then
			local _, r = dm(S, wk)
			return r * E9 + F
		end
		if wn > 0 then
			local _, r = dm(F, wn)
			return r
		end
		return nil
	end

	-- nums memoises counts: a digit string of at most 15 digits to its
	-- number, and such a number to its decimal string. The counts of
	-- many keys are the same few numbers, and a table lookup costs Redis
	-- less than validating and parsing a count, or formatting one. Emptied
	-- when it holds 4096 entries.
	local nums, nnums = {}, 0

	-- memo records the digit string b of count x (at most 15 digits, no
	-- leading zero).
	local function memo(b, x)
		if nnums >= 4096 then
			nums, nnums = {}, 0
		end
		nums[b], nums[x] = x, b
		nnums = nnums + 2
	end

	-- decimal returns the decimal string of a count x below 2^52.
	local function decimal(x)
		local b = nums[x]
		if not b then
			b = format("%d", x)
			memo(b, x)
		end
		return b
	end

	-- The seconds of the last time ab parsed, and their number: the
	-- states read in one second mostly share them.
	local last_s, last_sn

	-- window returns the time e elapsed in the epoch-aligned window of the
	-- spec's period that holds now (see into), and the decimal ns time of
	-- now + e2 − e followed by a space: for e2 = sp.per, the window's end,
	-- the prefix of the states that fast.fixed writes in it; for 2·sp.per,
	-- the next window's end, fast.sliding's. Both are kept in sp for the
	-- now they were made for: the hits of a script call share one now, and
	-- a state of the window of now is then recognised by comparing its
	-- prefix (Lua compares strings by identity), not parsed.
	local function window(sp, S, F, e2)
		if sp.wS == S and sp.wF == F and sp.we2 == e2 then
			return sp.we, sp.wend
		end
		local e = into(sp.wk, sp.wn, S, F)
		if not e then
			return nil
		end
		local q, f = dm(F + e2 - e, E9)
		local wend = format("%d%09d ", S + q, f)
		sp.wS, sp.wF, sp.we2, sp.we, sp.wend = S, F, e2, e, wend
		return e, wend
	end

	-- ab splits a stored "A B" state: A − now (nil when A is not a time
	-- of the domain) and B (a string), or nothing when v is no such state.
	-- A time of the domain has 19 digits; one of more is beyond it.
	local function ab(v, S, F)
		if not v then
			return false
		end
		local as, af, b = match(v, "^(%d%d%d%d%d%d%d%d%d%d)(%d%d%d%d%d%d%d%d%d) (%d+)$")
		if not as then
			if match(v, "^%d+ %d+$") then
				return nil -- a time before 2001
			end
			return false
		end
		if as ~= last_s then
			last_s, last_sn = as, tonumber(as)
		end
		local ds = last_sn - S
		if ds > SPAN or ds < -SPAN then
			return nil
		end
		return ds * E9 + (tonumber(af) - F), b
	end

	-- small returns a stored count no algorithm state exceeds as a number,
	-- or nil beyond 15 digits.
	local function small(s)
		if #s > 15 then
			return nil
		end
		return tonumber(s)
	end

	-- fixed is algo.step for a fixed window (fixedWindow): sp.wk or sp.wn,
	-- sp.per, sp.rate, sp.cap.
	function fast.fixed(sp, v, S, F, n, rt)
		local e, wend = window(sp, S, F, sp.per)
		if not e then
			return nil
		end
		local reset = sp.per - e
		local count = 0
		local d, b, x
		if v and sub(v, 1, #wend) == wend then
			-- A state of the window of now, as ab would find it.
			b = sub(v, #wend + 1)
			x = nums[b]
			if x or match(b, "^%d+$") then
				d = reset
			end
		end
		if not d then
			d, b = ab(v, S, F)
		end
		if d == nil then
			return nil
		end
		if d then
			if d > 0 then
				count = x or small(b)
				if d > reset or not count then
					return nil -- a later window (time went backwards)
				end
				if not x and (#b == 1 or byte(b) ~= 48) then
					memo(b, count) -- canonical: no leading zero
				end
			end
		end
		if sp.rate == 0 then
			-- In debt past its capacity (algo's debt), after denied hits
			-- were counted in mode "e"; the scratch table may say owed
			-- of an earlier call.
			local r = zero_limit(rt, n, reset)
			r.owed = count > sp.cap
			return r
		end
		local cap = sp.cap
		local have = cap - count
		if have < 0 then
			have = 0
		end
		if n == 0 then
			return res(rt, true, have, reset, 0)
		end
		if n > cap or count > cap - n then
			local retry = reset
			if n > cap then
				retry = NEVER
			end
			local r = res(rt, false, have, reset, retry)
			-- In debt (the count past the capacity): a charge in mode
			-- "e" counts nothing, and this answer stands (take.lua).
			r.owed = count > cap
			return r
		end
		local after = count + n
		if count > 0 then
			reset = nil -- the stored state's window: its time to live stands
		end
		return res(rt, true, cap - after, reset or sp.per - e, 0), wend .. decimal(after), reset
	end

	-- bucket_left is bucketLeft scaled: the whole tokens left, floor((tolp
	-- − y)/Pp), 0 when y exceeds tolp.
	local function bucket_left(tolp, y, Pp)
		if y > tolp then
			return 0
		end
		return (dm(tolp - y, Pp))
	end

	-- gcra is algo.step for GCRA, the smooth token bucket and the leaky
	-- bucket (gcra), in units of g/Rate ns where g = gcd(Rate, Period): sp.R
	-- = Rate/g, sp.Pp = Period/g, sp.tolp = Capacity*Pp, sp.g, sp.rate,
	-- sp.cap. Go's B, in units of 1/Rate ns, is a multiple of g in every
	-- state Step writes.
	function fast.gcra(sp, v, S, F, n, rt)
		if sp.rate == 0 then
			return zero_limit(rt, n, 0)
		end
		local R, Pp, tolp = sp.R, sp.Pp, sp.tolp
		local x, reset = 0, 0
		local d, b = ab(v, S, F)
		if d == nil then
			return nil
		end
		if d then
			if d > 0 then
				local bb = small(b) or 0 -- beyond 15 digits it is >= rate
				if bb >= sp.rate then
					bb = 0 -- not a state Step wrote
				end
				local q, r = dm(bb, sp.g)
				local dr = d * R
				if r ~= 0 or dr >= P52 then
					return nil
				end
				x, reset = dr - q, d
			end
		end
		if n == 0 then
			return res(rt, true, bucket_left(tolp, x, Pp), reset, 0)
		end
		if n > sp.cap then
			return res(rt, false, bucket_left(tolp, x, Pp), reset, NEVER)
		end
		local x2 = x + n * Pp
		if x2 >= P52 then
			return nil
		end
		local q = dmc(x2, R)
		if x2 > tolp then
			return res(rt, false, bucket_left(tolp, x, Pp), reset, dmc(x2 - tolp, R))
		end
		local qs, f = dm(F + q, E9)
		return res(rt, true, bucket_left(tolp, x2, Pp), q, 0),
			format("%d%09d %d", S + qs, f, (q * R - x2) * sp.g), q
	end

	-- discrete is algo.step for a token bucket with discrete refill
	-- (discreteBucket): sp.a tokens a tick (0: no refill), ticks of sp.iv
	-- ns (sp.ik whole seconds, or sp.in dividing a second), sp.cap.
	function fast.discrete(sp, v, S, F, n, rt)
		local a = sp.a
		if a == 0 then
			return zero_limit(rt, n, 0)
		end
		local off = into(sp.ik, sp.iN, S, F) -- now − tick
		if not off then
			return nil
		end
		local iv, c = sp.iv, sp.cap
		local dd, reset = 0, 0
		local d, B = ab(v, S, F)
		if d == nil then
			return nil
		end
		if d then
			if d > 0 then
				local r = small(B) or 0
				if r >= a then
					r = 0 -- not a state Step wrote
				end
				local ta = dmc(d + off, iv) * a
				if ta >= P52 then
					return nil
				end
				dd, reset = ta - r, d
			end
		end
		local left = 0
		if dd < c then
			left = c - dd
		end
		if n == 0 then
			return res(rt, true, left, reset, 0)
		end
		if n > c then
			return res(rt, false, left, reset, NEVER)
		end
		local d2 = dd + n
		local q = dmc(d2, a)
		local span = q * iv
		if span >= P52 then
			return nil
		end
		if d2 > c then
			return res(rt, false, left, reset, dmc(d2 - c, a) * iv - off)
		end
		local ra = span - off
		local qs, f = dm(F + ra, E9)
		return res(rt, true, c - d2, ra, 0), format("%d%09d %d", S + qs, f, q * a - d2), ra
	end

	-- muldiv returns floor(a*b/c) for plain a, b, c whose quotient is
	-- below 2^52, exactly (through int.lua when a*b is not).
	local function muldiv(a, b, c)
		local p = a * b
		if p < P52 then
			return (dm(p, c))
		end
		return (int.divmod(int.mul(a, b), c))
	end

	-- slide_left is c − count − ceil(W/pu), the whole requests a sliding
	-- estimate leaves with count in the current window and W the weighted
	-- previous count, or 0 when the estimate exceeds c.
	local function slide_left(c, count, W, pu)
		if count > c then
			return 0
		end
		local m = c - count
		local mp = m * pu
		if mp < P52 and W > mp then
			return 0
		end
		return m - dmc(W, pu)
	end

	-- slide is the weighted two-window estimate (slide.result, never
	-- pinned) on the counts prev and curr, with e elapsed in the current
	-- window, whose start is wsr from now (-e, or later when time went
	-- backwards), against sp.c (the capacity, at most 2^32 - 2) over sp.per.
	-- It returns the result and whether the request fits; nil when the
	-- weighted previous count is not a plain number.
	function fast.slide(sp, prev, curr, e, wsr, n, rt)
		local per, c = sp.per, sp.c
		local u = 1
		if sp.us and e % 1000 == 0 then
			u = 1000 -- the period and e in whole microseconds: smaller products
		end
		local pu = per / u
		local W = prev * (pu - e / u) -- prev·(Period − e), in units of u ns
		if W >= P52 then
			return nil
		end
		local reset = wsr + per
		-- left: c − count − ceil(W/pu), the whole requests left, or 0 when
		-- the estimate exceeds c.
		local left = slide_left
		if n == 0 then
			return res(rt, true, left(c, curr, W, pu), reset, 0), true
		end
		if n > c then
			return res(rt, false, left(c, curr, W, pu), reset, NEVER), false
		end
		local after = curr + n
		if after <= c then
			local mp = (c - after) * pu
			if mp >= P52 or W <= mp then
				return res(rt, true, left(c, after, W, pu), reset, 0), true
			end
		end
		-- retryAt, relative to now (base = ws; the next window at ws + per).
		local room = c - n
		local t
		if curr <= room and prev > 0 then
			local d = muldiv(room - curr, per, prev)
			if d >= per then
				t = wsr
			else
				t = wsr + per - d
			end
		elseif curr <= room then
			t = wsr + per
		else
			t = wsr + per + per - muldiv(room, per, curr)
		end
		if t < 1 then
			t = 1
		end
		return res(rt, false, left(c, curr, W, pu), reset, t), false
	end
	local slide = fast.slide

	-- sliding is algo.step for the sliding window counter (slidingWindow)
	-- with the state's window that of now or the one before: sp.wk or
	-- sp.wn, sp.per, sp.c, sp.us, sp.rate.
	function fast.sliding(sp, v, S, F, n, rt)
		local per = sp.per
		local e, wend = window(sp, S, F, per + per)
		if not e then
			return nil
		end
		local prev, curr = 0, 0
		if v then
			local as, af, pv, cu, d
			if sub(v, 1, #wend) == wend then
				-- A state written in the window of now, as the match
				-- below would find it.
				pv, cu = match(v, "^(%d+) (%d+)$", #wend + 1)
				if pv then
					as, d = pv, per + per - e
				end
			end
			if not as then
				-- A time of the domain has 19 digits; one of more is
				-- beyond it.
				as, af, pv, cu = match(v, "^(%d%d%d%d%d%d%d%d%d%d)(%d%d%d%d%d%d%d%d%d) (%d+) (%d+)$")
				if not as and match(v, "^%d+ %d+ %d+$") then
					return nil -- a time before 2001, or after the domain
				end
			end
			if as and not d then
				d = tonumber(as) - S
				if d > SPAN or d < -SPAN then
					return nil
				end
				d = d * E9 + (tonumber(af) - F)
			end
			if as then
				if d > 0 then
					local p2, c2 = small(pv), small(cu)
					local delta = d + e -- A − ws: the state's idle-at time is its window's end plus a period
					if not p2 or not c2 or delta > per + per then
						return nil -- a later window (time went backwards)
					end
					if delta <= per then
						prev = c2 -- the window before now's
					else
						prev, curr = p2, c2
					end
				end
			end
		end
		if sp.rate == 0 then
			return zero_limit(rt, n, per - e)
		end
		local r, fits = slide(sp, prev, curr, e, -e, n, rt)
		if not r then
			return nil
		end
		if not fits or n == 0 then
			return r
		end
		local ttl = per + per - e
		if curr > 0 then
			ttl = nil -- the stored state's window: its time to live stands
		end
		return r, wend .. format("%d %d", prev, curr + n), ttl
	end

	-- sketch_window is algo.sketch_window relative to now: the time e
	-- elapsed in the evaluation window, that window's start wsr relative to
	-- now, and how to rotate ("same", "back", "next", "reset") for a
	-- sketch whose latest window starts at the decimal ns time start (nil:
	-- none). nil when outside the domain.
	function fast.sketch_window(sp, start, S, F)
		local e = into(sp.wk, sp.wn, S, F)
		if not e then
			return nil
		end
		if start then
			local d = rel(start, S, F)
			if not d then
				return nil
			end
			d = d + e -- start − ws
			if d == 0 then
				return e, -e, "same"
			elseif d > 0 then
				return 0, d - e, "back"
			elseif d == -sp.per then
				return e, -e, "next"
			end
		end
		return e, -e, "reset"
	end

	-- parity returns floor(t/Period) mod 2 for a decimal ns time t of the
	-- domain: which of a sketch's two window keys holds the window of t.
	function fast.parity(sp, t)
		local n = #t
		local s, f = tonumber(sub(t, 1, n - 9)), tonumber(sub(t, n - 8))
		if sp.wk > 0 then
			local q = dm(s, sp.wk)
			local _, r = dm(q, 2)
			return r
		end
		-- floor(t/per) = s·(1e9/per) + floor(f/per)
		local _, a = dm(s, 2)
		local _, b = dm(E9 / sp.wn, 2)
		local _, c = dm((dm(f, sp.wn)), 2)
		local _, r = dm(a * b + c, 2)
		return r
	end

	-- parity_now returns floor(ws/Period) mod 2 for the window ws that
	-- holds now, with the window classes of into.
	function fast.parity_now(sp, S, F)
		if sp.wk > 0 then
			local _, r = dm((dm(S, sp.wk)), 2)
			return r
		end
		local _, a = dm(S, 2)
		local _, b = dm(E9 / sp.wn, 2)
		local _, c = dm((dm(F, sp.wn)), 2)
		local _, r = dm(a * b + c, 2)
		return r
	end

	-- entry returns the time (relative to now) and count of entry i of a
	-- log whose raw "at n" strings are es[base + i], calling more(es) for
	-- more when es holds too few; nil when there is no such entry or it
	-- leaves the domain.
	local function entry(es, base, more, i, S, F)
		local v = es[base + i]
		if v == nil then
			more(es)
			v = es[base + i]
			if v == nil then
				return nil
			end
		end
		local at, k = match(v, "^(%d+) (%d+)$")
		if not at or #k > 15 then
			return nil
		end
		local d = rel(at, S, F)
		if not d then
			return nil
		end
		return d, tonumber(k)
	end

	-- log_step is algo.log_step on a sliding log kept as the Redis store
	-- keeps it: h the header {cnt=, sum=, seen=, nat=} (seen and nat
	-- relative to now; nil for an empty log), and the entries' raw "at n"
	-- strings es[base + 1], es[base + 2], ..., oldest first, of which es
	-- may hold only the first few: more(es) appends the next ones, read as
	-- far as needed. sp.per, sp.rate, sp.cap. It returns the result, the
	-- entries out of the window, the time t (relative) the log is judged
	-- at, and the total of the entries in the window.
	function fast.log_step(sp, h, es, base, more, S, F, n, rt)
		local per = sp.per
		local t, sum, cnt = 0, 0, 0
		if h then
			t, sum, cnt = h.seen, h.sum, h.cnt
			if t < 0 then
				t = 0
			end
		end
		local cut = t - per
		local expired = 0
		while expired < cnt do
			local at, k = entry(es, base, more, expired + 1, S, F)
			if at == nil then
				return nil
			end
			if at > cut then
				break
			end
			sum = sum - k
			if sum < 0 then
				sum = 0
			end
			expired = expired + 1
		end
		local reset = 0
		if expired < cnt then
			reset = h.nat + per
			if reset < 0 then
				reset = 0
			end
		end
		if sp.rate == 0 then
			return zero_limit(rt, n, reset), expired, t, sum
		end
		local c = sp.cap
		local have = c - sum
		if have < 0 then
			have = 0
		end
		if n == 0 then
			return res(rt, true, have, reset, 0), expired, t, sum
		end
		if n > c then
			return res(rt, false, have, reset, NEVER), expired, t, sum
		end
		if sum > c - n then
			local drop = sum - (c - n)
			local gone, at = 0, -P52
			for i = expired + 1, cnt do
				local a, k = entry(es, base, more, i, S, F)
				if a == nil then
					return nil
				end
				gone = gone + k
				if a > at then
					at = a
				end
				if gone >= drop then
					break
				end
			end
			return res(rt, false, have, reset, at + per), expired, t, sum
		end
		return res(rt, true, c - sum - n, t + per, 0), expired, t, sum
	end

	fast.dm, fast.dmc = dm, dmc
	fast.P52, fast.E9 = P52, E9
end
