-- int.lua: exact non-negative integers of any size for Lua 5.1, where every
-- number is a double and integers are exact only below 2^53.
--
-- Representation. A value below 2^53 is a plain Lua number (an integer
-- double): the fast path, no allocation. A larger value is a table of limbs
-- in base 2^24, least significant first, with no zero limbs at the top (so
-- at least 3 limbs; every int64 has at most 3), whose metatable is the
-- library's. Every function accepts both forms and returns this canonical
-- form, so two equal values are either the same number or tables with
-- equal limbs: compare with int.eq, never with ==. Limb products are below
-- 2^48, so a product plus a few carries stays exact.
--
-- The metatable exists for speed: its __add returns false, so x + 0 == x
-- tells a number (true) from a big value (false) in two instructions where
-- type(x) costs a C call, and most operations are on numbers. Tables made
-- elsewhere are not values of this library (x + 0 raises an error).
--
-- Every argument must be a non-negative integer; int.sub saturates at 0.
-- Functions never modify their arguments; the tables they return may be
-- shared (int.MAXI64 is returned by int.sat) and must not be modified either.
--
--   int.parse(s) -> x or nil     int.str(x) -> decimal string
--   int.add, int.sub, int.mul    int.divmod(a, b) -> q, r    (b > 0)
--   int.div, int.divceil, int.mod
--   int.lt, int.le, int.eq -> bool    int.cmp -> -1, 0, 1
--   int.min, int.max, int.sat (at MAXI64), int.add_sat
--   int.MAXI64 = int.NEVER = 2^63-1, int.MAXI64_1 = 2^63-2,
--   int.MAX_SLIDING_WINDOW_CAPACITY = 2^32-2, int.P53 = 2^53
local int = {}
do
	local type, floor, tonumber = type, math.floor, tonumber
	local format, find, strsub = string.format, string.find, string.sub

	local B = 16777216 -- limb base, 2^24
	local setmetatable = setmetatable
	local MT = { -- the metatable of big values: x + 0 == x for numbers only
		__add = function()
			return false
		end,
	}
	local B2 = 281474976710656 -- 2^48
	local P51 = 2251799813685248 -- 2^51: short division below this
	local P53 = 9007199254740992 -- 2^53: numbers below this are exact
	local T29 = 536870912 -- 2^29: h*2^24 + l < 2^53 for h below this

	-- Constants.
	local MAXI64 = setmetatable({ 16777215, 16777215, 32767 }, MT) -- 2^63 - 1
	int.MAXI64 = MAXI64
	int.NEVER = MAXI64
	int.MAXI64_1 = setmetatable({ 16777214, 16777215, 32767 }, MT) -- 2^63 - 2
	int.MAX_SLIDING_WINDOW_CAPACITY = 4294967294 -- 2^32 - 2
	int.P53 = P53

	-- split returns the limbs of a number x < 2^53 (no canonical form:
	-- only for the limb functions below).
	local function split(x)
		if x < B then
			return { x }
		end
		local l1 = x % B
		x = (x - l1) / B
		if x < B then
			return { l1, x }
		end
		local l2 = x % B
		return { l1, l2, (x - l2) / B }
	end

	local function limbs(x)
		if x + 0 ~= x then
			return x
		end
		return split(x)
	end

	-- norm returns the canonical form of the fresh limb array r of n limbs,
	-- trimming r in place.
	local function norm(r, n)
		while n > 0 and r[n] == 0 do
			r[n] = nil
			n = n - 1
		end
		if n <= 2 then
			return (r[1] or 0) + (r[2] or 0) * B
		end
		if n == 3 and r[3] < 32 then
			return r[1] + r[2] * B + r[3] * B2
		end
		return setmetatable(r, MT)
	end

	-- cmpL compares two limb arrays without top zero limbs: -1, 0 or 1.
	local function cmpL(x, y)
		local nx, ny = #x, #y
		if nx ~= ny then
			return nx < ny and -1 or 1
		end
		for i = nx, 1, -1 do
			local a, b = x[i], y[i]
			if a ~= b then
				return a < b and -1 or 1
			end
		end
		return 0
	end

	local function addL(x, y)
		local nx, ny = #x, #y
		if nx < ny then
			x, y, nx, ny = y, x, ny, nx
		end
		local r, c = {}, 0
		for i = 1, nx do
			local t = x[i] + (y[i] or 0) + c
			if t >= B then
				r[i], c = t - B, 1
			else
				r[i], c = t, 0
			end
		end
		if c == 1 then
			nx = nx + 1
			r[nx] = 1
		end
		return norm(r, nx)
	end

	-- subL returns x - y for x >= y.
	local function subL(x, y)
		local nx = #x
		local r, c = {}, 0
		for i = 1, nx do
			local t = x[i] - (y[i] or 0) - c
			if t < 0 then
				r[i], c = t + B, 1
			else
				r[i], c = t, 0
			end
		end
		return norm(r, nx)
	end

	local function mulL(x, y)
		local nx, ny = #x, #y
		local r = {}
		for k = 1, nx + ny do
			r[k] = 0
		end
		for i = 1, nx do
			local a = x[i]
			if a ~= 0 then
				local c, k = 0, i
				for j = 1, ny do
					local t = r[k] + a * y[j] + c -- < 2^24 + 2^48 + 2^25
					c = floor(t / B)
					r[k] = t - c * B
					k = k + 1
				end
				r[k] = c
			end
		end
		return norm(r, nx + ny)
	end

	-- divSmall divides the limbs x by a number 0 < d < 2^51, returning the
	-- quotient (canonical) and the remainder (a number). Each quotient limb
	-- is estimated in floating point: t = r*2^24 + x[i] with r < d is below
	-- d*2^24, its quotient below 2^24, and the two roundings of fl(t)/d
	-- err by less than 2^24 * 2^-52 < 1, so the floor is off by at most one
	-- either way. The remainder of the estimate, t - q*d, is then exactly
	-- (r - q*dh)*2^24 + (x[i] - q*dl) with d = dh*2^24 + dl: every term is
	-- an integer below 2^53 in magnitude and the sum lies in [-d, 2d), so
	-- below 2^52: it is exact, and one correction step fixes q.
	local function divSmall(x, d)
		local dl = d % B
		local dh = (d - dl) / B
		local n = #x
		local q, r = {}, 0
		for i = n, 1, -1 do
			local xi = x[i]
			local qi = floor((r * B + xi) / d)
			local t = (r - qi * dh) * B + (xi - qi * dl)
			if t < 0 then
				qi, t = qi - 1, t + d
			elseif t >= d then
				qi, t = qi + 1, t - d
			end
			q[i], r = qi, t
		end
		return norm(q, n), r
	end

	-- divKnuth divides the limbs x by the limbs y (at least 2 limbs, x >= y)
	-- with Knuth's Algorithm D (TAOCP vol. 2, 4.3.1) in base 2^24: every
	-- intermediate is an integer below 2^53.
	local function divKnuth(x, y)
		local n, nx = #y, #x
		local m = nx - n
		-- Normalize: scale both by f = 2^s so that the top limb of y is at
		-- least 2^23.
		local f, top = 1, y[n]
		while top < 8388608 do
			top, f = top * 2, f * 2
		end
		local v, u = {}, {}
		local c = 0
		for i = 1, n do
			local t = y[i] * f + c
			c = floor(t / B)
			v[i] = t - c * B
		end
		c = 0
		for i = 1, nx do
			local t = x[i] * f + c
			c = floor(t / B)
			u[i] = t - c * B
		end
		u[nx + 1] = c
		local vn, vn1 = v[n], v[n - 1]
		local q = {}
		for j = m, 0, -1 do
			-- Estimate q̂ from the top two limbs, refine with the third.
			local num = u[j + n + 1] * B + u[j + n]
			local qh = floor(num / vn)
			local rh = num - qh * vn
			while qh >= B or qh * vn1 > rh * B + u[j + n - 1] do
				qh, rh = qh - 1, rh + vn
				if rh >= B then
					break
				end
			end
			-- u[j+1 .. j+n+1] -= q̂ * v
			local carry, borrow = 0, 0
			for i = 1, n do
				local p = qh * v[i] + carry
				carry = floor(p / B)
				local t = u[i + j] - (p - carry * B) - borrow
				if t < 0 then
					u[i + j], borrow = t + B, 1
				else
					u[i + j], borrow = t, 0
				end
			end
			local t = u[j + n + 1] - carry - borrow
			if t < 0 then
				-- q̂ was one too large (rare): add v back.
				u[j + n + 1] = t + B
				qh = qh - 1
				c = 0
				for i = 1, n do
					local s = u[i + j] + v[i] + c
					if s >= B then
						u[i + j], c = s - B, 1
					else
						u[i + j], c = s, 0
					end
				end
				u[j + n + 1] = (u[j + n + 1] + c) % B
			else
				u[j + n + 1] = t
			end
			q[j + 1] = qh
		end
		-- The remainder is u[1..n] / f.
		local r = {}
		local g = B / f
		for i = 1, n do
			r[i] = floor(u[i] / f) + ((u[i + 1] or 0) % f) * g
		end
		return norm(q, m + 1), norm(r, n)
	end

	-- fromHL returns hi*2^24 + lo for hi < 2^48 and lo < 2^24.
	local function fromHL(hi, lo)
		if hi < T29 then
			return hi * B + lo
		end
		local h = hi % B
		return setmetatable({ lo, h, (hi - h) / B }, MT)
	end

	-- mulNN returns the product of two numbers when it is 2^53 or more:
	-- three limbs each, column sums below 3*2^48 plus a carry.
	local function mulNN(a, b)
		local a1, b1 = a % B, b % B
		a, b = (a - a1) / B, (b - b1) / B
		local a2, b2 = a % B, b % B
		local a3, b3 = (a - a2) / B, (b - b2) / B
		local c = a1 * b1
		local r1 = c % B
		c = (c - r1) / B + a1 * b2 + a2 * b1
		local r2 = c % B
		c = (c - r2) / B + a1 * b3 + a2 * b2 + a3 * b1
		local r3 = c % B
		c = (c - r3) / B + a2 * b3 + a3 * b2
		local r4 = c % B
		c = (c - r4) / B + a3 * b3
		if c ~= 0 then
			return setmetatable({ r1, r2, r3, r4, c }, MT)
		elseif r4 ~= 0 then
			return setmetatable({ r1, r2, r3, r4 }, MT)
		end
		return setmetatable({ r1, r2, r3 }, MT)
	end

	-- div3 divides a 3-limb x by a number 0 < d < 2^51: the quotient is
	-- q1*2^24 + q2 (q1 < 2^48, q2 < 2^24) and the remainder r. The first
	-- step divides the top two limbs, below 2^48, exactly; the second is
	-- one step of divSmall, or exact when r*2^24 + x[1] < 2^53.
	local function div3(x, d)
		local hi = x[3] * B + x[2]
		local q1 = floor(hi / d)
		local r = hi - q1 * d
		local xi = x[1]
		local q2
		if d < T29 then
			local t = r * B + xi
			q2 = floor(t / d)
			return q1, q2, t - q2 * d
		end
		local dl = d % B
		local dh = (d - dl) / B
		q2 = floor((r * B + xi) / d)
		r = (r - q2 * dh) * B + (xi - q2 * dl)
		if r < 0 then
			return q1, q2 - 1, r + d
		elseif r >= d then
			return q1, q2 + 1, r - d
		end
		return q1, q2, r
	end

	local function divmod(a, b)
		if a + 0 == a then
			if b + 0 == b then
				-- floor(a / b) is exact for integers 0 <= a, b < 2^53.
				-- Let a = q*b + r, 0 <= r < b. Rounding is monotonic
				-- and q, q + 1 <= 2^53 are doubles, so the rounded
				-- a/b is in [q, q + 1], and reaches q + 1 only if the
				-- gap (b - r)/b >= 1/b is at most half the spacing of
				-- doubles below q + 1. When q + 1 = 2^k that is
				-- 2^(k-54), so b*(q+1) >= 2^54, but b*(q+1) < 2^54
				-- (b*q <= a < 2^53 and b < 2^53). Otherwise it is at
				-- most q*2^-53, so b*q >= 2^53 > a: impossible too.
				local q = floor(a / b)
				return q, a - q * b
			end
			return 0, a
		end
		if b + 0 == b then
			if b < P51 then
				if a[4] == nil then
					local q1, q2, r = div3(a, b)
					return fromHL(q1, q2), r
				end
				return divSmall(a, b)
			end
			b = split(b)
		end
		if cmpL(a, b) < 0 then
			return 0, a
		end
		return divKnuth(a, b)
	end

	local function lt(a, b)
		if a + 0 == a then
			if b + 0 == b then
				return a < b
			end
			return true
		end
		if b + 0 == b then
			return false
		end
		local na, nb = #a, #b
		if na ~= nb then
			return na < nb
		end
		for i = na, 1, -1 do
			local x, y = a[i], b[i]
			if x ~= y then
				return x < y
			end
		end
		return false
	end

	local function add(a, b)
		if a + 0 == a then
			if b + 0 == b then
				local s = a + b -- rounded: below 2^53 exactly when the sum is
				if s < P53 then
					return s
				end
				return addL(split(a), split(b))
			end
			a, b = b, a
		elseif b + 0 ~= b then
			return addL(a, b)
		end
		-- a is a table, b a number.
		if a[4] == nil then
			local b1 = b % B
			local hi = a[3] * B + a[2] + (b - b1) / B
			local lo = a[1] + b1
			if lo >= B then
				lo, hi = lo - B, hi + 1
			end
			if hi < B2 then
				local h = hi % B
				return setmetatable({ lo, h, (hi - h) / B }, MT)
			end
		end
		return addL(a, split(b))
	end

	local function sub(a, b)
		if a + 0 == a then
			if b + 0 == b and a > b then
				return a - b
			end
			return 0
		end
		local hi, lo
		if b + 0 == b then
			if a[4] ~= nil then
				return subL(a, split(b))
			end
			local b1 = b % B
			hi = a[3] * B + a[2] - (b - b1) / B
			lo = a[1] - b1
		elseif a[4] == nil and b[4] == nil then
			hi = (a[3] - b[3]) * B + (a[2] - b[2])
			lo = a[1] - b[1]
		elseif lt(b, a) then
			return subL(a, b)
		else
			return 0
		end
		-- a - b = hi*2^24 + lo, |lo| < 2^24, |hi| < 2^48.
		if lo < 0 then
			lo, hi = lo + B, hi - 1
		end
		if hi < 0 then
			return 0
		end
		return fromHL(hi, lo)
	end

	local function sat(a)
		if a + 0 ~= a and (a[4] ~= nil or a[3] > 32767) then
			return MAXI64
		end
		return a
	end

	-- int.add returns a + b.
	int.add = add

	-- int.sub returns a - b, or 0 when b > a.
	int.sub = sub

	-- int.mul returns a * b.
	function int.mul(a, b)
		if a + 0 == a then
			if b + 0 == b then
				local p = a * b -- rounded: below 2^53 exactly when the product is
				if p < P53 then
					return p
				end
				return mulNN(a, b)
			end
			if a == 0 then
				return 0
			end
			return mulL(split(a), b)
		end
		if b + 0 == b then
			if b == 0 then
				return 0
			end
			return mulL(a, split(b))
		end
		return mulL(a, b)
	end

	-- int.divmod returns floor(a / b) and a mod b, for b > 0.
	int.divmod = divmod

	-- int.div returns floor(a / b), for b > 0.
	function int.div(a, b)
		local q = divmod(a, b)
		return q
	end

	-- int.divceil returns a / b rounded up, for b > 0.
	function int.divceil(a, b)
		local q, r = divmod(a, b)
		if r ~= 0 then
			return add(q, 1)
		end
		return q
	end

	-- int.mod returns a mod b, for b > 0.
	function int.mod(a, b)
		if a + 0 ~= a and a[4] == nil and b + 0 == b and b < P51 then
			local _, _, r = div3(a, b)
			return r
		end
		local _, r = divmod(a, b)
		return r
	end

	-- int.cmp returns -1, 0 or 1 as a is less than, equal to or greater
	-- than b.
	function int.cmp(a, b)
		if lt(a, b) then
			return -1
		elseif lt(b, a) then
			return 1
		end
		return 0
	end

	-- int.lt reports whether a < b.
	int.lt = lt

	-- int.le reports whether a <= b.
	function int.le(a, b)
		return not lt(b, a)
	end

	-- int.eq reports whether a == b.
	function int.eq(a, b)
		if a + 0 == a or b + 0 == b then
			return a == b
		end
		return cmpL(a, b) == 0
	end

	-- int.min returns the smaller of a and b.
	function int.min(a, b)
		if lt(b, a) then
			return b
		end
		return a
	end

	-- int.max returns the larger of a and b.
	function int.max(a, b)
		if lt(a, b) then
			return b
		end
		return a
	end

	-- int.sat returns a, or int.MAXI64 when a is larger.
	int.sat = sat

	-- int.add_sat returns a + b saturated at int.MAXI64.
	function int.add_sat(a, b)
		return sat(add(a, b))
	end

	-- int.parse returns the value of a string of decimal digits, or nil
	-- when s is not one.
	function int.parse(s)
		if type(s) ~= "string" or not find(s, "^%d+$") then
			return nil
		end
		local v = tonumber(s) -- correctly rounded: below 2^53 exactly when s is
		if v < P53 then
			return v
		end
		-- Chunks of 12 digits, the first one shorter.
		local n = #s
		local k = (n - 1) % 12 + 1
		local x = tonumber(strsub(s, 1, k))
		for i = k + 1, n, 12 do
			x = add(int.mul(x, 1000000000000), tonumber(strsub(s, i, i + 11)))
		end
		return x
	end

	-- int.str returns the decimal digits of a.
	function int.str(a)
		if a + 0 == a then
			return format("%.0f", a)
		end
		-- Chunks of 12 digits from the bottom; a 3-limb value has two.
		local parts, k = {}, 0
		while a + 0 ~= a do
			local r
			a, r = divmod(a, 1000000000000)
			k = k + 1
			parts[k] = format("%012.0f", r)
		end
		local s = format("%.0f", a)
		for i = k, 1, -1 do
			s = s .. parts[i]
		end
		return s
	end
end
