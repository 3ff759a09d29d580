package regions_test

import (
	"flag"
	"os"
	"testing"
)

// TestMain runs the tests side by side, more of them at once than the
// machine has cores (the default of -parallel): each starts Redis servers
// of its own and spends most of its time waiting for a window of real
// time to pass or begin (20 s windows, of which a test waits for one
// with 15 s left, and often for the next), not computing. -parallel,
// when given, wins.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		flag.Set("test.parallel", "9")
	}
	os.Exit(m.Run())
}
