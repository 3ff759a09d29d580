package luasrc_test

import (
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/redisstore/internal/luasrc"
)

// BenchmarkLuaStep runs steps requests of one key inside one EVAL, so that
// the Lua cost of a decision is the reported ns/step (the EVAL itself is
// amortized over the steps), and cpu-ns/step is the CPU time redis-server
// used for it (INFO cpu), which other load on the machine does not inflate.
// Each step includes the driver's own int.add of the time step. The
// realistic cases have now about 1.8e18, above 2^53, as every real time
// is; the big ones make every product and quotient take the multi-limb
// paths.
func BenchmarkLuaStep(b *testing.B) {
	const steps = 10000
	const now = "1800000000000000000"
	cases := []struct {
		name, mode, args string
	}{
		// kind rate period cap interval now dt n
		{"gcra", "bench", "3 1000 1000000000 100 0 " + now + " 900000 1"},
		{"token_bucket", "bench", "1 100 60000000000 200 0 " + now + " 500000000 1"},
		{"token_bucket_discrete", "bench", "1 10 1000000000 20 100000000 " + now + " 90000000 1"},
		{"fixed_window", "bench", "0 1000 1000000000 1000 0 " + now + " 900000 1"},
		{"sliding_window", "bench", "4 1000 60000000000 1000 0 " + now + " 55000000 1"},
		{"gcra_day", "bench", "3 1000000 86400000000000 1000000 0 " + now + " 80000000 1"},
		{"gcra_big", "bench", "3 1099511627776 4611686018427387904 1099511627776 0 " + now + " 3000000000000 1000000"},
		{"sliding_window_big", "bench", "4 4294967294 4611686018427387904 4294967294 0 " + now + " 3000000000000 1000"},
		// rate period cap now dt n: a log of up to 100 entries
		{"sliding_log", "benchlog", "100 1000000000 100 " + now + " 9000000 1"},
	}
	d := newDriver(b)
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			arg := fmt.Sprintf("%s %d", c.args, steps)
			cpu := d.cpu()
			for b.Loop() {
				d.run(c.mode, []string{arg})
			}
			total := float64(b.N * steps)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/step")
			b.ReportMetric((d.cpu()-cpu)*1e9/total, "cpu-ns/step")
		})
	}
}

// cpu returns the CPU seconds redis-server has used.
func (d *driver) cpu() float64 {
	v, err := d.conn.UsedCPU()
	if err != nil {
		d.t.Fatal(err)
	}
	return v
}

// BenchmarkLibPrefix measures what luasrc.Lib costs every script that
// starts with it: defining the local functions and tables of int.lua and
// algo.lua, which EVAL does on every call (a library loaded with FUNCTION
// LOAD does it once). One EVAL runs the prefix, wrapped in a function,
// runs times.
func BenchmarkLibPrefix(b *testing.B) {
	const runs = 1000
	d := newDriver(b)
	src := "local function prefix()\n" + luasrc.Lib + "\nreturn algo\nend\n" +
		"for _ = 1, tonumber(ARGV[1]) do prefix() end\nreturn 0\n"
	sha, err := d.conn.Do("SCRIPT", "LOAD", src)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	cpu := d.cpu()
	for b.Loop() {
		if _, err := d.conn.Do("EVALSHA", sha, 0, runs); err != nil {
			b.Fatal(err)
		}
	}
	total := float64(b.N * runs)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/total, "ns/prefix")
	b.ReportMetric((d.cpu()-cpu)*1e9/total, "cpu-ns/prefix")
}
