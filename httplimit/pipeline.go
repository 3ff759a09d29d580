package httplimit

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
)

// The middleware's features are the stages of one pipeline, chosen when
// the Config is built (buildPipeline) and run in this order for every
// request by handler.ServeHTTP:
//
//  1. prepare: the descriptors built from the request (Config.Descriptors),
//     the token reservation (Tokens: the body read, its descriptor
//     added), the concurrency cap (Concurrency: a slot taken, given back
//     by finish), the failure limits' peeks (Failures). A stage that
//     refuses the request answers it, and the pipeline stops.
//  2. a request left with nothing to decide is let through, unlimited;
//  3. check: what is decided before the request's limits (the failure
//     limits first, on their own);
//  4. decide: one decision (reserving the token cost, with Tokens), or
//     the decisions shaping retries (Shaping);
//  5. headers: the rate limit headers, then OpenAI's token headers;
//  6. serve: the handler, under the one stage that watches the response:
//     the token settlement (Tokens), or the failure count (Failures);
//  7. finish: what the stages hold is given back (the concurrency slot).
//
// Two stages may not own the same slot: the decision (shaping retries it;
// a token reservation is taken by one decision and settled against it) or
// the response (read for its token usage; watched for a failure status).
// Such combinations are refused when the Config is built.
type pipeline struct {
	prepare []func(m *middleware, f *flow) bool
	check   []func(m *middleware, f *flow) bool
	decide  func(m *middleware, ctx context.Context, s *scratch) (delayed bool, err error)
	headers []func(m *middleware, h http.Header, s *scratch, denied bool)
	serve   func(m *middleware, f *flow, next http.Handler)
	finish  []func(m *middleware, f *flow)
}

// flow is one request on its way through the pipeline, in its scratch.
type flow struct {
	w          http.ResponseWriter
	r          *http.Request
	s          *scratch
	n          int   // the descriptors of s.main to decide
	fails      int   // the failure limits' peeks, after them
	shadowed   bool  // over a cap or a failure limit, let through in shadow mode
	precharged bool  // the failure was charged before the handler ran
	reserved   int64 // the token reservation
	held       bool  // a concurrency slot is held, under ckey
	ckey       string
}

// slot is what one stage of a pipeline owns alone.
type slot uint8

const (
	slotDecision slot = iota // how the request is decided
	slotResponse             // what watches the response
	numSlots
)

var slotNames = [numSlots]string{"decide the request", "watch the response"}

// owners are the stages that own a pipeline's slots, by feature name.
type owners [numSlots]string

// claim gives slot sl to the feature name, or refuses it when another
// feature owns it.
func (o *owners) claim(name string, sl slot) error {
	if o[sl] != "" {
		return fmt.Errorf("%w: %s cannot be combined with %s: both %s", ErrConfig, name, o[sl], slotNames[sl])
	}
	o[sl] = name
	return nil
}

// buildPipeline composes the stages of the features m has.
func (m *middleware) buildPipeline() error {
	p := &m.pipe
	var own owners
	p.prepare = append(p.prepare, (*middleware).prepareDescriptors)
	p.decide = (*middleware).decideOnce
	p.headers = append(p.headers, (*middleware).rateLimitHeaders)
	p.serve = (*middleware).serveNext
	if m.shaping != nil {
		if err := own.claim("Shaping", slotDecision); err != nil {
			return err
		}
		p.decide = (*middleware).shaped
	}
	if m.failures != nil {
		if err := own.claim("Failures", slotResponse); err != nil {
			return err
		}
	}
	if m.tokens != nil {
		for _, sl := range []slot{slotDecision, slotResponse} {
			if err := own.claim("Tokens", sl); err != nil {
				return err
			}
		}
		p.prepare = append(p.prepare, (*middleware).prepareTokens)
		p.headers = append(p.headers, (*middleware).tokenHeaders)
		p.serve = (*middleware).serveTokens
	}
	if m.conc != nil {
		p.prepare = append(p.prepare, (*middleware).admitConcurrent)
		p.finish = append(p.finish, (*middleware).releaseConcurrent)
	}
	if m.failures != nil {
		p.prepare = append(p.prepare, (*middleware).prepareFailures)
		p.check = append(p.check, (*middleware).failuresFirst)
		p.serve = (*middleware).serveFailures
	}
	return nil
}

// run takes the request of f through the pipeline to next.
func (p *pipeline) run(m *middleware, f *flow, next http.Handler) {
	for _, st := range p.prepare {
		if !st(m, f) {
			return
		}
	}
	if f.n == 0 && f.fails == 0 { // every descriptor skipped: nothing to limit
		res := Unlimited
		if f.shadowed {
			res = Shadow
		}
		m.report(f.w, f.r, res)
		next.ServeHTTP(f.w, f.r)
		return
	}
	for _, st := range p.check {
		if !st(m, f) {
			return
		}
	}
	s := f.s
	delayed, err := p.decide(m, f.r.Context(), s)
	if err != nil {
		m.decisionFailed(f.w, f.r, err)
		return
	}
	o := &s.out
	if m.onOutcome != nil {
		m.onOutcome(s.main.descs, o)
	}
	denied, res := m.result(o, f.shadowed, delayed)
	if pm := o.Permit; pm != nil {
		// The request's slots of its concurrency rules: renewed while
		// it runs, released when it ends, however it ends (an answer, a
		// client gone, an upstream error or timeout, a panic).
		o.Permit = nil
		defer m.releasePermit(f.r.Context(), pm)
		if !denied {
			ctx, stop := pm.Keep(f.r.Context())
			defer stop()
			f.r = f.r.WithContext(ctx)
		}
	}
	// A fail_open answer knows no quota to advertise.
	if o.Degraded != rules.FailOpen {
		for _, st := range p.headers {
			st(m, f.w.Header(), s, denied)
		}
	}
	if denied {
		m.deny(f.w, f.r, s)
		return
	}
	m.report(f.w, f.r, res)
	p.serve(m, f, next)
}

// releasePermit gives back the slots a request held, whatever its own
// context says by then; a failure is logged (the slots expire on their
// own a TTL after their last renewal).
func (m *middleware) releasePermit(ctx context.Context, p *sluice.Permit) {
	if err := p.Release(context.WithoutCancel(ctx)); err != nil {
		if n, ok := m.permitLog.Allow(time.Now()); ok {
			m.log.Warn("could not release a request's concurrency permits; they expire on their own", "domain", m.domain, "err", err, "not_logged", n)
		}
	}
}

// end runs the pipeline's finish stages: what the request held is given
// back, however far it went.
func (p *pipeline) end(m *middleware, f *flow) {
	for _, st := range p.finish {
		st(m, f)
	}
}

// prepareDescriptors builds the request's descriptors (Config.Descriptors).
func (m *middleware) prepareDescriptors(f *flow) bool {
	n, err := m.build(f.s, f.r)
	if err != nil {
		m.invalid(f.w, f.r, err)
		return false
	}
	f.n = n
	return true
}

// decideOnce decides the request once.
func (m *middleware) decideOnce(ctx context.Context, s *scratch) (delayed bool, err error) {
	return false, m.decide(ctx, s)
}

// rateLimitHeaders sets the rate limit headers (Config.Headers).
func (m *middleware) rateLimitHeaders(h http.Header, s *scratch, denied bool) {
	m.setHeaders(h, s, denied)
}

// serveNext serves the admitted request.
func (m *middleware) serveNext(f *flow, next http.Handler) {
	next.ServeHTTP(f.w, f.r)
}
