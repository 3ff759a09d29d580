package redisstore

import (
	"flag"
	"os"
	"testing"
)

// TestMain runs the tests that call t.Parallel (the conformance suites,
// the differential runs against memstore, the failovers and the idle
// probe: each on Redis servers of its own, a virtual clock or none of
// the tests' timing bounds) four at once, more than the machine has
// cores, the default of -parallel: they spend much of their time waiting
// for Redis, a round trip at a time, or for a failover. The tests whose
// bounds in time are tight (TestSilentRedis and the like) run alone,
// before them. -parallel, when given, wins.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		flag.Set("test.parallel", "4")
	}
	os.Exit(m.Run())
}
