-- algo.lua: the rate limiting algorithms of the Go package algo, as pure
-- functions on int.lua integers. Go's algo is the source of truth; every
-- branch here mirrors one there (function names in comments), and the
-- differential tests hold the two to identical results and states.
--
-- Times are nanoseconds since the Unix epoch; every argument is a
-- non-negative integer (int.lua representation). p is
-- {kind=0..6, rate=, period=, cap=, interval=, offset=, debit=bool} as algo.Params (and must be
-- valid, see Params.Validate); a result is {allowed=bool, remaining=,
-- reset=, retry=} as algo.Result, with retry = int.NEVER (compare with
-- int.eq) for never. Functions never modify their arguments.
--
--   algo.step(p, st, now, n) -> st2, r          kinds 0-4 (Step)
--   algo.overdraw(p, st, now, n) -> st2, r      kinds 0-4 (Overdraw)
--   algo.overdraws(r, n) -> bool                        (Overdraws)
--   algo.charges_exhausted(p) -> bool           (Params.ChargesExhausted)
--   algo.overdraws_exhausted(p, r, n, in_debt()) -> bool (OverdrawsExhausted)
--   algo.log_step(p, log, now, n) -> expired, r        (LogStep)
--   algo.log_step_each(p, log, now, n) -> expired, r   (LogStepEach)
--   algo.log_commit(log, expired, now, n) -> log2, changed (Log.Commit)
--   algo.slide_result(per, c, now, n, prev, curr, ws, e) -> r (CMSketch.Check)
--   algo.slide_result_each(...) -> r, the same as CMSketch.CheckEach
--   algo.sketch_window(per, start, now) -> ws, e, rel (CMSketch.rotate)
--   algo.settle(p, st, now, at, reset, reserved, spent) -> st2, charged,
--     refunded                                        kinds 0-4 (Settle)
--   algo.settles(p) -> bool                                   (Settles)
--   algo.permit_step(p, s, now, n) -> r, exp                (PermitStep)
--   algo.permit_renew(p, s, now, hand_over) -> r, exp      (PermitRenew)
--     s = {held=, earliest=, old=} as algo.PermitSet; exp 0 for none
--   algo.permit_expiry(p, now, old) -> exp               (PermitExpiry)
--   algo.add_sat(a, b), algo.align_down(t, per), algo.clamp_now(now),
--   algo.zero_limit(n, reset)
local algo = {}
do
	local add, sub, mul, divmod, divceil, mod = int.add, int.sub, int.mul, int.divmod, int.divceil, int.mod
	local lt, le, eq, imax, imin, sat, add_sat = int.lt, int.le, int.eq, int.max, int.min, int.sat, int.add_sat
	local MAXI64, MAXI64_1, NEVER = int.MAXI64, int.MAXI64_1, int.NEVER
	local MSWC = int.MAX_SLIDING_WINDOW_CAPACITY
	local P64 = int.mul(4294967296, 4294967296) -- 2^64
	local P53 = int.P53

	-- align_down returns the start of the per-long window holding t
	-- (alignDown).
	local function align_down(t, per)
		return sub(t, mod(t, per))
	end

	-- align_from returns the start of the per-long window, aligned off past
	-- the epoch, that holds t (alignFrom): 0 for t < off.
	local function align_from(t, per, off)
		if eq(off, 0) then
			return align_down(t, per)
		end
		if lt(t, off) then
			return 0
		end
		return add(off, align_down(sub(t, off), per))
	end

	-- window_end returns the end of a fixed window of p that starts at ws
	-- (windowEnd).
	local function window_end(p, ws)
		if eq(ws, 0) and not eq(p.offset, 0) then
			return p.offset
		end
		return add_sat(ws, p.period)
	end

	-- clamp_now maps now into [0, MAXI64-1] (clampNow; now >= 0).
	local function clamp_now(now)
		-- A time below 32767*2^48 (MAXI64 less 3.3 days) has a top limb
		-- below 32767: no need to compare it with MAXI64.
		if now + 0 ~= now and (now[4] ~= nil or (now[3] >= 32767 and not lt(now, MAXI64))) then
			return MAXI64_1
		end
		return now
	end

	-- zero_limit is the result against a limit that admits nothing
	-- (zeroLimit).
	local function zero_limit(n, reset)
		if n == 0 then
			return { allowed = true, remaining = 0, reset = reset, retry = 0 }
		end
		return { allowed = false, remaining = 0, reset = reset, retry = NEVER }
	end

	-- settled returns the result of a peek (n == 0) or of a cost above the
	-- capacity c, with used of it taken (nil for a request still to
	-- decide), and the capacity left.
	local function settled(n, c, used, reset)
		local have = sub(c, used)
		if n == 0 then
			return { allowed = true, remaining = have, reset = reset, retry = 0 }, have
		end
		if lt(c, n) then
			return { allowed = false, remaining = have, reset = reset, retry = NEVER }, have
		end
		return nil, have
	end

	local function fixed_window(p, s, now, n)
		local per, cap, off = p.period, p.cap, p.offset
		local ws = align_from(now, per, off)
		local wend = window_end(p, ws)
		local count = 0
		if lt(now, s.a) then
			-- ws = max(ws, alignFrom(s.A-1)): only a later window when
			-- s.A is past this one's end (now < s.A <= end puts s.A-1 in
			-- this window).
			if lt(wend, s.a) then
				ws = imax(ws, align_from(sub(s.a, 1), per, off))
				wend = window_end(p, ws)
			end
			count = s.b
		end
		local reset = sub(wend, now)
		if p.rate == 0 then
			return s, zero_limit(n, reset)
		end
		local r, have = settled(n, cap, count, reset)
		if r then
			return s, r
		end
		if lt(sub(cap, n), count) then
			return s, { allowed = false, remaining = have, reset = reset, retry = reset }
		end
		local after = add(count, n)
		return { a = wend, b = after }, { allowed = true, remaining = sub(cap, after), reset = reset, retry = 0 }
	end

	-- left returns floor((limit - x) / per), 0 when x > limit, saturated:
	-- the whole requests left under limit when x is used, in units where
	-- one request is per (bucketLeft, and slide.left with x the weighted
	-- estimate).
	local function left(limit, x, per)
		if lt(limit, x) then
			return 0
		end
		return sat((divmod(sub(limit, x), per)))
	end

	-- gcra_x returns TAT - now in units of 1/rate ns, 0 when the bucket is
	-- full (readGCRA).
	local function gcra_x(p, s, now)
		local x = 0
		if lt(now, s.a) then
			local b = s.b
			if not lt(b, p.rate) then
				b = 0 -- not a state Step wrote
			end
			x = sub(mul(sub(s.a, now), p.rate), b)
		end
		return x
	end

	local function gcra(p, s, now, n)
		local rate, period, cap = p.rate, p.period, p.cap
		if rate == 0 then
			return s, zero_limit(n, 0)
		end
		local tol = mul(cap, period)
		local x, reset = gcra_x(p, s, now), 0
		if lt(now, s.a) then
			reset = sub(s.a, now)
		end
		if n == 0 then
			return s, { allowed = true, remaining = left(tol, x, period), reset = reset, retry = 0 }
		end
		if lt(cap, n) then
			return s, { allowed = false, remaining = left(tol, x, period), reset = reset, retry = NEVER }
		end
		local x2 = add(x, mul(n, period))
		local q = divceil(x2, rate)
		local a2 = add(now, q) -- beyond MAXI64 exactly when q > MAXI64 - now
		if lt(MAXI64, a2) then
			return s, { allowed = false, remaining = left(tol, x, period), reset = reset, retry = NEVER }
		end
		if lt(tol, x2) then
			return s,
				{
					allowed = false,
					remaining = left(tol, x, period),
					reset = reset,
					retry = sat(divceil(sub(x2, tol), rate)),
				}
		end
		return { a = a2, b = sub(mul(q, rate), x2) },
			{ allowed = true, remaining = left(tol, x2, period), reset = q, retry = 0 }
	end

	-- discrete_deficit returns the deficit d at the tick of now, the tokens
	-- a tick adds and that tick (discreteDeficit), or nil for no refill.
	local function discrete_deficit(p, s, now)
		local prod = mul(p.rate, p.interval)
		if not lt(prod, P64) then
			return nil
		end
		local a = divmod(prod, p.period)
		if a == 0 then
			return nil
		end
		local iv = p.interval
		local tick = align_down(now, iv)
		local d = 0
		if lt(now, s.a) then
			local ticks, rem = divmod(sub(s.a, tick), iv)
			if rem ~= 0 then
				ticks = add(ticks, 1) -- not a state Step wrote
			end
			local r = s.b
			if not lt(r, a) then
				r = 0
			end
			d = sub(mul(ticks, a), r)
		end
		return d, a, tick
	end

	local function discrete_bucket(p, s, now, n)
		local d, a, tick = discrete_deficit(p, s, now) -- a: tokens per tick
		if d == nil then
			return s, zero_limit(n, 0)
		end
		local iv, c = p.interval, p.cap
		local reset = 0
		if lt(now, s.a) then
			reset = sub(s.a, now)
		end
		local res, have = settled(n, c, d, reset)
		if res then
			return s, res
		end
		local d2 = add(d, n)
		local q = divceil(d2, a) -- ticks until full after the request
		local a2 = add(tick, mul(q, iv)) -- beyond MAXI64 exactly when the span is
		if lt(MAXI64, a2) then
			return s, { allowed = false, remaining = have, reset = reset, retry = NEVER }
		end
		if lt(c, d2) then
			local j = divceil(sub(d2, c), a)
			return s, { allowed = false, remaining = have, reset = reset, retry = sub(add(tick, mul(j, iv)), now) }
		end
		return { a = a2, b = sub(mul(q, a), d2) },
			{ allowed = true, remaining = sub(c, d2), reset = sub(a2, now), retry = 0 }
	end

	-- The weighted two-window estimate (slide): counts prev and curr, the
	-- current window's start ws, the time e elapsed in it, and pinned.

	-- weighted returns prev*(per - e) + count*per.
	local function weighted(per, prev, e, count)
		return add(mul(prev, sub(per, e)), mul(count, per))
	end

	-- retry_at returns the time at which a request of cost n <= c, denied
	-- now, would be admitted, or MAXI64 for never (retryAt).
	local function retry_at(per, c, n, prev, curr, ws, wend, pinned)
		local base = ws
		if pinned then
			base = wend
		end
		local room = sub(c, n)
		if le(curr, room) and prev ~= 0 then
			local d = divmod(mul(sub(room, curr), per), prev)
			if not lt(d, per) then
				return base
			end
			return add_sat(base, sub(per, d))
		end
		if pinned or eq(wend, MAXI64) then
			return MAXI64
		end
		if le(curr, room) then
			return wend
		end
		local d = divmod(mul(room, per), curr)
		return add_sat(wend, sub(per, d))
	end

	-- slide decides a request of cost n against capacity c (slide.result)
	-- and returns the result and the end of the window.
	local function slide(per, c, now, n, prev, curr, ws, e, pinned, debt)
		local limit = mul(c, per)
		local wend = add_sat(ws, per)
		local reset = sub(wend, now)
		if n == 0 then
			local x = weighted(per, prev, e, curr)
			if debt and lt(limit, x) then
				-- A peek at an estimate in debt (slide.result with debt).
				local t = retry_at(per, c, 0, prev, curr, ws, wend, pinned)
				local retry = NEVER
				if not eq(t, MAXI64) then
					if lt(now, t) then retry = sub(t, now) else retry = 1 end
				end
				return { allowed = false, remaining = left(limit, x, per), reset = reset, retry = retry }, wend
			end
			return { allowed = true, remaining = left(limit, x, per), reset = reset, retry = 0 }, wend
		end
		local after = add(curr, n)
		if not lt(c, n) then
			local x = weighted(per, prev, e, after)
			if not lt(limit, x) then
				return { allowed = true, remaining = left(limit, x, per), reset = reset, retry = 0 }, wend
			end
		end
		local retry = NEVER
		if not lt(c, n) then
			local t = retry_at(per, c, n, prev, curr, ws, wend, pinned)
			if eq(t, MAXI64) then
				retry = NEVER
			elseif lt(now, t) then
				retry = sub(t, now)
			else
				retry = 1
			end
		end
		return {
			allowed = false,
			remaining = left(limit, weighted(per, prev, e, curr), per),
			reset = reset,
			retry = retry,
		},
			wend
	end

	-- read_slide reads the sliding window counter's state at now
	-- (readSlide): prev, curr, ws, e, pinned.
	local function read_slide(per, s, now)
		local e = mod(now, per)
		local ws = sub(now, e)
		local prev, curr, pinned = 0, 0, false
		local sa = s.a
		if lt(now, sa) then
			-- sws, the start of the state's current window, is false
			-- when it is the window before ws.
			local sws
			if sa + 0 ~= sa and sa[3] == 32767 and eq(sa, MAXI64) then
				local last = align_down(MAXI64_1, per)
				if eq(ws, last) then
					sws = last
				else
					sws = imax(ws, sub(last, per))
					e, pinned = 0, true
				end
			elseif le(sa, per) then
				sws = 0 -- not a state Step wrote
			else
				-- sws = alignDown(s.A-1-per): with d = s.A - ws > 0, it
				-- is the window before ws for d <= per, ws for
				-- per < d <= 2per, and later otherwise.
				local d = sub(sa, ws)
				if le(d, per) then
					sws = false
				elseif le(d, add(per, per)) then
					sws = ws
				else
					sws = align_down(sub(sub(sa, 1), per), per)
				end
			end
			if sws == ws then -- the same window (the same value even)
				prev, curr = s.prev, s.curr
			elseif sws and not lt(sws, ws) then
				if lt(ws, sws) then
					ws, e = sws, 0 -- clock went backwards
				end
				prev, curr = s.prev, s.curr
			else -- sws is the window before now's
				prev = s.curr
			end
		end
		return prev, curr, ws, e, pinned
	end

	-- read_slide_from reads the state of a sliding window whose windows
	-- are offset from the epoch (readSlideFrom): with d = s.a - ws, the
	-- state counts now's window for d >= 1.5 per, the one before for
	-- 0.5 per < d < 1.5 per, an older one otherwise.
	local function read_slide_from(p, s, now)
		local per = p.period
		local ws = align_from(now, per, p.offset)
		local e = sub(now, ws)
		local prev, curr = 0, 0
		local sa = s.a
		if lt(now, sa) then
			local d = sub(sa, ws)
			local half = divmod(per, 2)
			if lt(per, d) and not lt(sub(d, per), half) then
				prev, curr = s.prev, s.curr
			elseif lt(half, d) then
				prev = s.curr
			end
		end
		return prev, curr, ws, e, false
	end

	-- read_slide_of reads a sliding window's state: read_slide, or
	-- read_slide_from for offset windows (readSlideOf).
	local function read_slide_of(p, s, now)
		if eq(p.offset, 0) then
			return read_slide(p.period, s, now)
		end
		return read_slide_from(p, s, now)
	end

	-- slide_idle is the idle-at time of a sliding window's state whose
	-- window ends at wend (slideIdle).
	local function slide_idle(p, wend)
		local idle = add_sat(wend, p.period)
		if not eq(p.offset, 0) then
			idle = add_sat(idle, (divmod(p.period, 8)))
		end
		return idle
	end

	local function sliding_window(p, s, now, n)
		local per = p.period
		local c = imin(p.cap, MSWC)
		local prev, curr, ws, e, pinned = read_slide_of(p, s, now)
		if p.rate == 0 then
			return s, zero_limit(n, sub(add_sat(ws, per), now))
		end
		local r, wend = slide(per, c, now, n, prev, curr, ws, e, pinned)
		if not r.allowed or n == 0 then
			return s, r
		end
		return { a = slide_idle(p, wend), prev = prev, curr = add(curr, n) }, r
	end

	-- algo.step(p, st, now, n) -> st2, r evaluates a request of cost n at
	-- now for kinds 0-4 (algo.Step). st is {a=, b=} for kinds 0-3 and
	-- {a=, prev=, curr=} for kind 4 (Go's B = prev<<32 | curr); the zero
	-- state is a fresh key. When the request is denied or n is 0, st2 is
	-- st itself; otherwise a new table.
	function algo.step(p, st, now, n)
		now = clamp_now(now)
		local kind = p.kind
		if p.period == 0 then
			return st, zero_limit(n, 0)
		end
		if kind == 0 then
			return fixed_window(p, st, now, n)
		elseif kind == 1 then
			if p.interval ~= 0 then
				return discrete_bucket(p, st, now, n)
			end
			return gcra(p, st, now, n)
		elseif kind == 2 or kind == 3 then
			return gcra(p, st, now, n)
		elseif kind == 4 then
			return sliding_window(p, st, now, n)
		end
		return st, zero_limit(n, 0)
	end

	-- algo.log_step(p, log, now, n) -> expired, r evaluates a request
	-- against a sliding log (algo.LogStep): log is {entries=, sum=, seen=},
	-- entries an array of {at=, n=}, oldest first; expired (a plain number)
	-- counts the leading entries out of the window at t = max(now, seen).
	local function log_step(p, log, now, n, debt)
		now = clamp_now(now)
		local per = p.period
		if per == 0 then
			return 0, zero_limit(n, 0)
		end
		local es = log.entries
		local k = #es
		local t = imax(now, log.seen)
		local sum = log.sum
		local expired = 0
		if not lt(t, per) then
			local cut = sub(t, per)
			while expired < k and le(es[expired + 1].at, cut) do
				sum = sub(sum, es[expired + 1].n) -- saturates at 0
				expired = expired + 1
			end
		end
		local reset = 0
		if k > expired then
			reset = sub(add_sat(es[k].at, per), now)
		end
		if p.rate == 0 then
			return expired, zero_limit(n, reset)
		end
		local c = p.cap
		local r, have = settled(n, c, sum, reset)
		if r and not (debt and n == 0 and lt(c, sum)) then
			return expired, r
		end
		-- A request, or a peek at a log in debt (logStep with debt).
		local room = sub(c, n)
		if lt(room, sum) then
			-- Wait until the oldest entries holding sum - room hits have
			-- left the window.
			local drop = sub(sum, room)
			local gone, at = 0, 0
			for i = expired + 1, k do
				local en = es[i]
				gone, at = add_sat(gone, en.n), imax(at, en.at)
				if not lt(gone, drop) then
					break
				end
			end
			local u = add_sat(at, per)
			local retry = NEVER
			if not eq(u, MAXI64) then
				retry = sub(u, now)
			end
			return expired, { allowed = false, remaining = have, reset = reset, retry = retry }
		end
		return expired, {
			allowed = true,
			remaining = sub(room, sum),
			reset = sub(add_sat(t, per), now),
			retry = 0,
		}
	end

	function algo.log_step(p, log, now, n)
		return log_step(p, log, now, n, false)
	end

	function algo.log_step_each(p, log, now, n)
		return log_step(p, log, now, n, true)
	end

	-- algo.log_commit(log, expired, now, n) -> log2, changed drops the
	-- first expired entries and appends n hits at max(now, seen)
	-- (Log.Commit), in new tables, leaving log unchanged; log2 is log
	-- itself when nothing changes. A log left empty is fresh (seen 0).
	function algo.log_commit(log, expired, now, n)
		local es = log.entries
		local k = #es
		if expired > k then
			expired = k
		end
		if expired == 0 and n == 0 then
			return log, false
		end
		now = clamp_now(now)
		local t = imax(now, log.seen)
		local out, m, sum = {}, 0, log.sum
		if expired == k then
			sum = 0
		else
			for i = 1, expired do
				sum = sub(sum, es[i].n)
			end
			for i = expired + 1, k do
				m = m + 1
				out[m] = es[i]
			end
		end
		if n == 0 then
			if m == 0 then
				return { entries = out, sum = 0, seen = 0 }, true
			end
			return { entries = out, sum = sum, seen = t }, true
		end
		sum = add_sat(sum, n)
		if m > 0 and le(t, out[m].at) then
			out[m] = { at = out[m].at, n = add_sat(out[m].n, n) }
		else
			out[m + 1] = { at = t, n = n }
		end
		return { entries = out, sum = sum, seen = t }, true
	end

	-- algo.slide_result(per, c, now, n, prev, curr, ws, e) -> r decides a
	-- request of cost n against capacity c (already at most
	-- MAX_SLIDING_WINDOW_CAPACITY) on the counts prev and curr of the
	-- window before and the window starting at ws, e into it, as
	-- CMSketch.Check does (slide.result, never pinned). now is clamped.
	function algo.slide_result(per, c, now, n, prev, curr, ws, e)
		local r = slide(per, c, clamp_now(now), n, prev, curr, ws, e, false, false)
		return r
	end

	function algo.slide_result_each(per, c, now, n, prev, curr, ws, e)
		local r = slide(per, c, clamp_now(now), n, prev, curr, ws, e, false, true)
		return r
	end

	-- algo.sketch_window(per, start, now) -> ws, e, rel returns the
	-- evaluation window of a sketch whose current window starts at start
	-- (nil: never used, or used with another period) at now, as
	-- CMSketch.rotate does, and how to rotate the stored windows: "same",
	-- "back" (time went backwards: evaluated at start with e = 0), "next"
	-- (prev := cur, cur := empty) or "reset" (both empty). now is clamped.
	function algo.sketch_window(per, start, now)
		now = clamp_now(now)
		local ws = align_down(now, per)
		if start ~= nil then
			if eq(ws, start) then
				return ws, sub(now, ws), "same"
			end
			if lt(ws, start) then
				return start, 0, "back"
			end
			if eq(sub(ws, start), per) then
				return ws, sub(now, ws), "next"
			end
		end
		return ws, sub(now, ws), "reset"
	end

	-- Overdraw: the hit that Step denies with room left is consumed past
	-- the limit, a debt; a peek at a state in debt is denied. The force
	-- functions mirror fixedForce, gcraForce, discreteForce and
	-- slidingForce; debt mirrors debt.

	local MAXU32 = 4294967295

	local function fixed_force(p, s, now, n)
		local per, off = p.period, p.offset
		local ws = align_from(now, per, off)
		local count = 0
		if lt(now, s.a) then
			ws = imax(ws, align_from(sub(s.a, 1), per, off))
			count = s.b
		end
		return { a = window_end(p, ws), b = add_sat(count, n) }
	end

	local function gcra_force(p, s, now, n)
		local rate = p.rate
		local x2 = add(gcra_x(p, s, now), mul(n, p.period))
		local q = divceil(x2, rate)
		local a2 = add(now, q)
		if lt(MAXI64, a2) then
			return { a = MAXI64, b = 0 }
		end
		return { a = a2, b = sub(mul(q, rate), x2) }
	end

	local function discrete_force(p, s, now, n)
		local d, a, tick = discrete_deficit(p, s, now)
		if d == nil then
			return s
		end
		local d2 = add(d, n)
		local q = divceil(d2, a)
		local a2 = add(tick, mul(q, p.interval))
		if lt(MAXI64, a2) then
			return { a = MAXI64, b = 0 }
		end
		return { a = a2, b = sub(mul(q, a), d2) }
	end

	local function sliding_force(p, s, now, n)
		local per = p.period
		local prev, curr, ws = read_slide_of(p, s, now)
		return { a = slide_idle(p, add_sat(ws, per)), prev = prev, curr = imin(add(curr, n), MAXU32) }
	end

	-- debt returns the time until the state s is out of debt at now, or
	-- nil when it is not in debt.
	local function debt(p, s, now)
		if not lt(now, s.a) then
			return nil
		end
		local kind = p.kind
		if kind == 0 then
			if not lt(p.cap, s.b) then
				return nil
			end
			local ws = imax(align_from(now, p.period, p.offset), align_from(sub(s.a, 1), p.period, p.offset))
			return sub(window_end(p, ws), now)
		elseif kind == 4 then
			local per = p.period
			local prev, curr, ws, e, pinned = read_slide_of(p, s, now)
			local r = slide(per, imin(p.cap, MSWC), now, 0, prev, curr, ws, e, pinned, true)
			if r.allowed then
				return nil
			end
			return r.retry
		elseif kind == 1 and p.interval ~= 0 then
			local d, a, tick = discrete_deficit(p, s, now)
			if d == nil or not lt(p.cap, d) then
				return nil
			end
			local j = divceil(sub(d, p.cap), a)
			local u = add(tick, mul(j, p.interval))
			if lt(MAXI64, u) then
				return NEVER
			end
			return sub(u, now)
		elseif kind >= 1 and kind <= 3 then
			local x = gcra_x(p, s, now)
			local tol = mul(p.cap, p.period)
			if not lt(tol, x) then
				return nil
			end
			return sat(divceil(sub(x, tol), p.rate))
		end
		return nil
	end

	-- algo.overdraws(r, n): a hit of cost n answered r is consumed under
	-- Overdraw's rule (Overdraws).
	function algo.overdraws(r, n)
		return not r.allowed and n ~= 0 and not lt(r.remaining, 1)
	end

	-- algo.charges_exhausted(p): a charge that finds p's limit exhausted,
	-- not in debt, is counted (Params.ChargesExhausted).
	function algo.charges_exhausted(p)
		if p.kind == 0 and p.rate == 0 then return true end
		return (p.debit or p.kind == 0) and p.rate ~= 0 and p.cap ~= 0
	end

	-- algo.overdraws_exhausted(p, r, n, in_debt): a hit of cost n answered
	-- r, which found the limit exhausted, is consumed all the same
	-- (OverdrawsExhausted); in_debt() is called only for such a hit.
	function algo.overdraws_exhausted(p, r, n, in_debt)
		return not r.allowed and n ~= 0 and lt(r.remaining, 1) and algo.charges_exhausted(p) and (p.debit or not in_debt())
	end

	function algo.overdraw(p, st, now, n)
		local st2, r = algo.step(p, st, now, n)
		now = clamp_now(now)
		if n == 0 then
			if r.allowed and (p.rate ~= 0 or p.kind == 0) and p.period ~= 0 then
				local retry = debt(p, st, now)
				if retry ~= nil then
					return st2, { allowed = false, remaining = r.remaining, reset = r.reset, retry = retry }
				end
			end
			return st2, r
		end
		if not algo.overdraws(r, n) then
			if not algo.overdraws_exhausted(p, r, n, function() return debt(p, st, now) ~= nil end) then
				return st2, r
			end
		end
		local kind, f = p.kind, nil
		if kind == 0 then
			f = fixed_force(p, st, now, n)
		elseif kind == 1 and p.interval ~= 0 then
			f = discrete_force(p, st, now, n)
		elseif kind >= 1 and kind <= 3 then
			f = gcra_force(p, st, now, n)
		elseif kind == 4 then
			f = sliding_force(p, st, now, n)
		else
			return st2, r
		end
		local _, after = algo.step(p, f, now, 1)
		return f, { allowed = false, remaining = 0, reset = after.reset, retry = after.retry, overdrawn = true }
	end

	-- Settle: a reservation taken before its real cost was known, settled
	-- once it is (algo.Settle). settle_force mirrors force; the refund
	-- functions refundFixed, refundSliding, refundGCRA and refundDiscrete.

	-- algo.settles(p): Settle settles the states of p's limits (Settles).
	function algo.settles(p)
		local kind = p.kind
		if kind >= 0 and kind <= 3 then
			return p.period ~= 0
		end
		return kind == 4 and p.period ~= 0 and eq(p.offset, 0)
	end

	-- settle_force counts n hits whatever the state (force).
	local function settle_force(p, s, now, n)
		local kind = p.kind
		if kind == 0 then
			return fixed_force(p, s, now, n)
		elseif kind == 4 then
			return sliding_force(p, s, now, n)
		elseif kind == 1 and p.interval ~= 0 then
			return discrete_force(p, s, now, n)
		end
		if p.rate == 0 then
			return s -- a zero bucket holds no debt: it denies for ever
		end
		return gcra_force(p, s, now, n)
	end

	-- reserved_end is the end of the window that counted a reservation
	-- taken at or after at whose ResetAfter was reset (reservedEnd).
	local function reserved_end(p, at, reset)
		local t = sub(add_sat(at, imax(reset, 1)), 1)
		return window_end(p, align_from(t, p.period, p.offset))
	end

	-- refund_fixed takes up to want hits off a fixed window's count, if its
	-- window is the one that ends at wend (refundFixed).
	local function refund_fixed(p, s, now, wend, want)
		local per, off = p.period, p.offset
		if not lt(now, s.a) then
			return s, 0, 0
		end
		local ws = imax(align_from(now, per, off), align_from(sub(s.a, 1), per, off))
		if not eq(window_end(p, ws), wend) then
			return s, 0, 0
		end
		local k = imin(want, s.b)
		return { a = wend, b = sub(s.b, k) }, 0, k
	end

	-- refund_sliding takes up to want hits off a sliding window's current
	-- count, if its window ends at wend, or off its previous count, if that
	-- is the window before (refundSliding).
	local function refund_sliding(p, s, now, wend, want)
		if not lt(now, s.a) then
			return s, 0, 0
		end
		local per = p.period
		local prev, curr, ws = read_slide(per, s, now)
		local cur = add_sat(ws, per)
		local k
		if eq(cur, wend) then
			k = imin(want, curr)
			curr = sub(curr, k)
		elseif eq(cur, add_sat(wend, per)) then
			k = imin(want, prev)
			prev = sub(prev, k)
		else
			return s, 0, 0
		end
		if k == 0 then
			return s, 0, 0
		end
		return { a = slide_idle(p, cur), prev = prev, curr = curr }, 0, k
	end

	-- refund_gcra takes up to want hits off a GCRA-family bucket's level,
	-- and no more than what of reserved (taken at or after at) it still
	-- holds: reserved*period - (now - at)*rate (refundGCRA).
	local function refund_gcra(p, s, now, at, reserved, want)
		local rate, period = p.rate, p.period
		if rate == 0 or not lt(now, s.a) then
			return s, 0, 0
		end
		local x = gcra_x(p, s, now)
		local held = mul(reserved, period)
		if lt(at, now) then
			local drained = mul(sub(now, at), rate)
			if not lt(drained, held) then
				return s, 0, 0
			end
			held = sub(held, drained)
		end
		local k = imin(want, (divmod(held, period)))
		k = imin(k, (divmod(x, period)))
		if k == 0 then
			return s, 0, 0
		end
		x = sub(x, mul(k, period))
		if x == 0 then
			return { a = 0, b = 0 }, 0, k
		end
		local t = divceil(x, rate)
		return { a = add(now, t), b = sub(mul(t, rate), x) }, 0, k
	end

	-- refund_discrete takes up to want hits off a discrete bucket's
	-- deficit, and no more than what of reserved it still holds: reserved
	-- less the refill of every step since at (refundDiscrete).
	local function refund_discrete(p, s, now, at, reserved, want)
		local d, a, tick = discrete_deficit(p, s, now)
		if d == nil or d == 0 then
			return s, 0, 0
		end
		local iv = p.interval
		local from = align_down(at, iv)
		local span
		if le(from, tick) then
			span = sub(tick, from)
		else
			-- at after now's tick: Go's uint64(tick - from) wraps.
			span = sub(P64, sub(from, tick))
		end
		local refilled = mul((divmod(span, iv)), a)
		if not lt(refilled, reserved) then
			return s, 0, 0
		end
		local k = imin(imin(want, sub(reserved, refilled)), d)
		if k == 0 then
			return s, 0, 0
		end
		d = sub(d, k)
		if d == 0 then
			return { a = 0, b = 0 }, 0, k
		end
		local q = divceil(d, a)
		local a2 = add(tick, mul(q, iv))
		if lt(MAXI64, a2) then
			-- A state cut at MAXI64 (discrete_force) keeps its tick's
			-- remainder: the next tick is past MAXI64, where Go's int64
			-- sum wraps negative (a fresh bucket). Cut it again, as
			-- discrete_force does, a debt that stays.
			return { a = MAXI64, b = 0 }, 0, k
		end
		return { a = a2, b = sub(mul(q, a), d) }, 0, k
	end

	-- algo.settle(p, st, now, at, reset, reserved, spent) -> st2, charged,
	-- refunded settles a reservation of reserved hits, of which spent were
	-- spent, taken at or after at and answered with ResetAfter reset, on
	-- the state st at now (algo.Settle): Go's moved is charged (> 0) or
	-- minus refunded (one of them is 0; int.lua has no negative values).
	-- st2 is st itself when nothing moves, but for a fixed window, where it
	-- may be a new table with the same counts.
	function algo.settle(p, st, now, at, reset, reserved, spent)
		now = clamp_now(now)
		if not algo.settles(p) or eq(spent, reserved) then
			return st, 0, 0
		end
		if lt(reserved, spent) then
			local n = sub(spent, reserved)
			return settle_force(p, st, now, n), n, 0
		end
		local want = sub(reserved, spent)
		local kind = p.kind
		if kind == 0 then
			return refund_fixed(p, st, now, reserved_end(p, at, reset), want)
		elseif kind == 4 then
			return refund_sliding(p, st, now, reserved_end(p, at, reset), want)
		elseif kind == 1 and p.interval ~= 0 then
			return refund_discrete(p, st, now, at, reserved, want)
		end
		return refund_gcra(p, st, now, at, reserved, want)
	end

	-- Concurrency permits (permit.go) -------------------------------------

	local MS = 1000000 -- a millisecond, the unit of expiries
	local LAST_MS = sub(MAXI64, mod(MAXI64, MS))

	-- permit_expiry is PermitExpiry: now + period, saturated, rounded up
	-- to a whole millisecond (down at the end of int64 time), never
	-- before old.
	local function permit_expiry(p, now, old)
		local e = add_sat(clamp_now(now), p.period)
		if lt(LAST_MS, e) then
			e = LAST_MS
		else
			local r = mod(e, MS)
			if not eq(r, 0) then
				e = add(e, sub(MS, r))
			end
		end
		return imax(e, old)
	end

	-- permit_at is PermitSet.at: the hit's own permit not held if it has
	-- expired at now.
	local function permit_at(s, now)
		if not eq(s.old, 0) and le(s.old, now) then
			return { held = s.held, earliest = s.earliest, old = 0 }
		end
		return s
	end

	-- permit_with is PermitSet.with: s after the hit's permit is added,
	-- or refreshed, with expiry exp.
	local function permit_with(s, exp)
		local held, earliest = s.held, s.earliest
		if eq(s.old, 0) then
			held = add_sat(held, 1)
		end
		if eq(earliest, 0) or lt(exp, earliest) then
			earliest = exp
		end
		return { held = held, earliest = earliest, old = exp }
	end

	-- permit_result is permitResult.
	local function permit_result(p, s, now, allowed)
		local r = { allowed = allowed, remaining = sub(p.cap, s.held), reset = 0, retry = 0 }
		if not eq(s.earliest, 0) then
			r.reset = sub(s.earliest, now)
		end
		if not allowed then
			r.retry = NEVER
			if not eq(s.earliest, 0) then
				r.retry = imax(r.reset, 1)
			end
		end
		return r
	end

	-- algo.permit_step is PermitStep: a Concurrency hit of cost n on the
	-- set s at now; exp is the expiry of the permit held, 0 for none.
	function algo.permit_step(p, s, now, n)
		now = clamp_now(now)
		s = permit_at(s, now)
		if eq(n, 0) then
			return permit_result(p, s, now, true), 0
		end
		if lt(1, n) or eq(p.rate, 0) or eq(p.cap, 0) or eq(p.period, 0) then
			local r = permit_result(p, s, now, false)
			r.retry = NEVER
			return r, 0
		end
		if eq(s.old, 0) and le(p.cap, s.held) then
			return permit_result(p, s, now, false), 0
		end
		local exp = permit_expiry(p, now, s.old)
		return permit_result(p, permit_with(s, exp), now, true), exp
	end

	-- algo.permit_renew is PermitRenew: the hit's permit renewed at now
	-- if still held (s.old), else acquired again if the set has room (or
	-- whatever the room on a hand-over), else lost.
	function algo.permit_renew(p, s, now, hand_over)
		now = clamp_now(now)
		s = permit_at(s, now)
		local room = hand_over or lt(s.held, p.cap) and not eq(p.rate, 0)
		if eq(s.old, 0) and not room or eq(p.period, 0) then
			local r = permit_result(p, s, now, false)
			r.retry = NEVER
			return r, 0
		end
		local exp = permit_expiry(p, now, s.old)
		return permit_result(p, permit_with(s, exp), now, true), exp
	end

	algo.permit_expiry = permit_expiry
	algo.add_sat = add_sat
	algo.align_down = align_down
	algo.clamp_now = clamp_now
	algo.zero_limit = zero_limit
end
