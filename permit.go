package sluice

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/vocab/permitfunc"
	"github.com/sluicehq/sluice/internal/vocab/permittrace"
)

// Permit is what a request holds of its Concurrency limits: one slot of
// each, held in the store under random IDs until it is released or
// expires (Limiter.Acquire). Its methods are safe for concurrent use.
type Permit struct {
	l        *Limiter
	hits     []Hit // the permits' hits: their Keys, Limits and IDs
	period   time.Duration
	enforce  bool // some permit's limit is not a Shadow limit
	mu       sync.Mutex
	released atomic.Bool
	lost     atomic.Uint64 // bit i: a renewal found hits[i] held no more

	// node and nodeHits are copies of the permits in the node's own store
	// (the local failure policy's), renewed and released with them, so
	// that the node's share counts their holders as long as they run:
	// where the policy's permits were held before they were handed to
	// the store (handOver), or copies of permits the store granted
	// (mirror).
	node     *Limiter
	nodeHits []Hit

	// elsewhere, when set, gives back permits another service holds
	// (internal/vocab/permitfunc: a remote sluice serve's, for sluice
	// proxy --store remote), held of them; hits is then empty.
	elsewhere func(context.Context) error
	held      int
}

func init() {
	permitfunc.New = newElsewhere
	permitfunc.HandOver = handOver
	permitfunc.Mirror = mirror
	permitfunc.Rehold = rehold
	permitfunc.Released = func(p any) bool { return p.(*Permit).released.Load() }
}

// mirror is permitfunc.Mirror: copies of pa's permits, a *Permit, held in
// the store of na, a *Limiter.
func mirror(ctx context.Context, pa, na any, keys []string, limits []any) error {
	p, node := pa.(*Permit), na.(*Limiter)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released.Load() || p.elsewhere != nil || p.node != nil {
		return nil
	}
	hits, err := handOverHits(p, keys, limits)
	if err != nil {
		return err
	}
	if node.permits == nil {
		return errNoPermits
	}
	var buf [4]Decision
	out := buf[:]
	if len(hits) > len(buf) {
		out = make([]Decision, len(hits))
	}
	if err := node.renew(ctx, hits, out[:len(hits)]); err != nil {
		return err
	}
	for i := range hits {
		hits[i].Cost = 0
	}
	p.node, p.nodeHits = node, hits
	return nil
}

// handOverHits returns p's permits as hits of keys and limits, of cost 1
// (a hand-over: held whatever the room). p.mu is held.
func handOverHits(p *Permit, keys []string, limits []any) ([]Hit, error) {
	if len(keys) != len(p.hits) || len(limits) != len(p.hits) {
		return nil, fmt.Errorf("sluice: %d permits with %d keys and %d limits", len(p.hits), len(keys), len(limits))
	}
	hits := make([]Hit, len(p.hits))
	for i := range p.hits {
		lim, ok := limits[i].(*Limit)
		if !ok || lim == nil {
			return nil, fmt.Errorf("%w: a permit without its limit", ErrInvalid)
		}
		hits[i] = Hit{Key: keys[i], Limit: lim, Cost: 1, Permit: p.hits[i].Permit}
	}
	return hits, nil
}

// handOver is permitfunc.HandOver: it moves the permits of pa, a *Permit,
// to the store of la, a *Limiter.
func handOver(ctx context.Context, pa, la any, keys []string, limits []any) (bool, error) {
	p, l := pa.(*Permit), la.(*Limiter)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released.Load() || p.elsewhere != nil || p.l == l {
		return false, nil
	}
	if l.permits == nil {
		return false, errNoPermits
	}
	// Cost 1: a hand-over, held whatever the room (permitStore).
	hits, err := handOverHits(p, keys, limits)
	if err != nil {
		return false, err
	}
	out := make([]Decision, len(hits))
	if err := l.renew(ctx, hits, out); err != nil {
		return false, err
	}
	// The node's copies stay, renewed and released with the store's: the
	// node's share counts them while they run, so that the policy admits
	// no one to their slots while the store still fails some calls (a
	// half-open breaker turns all but its probe away).
	p.node, p.nodeHits = p.l, p.hits
	for i := range hits {
		hits[i].Cost = 0
		if !out[i].Allowed {
			p.lost.Or(uint64(1) << i) // a zero Period: nothing to hold
		}
	}
	// p.period stays: a share has its limit's Period (Keep reads it
	// without the lock).
	p.l, p.hits = l, hits
	return true, nil
}

// rehold is permitfunc.Rehold: the permits of each ps[i], a *Permit,
// held again in its store until left[i] from now, whatever the room, in
// calls of at most MaxHits permits to one store.
func rehold(ctx context.Context, ps []any, left []time.Duration) error {
	var l *Limiter
	var hits []Hit
	flush := func() error {
		if len(hits) == 0 {
			return nil
		}
		err := l.renew(ctx, hits, make([]Decision, len(hits)))
		hits = hits[:0]
		return err
	}
	for i, pa := range ps {
		pl, own := pa.(*Permit).reholdHits(left[i])
		if len(own) == 0 {
			continue
		}
		if pl != l || len(hits)+len(own) > MaxHits {
			if err := flush(); err != nil {
				return err
			}
			l = pl
		}
		hits = append(hits, own...)
	}
	return flush()
}

// reholdHits returns p's store and its permits as hand-over hits (cost 1)
// whose Period is left, or none when p was released or is held elsewhere.
// The store is called without p's lock.
func (p *Permit) reholdHits(left time.Duration) (*Limiter, []Hit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released.Load() || p.elsewhere != nil || left <= 0 {
		return nil, nil
	}
	hits := make([]Hit, len(p.hits))
	for j, h := range p.hits {
		lim := *h.Limit // the permit's time left as its Period
		lim.Period = left
		h.Limit, h.Cost = &lim, 1
		hits[j] = h
	}
	return p.l, hits
}

// newElsewhere is permitfunc.New: a Permit of n permits another service
// holds, which release gives back.
func newElsewhere(ctx context.Context, n int, release func(context.Context) error) any {
	if tr := permittrace.From(ctx); tr != nil && tr.Acquired != nil {
		tr.Acquired(n)
	}
	return &Permit{elsewhere: release, held: n}
}

// errRenewElsewhere is Renew's error for permits another service holds.
var errRenewElsewhere = fmt.Errorf("%w: the permits are held by another service, which cannot renew them", errors.ErrUnsupported)

// Acquire takes hits together, all or nothing, as Take does, after giving
// each hit of a Concurrency limit with cost 1 a fresh permit ID (its
// Permit field is overwritten: 128 random bits, made here and never
// shown). When the request is admitted and holds permits, the Permit
// returned releases and renews them all; it is nil on a denial and when
// none is held (no hit is a permit, or only Shadow limits' that would
// have denied, which take nothing). A permit is held until Release, or
// until it expires a Period after it was acquired or last renewed
// (Renew), so that a holder that dies leaks nothing longer. A denial's Decision says why
// (for a permit, RetryAfter is the time until the earliest permit held
// expires: a bound, since a holder may release sooner). An error means the
// store failed; a permit the store may have taken before failing expires
// on its own. out may be nil.
//
// The hits of a request with permits are decided all or nothing, never
// one by one: a request refused a slot takes nothing from its rates, and
// one refused by a rate holds no slot. The store must be able to release
// and renew permits (memstore, redisstore and the stores that wrap them
// can); for another, Acquire fails with an error wrapping
// errors.ErrUnsupported. Hold is simpler for one permit.
func (l *Limiter) Acquire(ctx context.Context, hits []Hit, out []Decision) (*Permit, Decision, error) {
	n := 0
	for i := range hits {
		if lim := hits[i].Limit; lim != nil && lim.Algorithm == Concurrency && hits[i].Cost == 1 {
			hits[i].Permit = rand.Text()
			n++
		}
	}
	if n > 0 && l.permits == nil {
		return nil, Decision{}, errNoPermits
	}
	if out == nil {
		out = make([]Decision, len(hits))
	}
	d, err := l.Take(ctx, hits, out)
	if err != nil || n == 0 {
		return nil, d, err
	}
	tr := permittrace.From(ctx)
	if !d.Allowed {
		if tr != nil && tr.Denied != nil {
			if k := deniedPermits(hits, out); k > 0 {
				tr.Denied(k)
			}
		}
		return nil, d, nil
	}
	p := &Permit{l: l, hits: make([]Hit, 0, n)}
	for i := range hits {
		// A Shadow limit's permit that would have been denied was not
		// taken: it is not the Permit's to renew or release.
		if h := hits[i]; isPermit(&h) && out[i].Allowed {
			h.Cost = 0
			p.hits = append(p.hits, h)
			if p.period == 0 || h.Limit.Period < p.period {
				p.period = h.Limit.Period
			}
			p.enforce = p.enforce || !h.Limit.Shadow
		}
	}
	if len(p.hits) == 0 {
		return nil, d, nil
	}
	if tr != nil && tr.Acquired != nil {
		tr.Acquired(len(p.hits))
	}
	return p, d, nil
}

// isPermit reports whether h acquires a permit: a Concurrency hit of
// cost 1 with its ID.
func isPermit(h *Hit) bool {
	return h.Permit != "" && h.Limit != nil && h.Limit.Algorithm == Concurrency && h.Cost == 1
}

// deniedPermits counts the permits of a denied request refused a slot:
// its enforced permit hits that denied.
func deniedPermits(hits []Hit, out []Decision) int {
	k := 0
	for i := range hits {
		if isPermit(&hits[i]) && !out[i].Allowed && !hits[i].Limit.Shadow {
			k++
		}
	}
	return k
}

// acquireOne is Acquire for one permit of limit for key.
func (l *Limiter) acquireOne(ctx context.Context, key string, limit *Limit) (*Permit, Decision, error) {
	if limit != nil && limit.Algorithm != Concurrency {
		return nil, Decision{}, fmt.Errorf("%w: a permit needs a concurrency limit, not %s", ErrInvalid, limit.Algorithm)
	}
	var b [1]Hit
	var out [1]Decision
	b[0] = Hit{Key: key, Limit: limit, Cost: 1}
	return l.Acquire(ctx, b[:], out[:])
}

// errNoPermits is Acquire's error for a store that cannot release
// permits.
var errNoPermits = fmt.Errorf("%w: the store cannot release or renew permits", errors.ErrUnsupported)

// Release gives the permit back, so that another may take its slot. It
// is idempotent: once it has succeeded, Release does nothing and returns
// nil, whichever goroutine calls it; after a failure (the store is down)
// it may be called again, and the permit expires on its own meanwhile.
// ctx bounds the call as it bounds a Take.
func (p *Permit) Release(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released.Load() {
		return nil
	}
	var err error
	n := len(p.hits) - bits.OnesCount64(p.lost.Load())
	if p.elsewhere != nil {
		err, n = p.elsewhere(ctx), p.held
	} else {
		err = p.l.release(ctx, p.hits, nil)
	}
	if p.node != nil {
		// The node's copies of permits handed over (in process: no
		// failure but a bad hit, which the store's release reported).
		_ = p.node.release(ctx, p.nodeHits, nil)
	}
	if tr := permittrace.From(ctx); tr != nil && tr.Released != nil && n > 0 {
		tr.Released(n, err)
	}
	if err != nil {
		return err
	}
	p.released.Store(true)
	return nil
}

// Renew extends each of the permits to a Period from the store's now. A
// permit the store holds no more (it expired: its holder ran a Period
// without renewing; or the store lost it: a Redis restarted empty) is
// acquired again if its key has room, fewer than its limit held, and
// is lost otherwise, for its slot may be another's now: Renew then
// reports false. After Release it reports false and does nothing. A
// holder whose work outlives a Period renews more often than that (Hold
// renews every third of it). The permits of a request that a remote
// service decided (decide.Outcome.Permit) cannot be renewed: Renew fails
// with an error wrapping errors.ErrUnsupported.
func (p *Permit) Renew(ctx context.Context) (bool, error) {
	// Under mu, as Release: a renewal never acquires again a permit
	// released meanwhile.
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released.Load() {
		return false, nil
	}
	if p.elsewhere != nil {
		return false, errRenewElsewhere
	}
	var buf [4]Decision
	out := buf[:]
	if len(p.hits) > len(buf) {
		out = make([]Decision, len(p.hits))
	}
	if p.node != nil {
		// The node's copies, as Release, and whether the store answers
		// or not (the store down, they are what the node's share
		// counts); their decisions are not the Permit's.
		var nbuf [4]Decision
		nout := nbuf[:]
		if len(p.nodeHits) > len(nbuf) {
			nout = make([]Decision, len(p.nodeHits))
		}
		_ = p.node.renew(ctx, p.nodeHits, nout[:len(p.nodeHits)])
	}
	if err := p.l.renew(ctx, p.hits, out[:len(p.hits)]); err != nil {
		return false, err
	}
	renewed, lost := 0, 0
	for i := range p.hits {
		if out[i].Allowed {
			renewed++
		} else if bit := uint64(1) << i; p.lost.Or(bit)&bit == 0 {
			lost++ // newly found lost
		}
	}
	if tr := permittrace.From(ctx); tr != nil {
		if renewed > 0 && tr.Renewed != nil {
			tr.Renewed(renewed)
		}
		if lost > 0 && tr.Lost != nil {
			tr.Lost(lost)
		}
	}
	return renewed == len(p.hits), nil
}

// Hold runs fn while it holds a permit of limit, a Concurrency limit, for
// key (Acquire). When the permit is denied, fn does not run, and Hold
// returns the denial with a nil error: check Decision.Allowed. Otherwise
// it renews the permit every third of the limit's Period while fn runs,
// and releases it when fn returns, or panics (the panic goes on after the
// release), whatever ctx says then. It returns fn's error, joined with
// the release's if that failed (the permit then expires a Period after
// its last renewal).
//
// If a renewal finds the permit lost (the store held it no more, and
// another had taken its slot: fn outlived its Period while the store
// could not be reached, or the store lost it), fn's context is
// cancelled, with a cause (context.Cause) that says so: another may hold
// the slot by then, and fn, if it heeds its context, stops rather than
// run beyond the limit. A renewal that fails (the store is down) cancels
// nothing: the permit may still be held, and the next renewal tries
// again. A Shadow limit's permit is renewed too, but its loss cancels
// nothing.
func (l *Limiter) Hold(ctx context.Context, key string, limit *Limit, fn func(context.Context) error) (d Decision, err error) {
	p, d, err := l.acquireOne(ctx, key, limit)
	if err != nil || !d.Allowed {
		return d, err
	}
	if p == nil {
		// A Shadow limit that would deny: fn runs, holding nothing.
		return d, fn(ctx)
	}
	fctx, stop := p.Keep(ctx)
	defer func() {
		stop()
		if rerr := p.Release(context.WithoutCancel(ctx)); rerr != nil {
			err = errors.Join(err, fmt.Errorf("sluice: releasing the permit: %w", rerr))
		}
	}()
	return d, fn(fctx)
}

// errPermitLost is the cause with which Hold cancels fn's context when
// its permit is lost.
var errPermitLost = permittrace.ErrLost

// renewEvery is how often Hold renews a permit of period: a third of it,
// and at least a millisecond.
func renewEvery(period time.Duration) time.Duration {
	return max(period/3, time.Millisecond)
}

// Keep renews the permits every third of the shortest Period among them
// until stop is called, and returns a context derived from ctx that is
// cancelled when a renewal finds a permit lost (Renew), with a cause
// (context.Cause) that says so: another may hold its slot by then, and
// work that heeds the context stops rather than run beyond the limit. A
// renewal that fails (the store is down) cancels nothing: the permits may
// still be held, and the next renewal tries again. The loss of a Shadow
// limit's permit cancels nothing. The renewals ignore ctx's cancellation;
// stop ends them (and cancels the context returned) and waits for a
// renewal under way; it does not release the permits. Hold is Acquire,
// Keep, the function, stop and Release. The permits of a request that a
// remote service decided (decide.Outcome.Permit) cannot be renewed: Keep
// renews nothing, and its context ends only with ctx or stop.
func (p *Permit) Keep(ctx context.Context) (_ context.Context, stop func()) {
	if p.elsewhere != nil {
		return context.WithCancel(ctx)
	}
	kctx, cancel := context.WithCancelCause(ctx)
	halt, done := make(chan struct{}), make(chan struct{})
	go p.keep(context.WithoutCancel(ctx), cancel, halt, done)
	var once sync.Once
	return kctx, func() {
		once.Do(func() {
			close(halt)
			<-done
			cancel(nil)
		})
	}
}

// keep renews p every third of its shortest Period until stop is closed,
// then closes done. A renewal that finds a permit lost cancels with
// errPermitLost, unless every permit's limit is a Shadow limit, and ends
// the renewals.
func (p *Permit) keep(ctx context.Context, cancel context.CancelCauseFunc, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(renewEvery(p.period))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			held, err := p.Renew(ctx)
			if err == nil && !held {
				if p.enforce {
					cancel(errPermitLost)
				}
				return
			}
		}
	}
}

// Release gives back the permits that hits name (Hit.Permit, with the Key
// and the Concurrency Limit they were acquired with): what a Permit's
// Release does, for a caller that kept only the IDs, such as a server
// asked to release a request's permits by a later request. It is
// idempotent: a permit released, expired or never held is no error and
// changes nothing. Costs are ignored. out, when not nil, gets a Decision
// per hit that says whether the store held its permit and removed it
// (allowed) or held none by that ID (denied: a release repeated, a
// permit expired or never acquired); they report no count.
func (l *Limiter) Release(ctx context.Context, hits []Hit, out []Decision) error {
	return l.release(ctx, hits, out)
}

// release validates the permits of hits and has the store release them,
// writing their decisions to out if it is not nil.
func (l *Limiter) release(ctx context.Context, hits []Hit, out []Decision) error {
	if err := validatePermits(hits); err != nil {
		return err
	}
	if out != nil && len(out) < len(hits) {
		return fmt.Errorf("sluice: %d decisions for %d hits", len(out), len(hits))
	}
	if l.permits == nil {
		return errNoPermits
	}
	return l.permits.Permits(ctx, hits, out, true)
}

// renew validates the permits of hits and has the store renew them,
// writing their decisions to out.
func (l *Limiter) renew(ctx context.Context, hits []Hit, out []Decision) error {
	if err := validatePermits(hits); err != nil {
		return err
	}
	if len(out) < len(hits) || out == nil {
		return fmt.Errorf("sluice: %d decisions for %d hits", len(out), len(hits))
	}
	if l.permits == nil {
		return errNoPermits
	}
	return l.permits.Permits(ctx, hits, out, false)
}

// validatePermits checks hits to release or renew: Concurrency hits, with
// a permit ID.
func validatePermits(hits []Hit) error {
	if len(hits) > MaxHits {
		return fmt.Errorf("%w: %d permits in one call (at most %d)", ErrInvalid, len(hits), MaxHits)
	}
	for i := range hits {
		h := hits[i]
		if h.Limit != nil && h.Limit.Algorithm != Concurrency {
			return fmt.Errorf("%w: hit %d: a permit of a %s limit: only concurrency limits hold permits", ErrInvalid, i, h.Limit.Algorithm)
		}
		h.Cost = 0
		if err := validateHit(i, &h); err != nil {
			return err
		}
		if err := validatePermit(&h, -1); err != nil {
			return err
		}
	}
	return nil
}
