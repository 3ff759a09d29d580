//go:build sluice_exactlua

package luasrc

// Built with -tags sluice_exactlua, Spec gives every limit the class "-",
// so that take.lua decides every hit on the exact path (algo.lua), never
// on fast.lua's: the build that measures what the fast path buys
// (bench/redis.sh with B_TAGS=sluice_exactlua), and that runs the store's
// tests (go test -tags sluice_exactlua ./redisstore/) on the exact path
// alone. This package's TestFastStep and TestFastLog fail in it: no step
// takes the fast path.
func init() { exactOnly = true }
