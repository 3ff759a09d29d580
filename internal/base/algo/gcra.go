package algo

import "math"

// gcra is the Generic Cell Rate Algorithm, and with it the smooth token
// bucket and the meter form of the leaky bucket, which are the same
// arithmetic seen from three sides:
//
//   - GCRA keeps the theoretical arrival time TAT. With the emission
//     interval T = Period/Rate, a request of cost n sets
//     TAT' = max(TAT, now) + n·T and is denied when TAT' − now > Capacity·T.
//   - A token bucket of Capacity tokens refilled at Rate per Period is full
//     at TAT; it holds Capacity − (TAT − now)/T tokens at now, and a request
//     fits if it holds at least n.
//   - A leaky bucket of Capacity leaking at Rate per Period is empty at TAT;
//     its level at now is (TAT − now)/T, and a request fits if
//     level + n <= Capacity.
//
// The arithmetic is exact: T need not be a whole number of nanoseconds.
// The state holds TAT as A − B/Rate nanoseconds, with 0 <= B < Rate, so A is
// TAT rounded up (the idle-at time: at or after A the bucket is full) and B
// the part of a nanosecond it was rounded by, in units of 1/Rate ns. In
// those units n·T is exactly n·Period and Capacity·T exactly
// Capacity·Period; the products are 128-bit. So a burst of Capacity requests
// at one instant is admitted whatever Rate and Period are, and no sequence
// of requests is ever admitted beyond Capacity + Rate·t/Period in any
// interval of length t.
//
// Remaining is the number of tokens left (whole cost-1 requests that would
// fit now); ResetAfter the time until the bucket is full (TAT − now, rounded
// up); RetryAfter on deny the exact time until the same request would fit.
// Rate 0 blocks every request with RetryAfter Never, as does n > Capacity.
// Time going backwards only makes TAT − now larger: the bucket looks fuller.
func gcra(p *Params, s State, now, n int64) (State, Result) {
	if p.Rate == 0 {
		return s, zeroLimit(n, 0)
	}
	rate, period := uint64(p.Rate), uint64(p.Period)
	tol := mulU(uint64(p.Capacity), period) // Capacity·T in units of 1/Rate ns

	x, reset := readGCRA(p, s, now)
	res := Result{Allowed: true, Remaining: bucketLeft(tol, x, period), ResetAfter: reset}
	if n == 0 {
		return s, res
	}
	res.Allowed = false
	if n > p.Capacity {
		res.RetryAfter = Never
		return s, res
	}
	x2 := x.add(mulU(uint64(n), period)) // TAT' − now
	q := x2.divCeil(rate)                // in whole ns, rounded up: the new A − now
	if q.hi != 0 || q.lo > uint64(math.MaxInt64-now) {
		// TAT' lies beyond math.MaxInt64 and stays there while we wait.
		res.RetryAfter = Never
		return s, res
	}
	if tol.less(x2) {
		// It fits once TAT' − t <= Capacity·T, at t = now + (x2 − tol)/Rate.
		res.RetryAfter = x2.sub(tol).divCeil(rate).int64()
		return s, res
	}
	b := mulU(q.lo, rate).sub(x2).lo // < rate
	return State{A: now + int64(q.lo), B: int64(b)}, Result{
		Allowed:    true,
		Remaining:  bucketLeft(tol, x2, period),
		ResetAfter: int64(q.lo),
	}
}

// readGCRA reads the state s at now: x, TAT − now in units of 1/Rate ns
// (0 when the bucket is full), and the time until the bucket is full.
func readGCRA(p *Params, s State, now int64) (x u128, reset int64) {
	if s.A <= now {
		return x, 0
	}
	rate := uint64(p.Rate)
	b := uint64(s.B)
	if s.B < 0 || b >= rate {
		b = 0 // not a state Step wrote; the later TAT is the safe reading
	}
	return mulU(uint64(s.A-now), rate).sub(u64(b)), s.A - now
}

// bucketLeft returns the whole tokens left in a bucket of tolerance tol
// (Capacity·Period) whose TAT is x ahead of now, both in units of 1/Rate ns:
// floor((tol − x)/Period).
func bucketLeft(tol, x u128, period uint64) int64 {
	if tol.less(x) {
		return 0
	}
	q, _ := tol.sub(x).div(period)
	return q.int64()
}
