package proxy_test

import (
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/rules"
)

// mustDecider is a decision core of lim and cfg: the tests' shorthand of
// decide.New, which fails only on a bad Config.
func mustDecider(lim *sluice.Limiter, cfg *rules.Config) *decide.Decider {
	d, err := decide.New(decide.Config{Limiter: lim, Rules: cfg})
	if err != nil {
		panic(err)
	}
	return d
}
