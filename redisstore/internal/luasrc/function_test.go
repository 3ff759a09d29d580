package luasrc_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/base/algo"
	"github.com/sluicehq/sluice/redisstore/internal/luasrc"
)

// oneStep is a script body, after luasrc.Lib, that runs one algo.step on
// ARGV (kind rate period cap interval a b now n) and returns the result
// and the state as in the driver's step mode.
const oneStep = `
local function one(args)
	local x = {}
	for i = 1, 9 do
		x[i] = int.parse(args[i])
	end
	local p = { kind = x[1], rate = x[2], period = x[3], cap = x[4], interval = x[5], offset = 0 }
	local st2, r = algo.step(p, { a = x[6], b = x[7] }, x[8], x[9])
	return (r.allowed and "1 " or "0 ") .. int.str(r.remaining) .. " " .. int.str(r.reset) .. " " ..
		int.str(r.retry) .. " " .. int.str(st2.a) .. " " .. int.str(st2.b)
end
`

// functionLib returns luasrc.Lib as a Redis 7 function library that
// registers one function, name_step, running oneStep. Code that runs while
// a library loads sees only the redis table, not type, math or string, so
// Lib runs on the first call, and its definitions are kept in an upvalue
// for the calls after it.
func functionLib(name string) string {
	return "#!lua name=" + name + "\n" +
		"local function lib()\n" + luasrc.Lib + oneStep + "return one\nend\n" +
		"local one\n" +
		"redis.register_function('" + name + "_step', function(keys, args)\n" +
		"\tone = one or lib()\n" +
		"\treturn one(args)\n" +
		"end)\n"
}

// TestFunctionLibrary checks that Lib also loads as a function library
// (FUNCTION LOAD), where its definitions run once rather than on every
// call, and that a step called with FCALL matches algo.Step.
func TestFunctionLibrary(t *testing.T) {
	t.Parallel()
	d := newDriver(t)
	if _, err := d.conn.Do("FUNCTION", "LOAD", functionLib("luasrctest")); err != nil {
		t.Fatalf("FUNCTION LOAD: %v", err)
	}
	p := algo.Params{Kind: algo.GCRA, Rate: 1000, Period: 1e9, Capacity: 100}
	s := algo.State{}
	now := int64(1.8e18)
	for i := range 300 {
		s2, r := algo.Step(&p, s, now, 1)
		want := fmt.Sprintf("%s %d %d", fmtResult(r), s2.A, s2.B)
		v, err := d.conn.Do("FCALL", "luasrctest_step", 0, 3, 1000, int64(1e9), 100, 0, s.A, s.B, now, 1)
		if err != nil {
			t.Fatalf("FCALL: %v", err)
		}
		if got := v.(string); got != want {
			t.Fatalf("step %d: lua %s, go %s", i, got, want)
		}
		if r.Allowed {
			s = s2
		}
		now += 3e5
	}
}

// BenchmarkCall measures one decision a call, as the Redis store makes
// them: a realistic GCRA step with its arguments parsed and its result
// formatted, by EVALSHA of Lib plus the body, and by FCALL of a function
// library. cpu-ns/call is the CPU time of redis-server (INFO cpu), command
// and network handling included.
func BenchmarkCall(b *testing.B) {
	d := newDriver(b)
	sha, err := d.conn.Do("SCRIPT", "LOAD", luasrc.Lib+oneStep+"return one(ARGV)\n")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := d.conn.Do("FUNCTION", "LOAD", functionLib("luasrcbench")); err != nil {
		b.Fatal(err)
	}
	args := strings.Fields("3 1000 1000000000 100 0 0 0 1800000000000000000 1")
	for _, c := range []struct {
		name string
		cmd  []any
	}{
		{"evalsha", []any{"EVALSHA", sha, 0}},
		{"fcall", []any{"FCALL", "luasrcbench_step", 0}},
		{"ping", []any{"PING"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			cmd := c.cmd
			if c.name != "ping" {
				for _, a := range args {
					cmd = append(cmd, a)
				}
			}
			cpu := d.cpu()
			for b.Loop() {
				if _, err := d.conn.Do(cmd...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((d.cpu()-cpu)*1e9/float64(b.N), "cpu-ns/call")
		})
	}
}
