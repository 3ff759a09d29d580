package sluice

import "github.com/sluicehq/sluice/internal/base/algo"

// ParamsOf is the root's own compilation of l, for the external test that
// holds it equal to package limits' (limits_agree_test.go).
func ParamsOf(l *Limit) algo.Params { return l.params() }
