package redisstore

import (
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/redisstore/internal/luasrc"
)

// specs caches the spec (luasrc.Spec) of each limit: limits are long-lived
// (a rules file's), and a spec costs a dozen conversions. Per-request
// limits (Envoy overrides) are new on every request; the cache is emptied
// when it holds maxSpecs.
var specs struct {
	m sync.Map // *sluice.Limit -> string
	n atomic.Int64
}

const maxSpecs = 1 << 14

// specOf returns the spec of limit l, whose compiled Params are p.
func specOf(l *sluice.Limit, p *algo.Params) string {
	if v, ok := specs.m.Load(l); ok {
		return v.(string)
	}
	s := luasrc.Spec(p, l.Shadow, int64(l.BlockFor))
	if specs.n.Add(1) > maxSpecs {
		specs.m.Clear()
		specs.n.Store(1)
	}
	specs.m.Store(l, s)
	return s
}
