package rls_test

import (
	"context"
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/rules"
)

// decider answers RLS requests as sluice serve does: the codec converts
// the request, the one door decides it, the codec builds the response.
type decider struct {
	cfg  decide.Config
	core *decide.Decider
}

// outcome is the core's outcome with the response built from it, in the
// exact dialect when Exact is set.
type outcome struct {
	decide.Outcome
	Response *rlsv3.RateLimitResponse
	Exact    bool
}

func newRLSDecider(lim *sluice.Limiter, cfg *rules.Config) *decider {
	d := &decider{cfg: decide.Config{Limiter: lim, Rules: cfg}}
	core, err := decide.New(d.cfg)
	if err != nil {
		panic(err)
	}
	d.core = core
	return d
}

// SetFailover makes a new core with f and the rules in force.
func (d *decider) SetFailover(f decide.Failover) error {
	c := d.cfg
	c.Failover, c.Rules = f, d.core.Rules()
	core, err := decide.New(c)
	if err != nil {
		return err
	}
	d.cfg, d.core = c, core
	return nil
}

func (d *decider) Failover() decide.Failover  { return d.core.Failover() }
func (d *decider) Rules() *rules.Config       { return d.core.Rules() }
func (d *decider) SetRules(cfg *rules.Config) { d.core.SetRules(cfg) }
func (d *decider) Limiter() *sluice.Limiter   { return d.core.Limiter() }
func (d *decider) Core() *decide.Decider      { return d.core }
func (d *decider) Check(req *rlsv3.RateLimitRequest) error {
	var r decide.Request
	if err := rls.Request(req, &r); err != nil {
		return err
	}
	return d.core.Check(&r)
}

func (d *decider) Decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*outcome, error) {
	o := new(outcome)
	if err := d.DecideInto(ctx, req, o); err != nil {
		return nil, err
	}
	return o, nil
}

func (d *decider) DecideInto(ctx context.Context, req *rlsv3.RateLimitRequest, o *outcome) error {
	return decideWith(ctx, d.core, req, o)
}

// DecideDegraded answers req as a core whose remote failed with cause
// does: by the failure policy, the store never asked.
func (d *decider) DecideDegraded(ctx context.Context, req *rlsv3.RateLimitRequest, o *outcome, cause error) error {
	c := d.cfg
	c.Rules, c.Remote = d.core.Rules(), failingRemote{cause}
	core, err := decide.New(c)
	if err != nil {
		return err
	}
	return decideWith(ctx, core, req, o)
}

func decideWith(ctx context.Context, core *decide.Decider, req *rlsv3.RateLimitRequest, o *outcome) error {
	o.Response = nil
	var r decide.Request
	if err := rls.Request(req, &r); err != nil {
		o.Reset()
		return err
	}
	if err := core.Decide(ctx, &r, &o.Outcome); err != nil {
		return err
	}
	o.Response = rls.Response(&o.Outcome, o.Exact)
	return nil
}

// failingRemote is a remote that never answers.
type failingRemote struct{ err error }

func (f failingRemote) Ask(context.Context, *decide.Request, *decide.Outcome) error {
	if f.err == nil {
		return fmt.Errorf("no cause")
	}
	return f.err
}
