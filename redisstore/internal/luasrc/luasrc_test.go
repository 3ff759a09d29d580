package luasrc_test

import (
	"flag"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
	"github.com/sluicehq/sluice/redisstore/internal/luasrc"
)

var (
	seedFlag   = flag.Uint64("seed", 1, "base seed of the random cases; each subtest adds its index")
	tracesFlag = flag.Int("traces", 2000, "random traces per algorithm in the differential tests")
)

// driver is a redis-server with testdata/driver.lua (after luasrc.Lib)
// loaded.
type driver struct {
	t    testing.TB
	conn *redistest.Conn
	sha  string
}

func newDriver(t testing.TB) *driver {
	t.Helper()
	src, err := os.ReadFile("testdata/driver.lua")
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.Standalone(t)
	// A batch of traces runs for about a second, more on a loaded machine
	// or under the race detector: allow far more than the default 5s.
	dialer := srv.Dialer()
	dialer.Timeout = 2 * time.Minute
	conn, err := dialer.Dial(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	sha, err := conn.Do("SCRIPT", "LOAD", luasrc.Lib+"\n"+string(src))
	if err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}
	return &driver{t: t, conn: conn, sha: sha.(string)}
}

// run evaluates the cases in the driver's mode in one EVALSHA and returns
// one reply per case.
func (d *driver) run(mode string, cases []string) []string {
	d.t.Helper()
	args := make([]any, 0, 4+len(cases))
	args = append(args, "EVALSHA", d.sha, 0, mode)
	for _, c := range cases {
		args = append(args, c)
	}
	v, err := d.conn.Do(args...)
	if err != nil {
		d.t.Fatalf("EVALSHA %s: %v", mode, err)
	}
	reply, _ := v.([]any)
	if len(reply) != len(cases) {
		d.t.Fatalf("%s: %d replies for %d cases", mode, len(reply), len(cases))
	}
	out := make([]string, len(reply))
	for i, r := range reply {
		out[i], _ = r.(string)
	}
	return out
}

// batches runs cases in EVALs of at most size cases each.
func (d *driver) batches(mode string, cases []string, size int) []string {
	d.t.Helper()
	var out []string
	for len(cases) > 0 {
		k := min(size, len(cases))
		out = append(out, d.run(mode, cases[:k])...)
		cases = cases[k:]
	}
	return out
}

func newRand(t *testing.T, i uint64) (*rand.Rand, uint64) {
	seed := *seedFlag + i
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d (rerun with -seed=%d)", seed, seed-i)
		}
	})
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), seed
}

var (
	two53    = new(big.Int).Lsh(big.NewInt(1), 53)
	maxInt64 = big.NewInt(math.MaxInt64)
)

// bigEdges are operands that sit on the boundaries of int.lua's forms.
func bigEdges() []*big.Int {
	var out []*big.Int
	pow := func(k uint) *big.Int { return new(big.Int).Lsh(big.NewInt(1), k) }
	for _, k := range []uint{0, 24, 48, 52, 53, 54, 63, 64, 72, 96, 127, 128} {
		p := pow(k)
		out = append(out, p, new(big.Int).Sub(p, big.NewInt(1)), new(big.Int).Add(p, big.NewInt(1)))
	}
	return append(out, big.NewInt(0), big.NewInt(2), big.NewInt(10000000), big.NewInt(4294967294))
}

// addBack are dividends and divisors for which Knuth's Algorithm D in base
// 2^24 overestimates a quotient limb by one and must add the divisor back,
// which random operands hit with a probability of about 2^-23 a limb.
var addBack = [][2]string{
	{"39614085979498480212790738944", "2361183522909790928895"},
	{"187072198427982309650762195361888638288248473758867", "664614037506543915950273721589039103"},
	{"1329227916556753358640032416681426944", "79228157791897995461378703360"},
	{"1329227916556755719822710901559001089", "79228157791898136198858670080"},
	{"374144452607828280242119751099386449494152566538239", "562949936644097"},
	{"22300743869302627356619845369263513699090432", "79228162514264556229625905152"},
	{"187072224664455960864887948882475801830293550137345", "39614081257132450271731908608"},
	{"1329227956170832254588115353734217727", "79228160153081034997397192703"},
	{"158456320306162192317462515647", "4722366342132173635583"},
	{"6277101548314476683613162452133897436284540758168713560063", "1329227956170836207539934635034148864"},
}

// randBig returns a value of a random bit length up to bits, with long runs
// of ones and zeros now and then (the corner cases of carries).
func randBig(r *rand.Rand, bits int) *big.Int {
	n := r.IntN(bits + 1)
	x := new(big.Int)
	for i := 0; i < n; i += 32 {
		var w uint64
		switch r.IntN(4) {
		case 0:
			w = 0xffffffff
		case 1:
			w = 0
		default:
			w = uint64(r.Uint32())
		}
		x.Lsh(x, 32).Or(x, new(big.Int).SetUint64(w))
	}
	if n > 0 {
		x.Rsh(x, uint((n+31)/32*32-n))
		x.SetBit(x, n-1, 1)
	}
	return x
}

func intExpect(a, b *big.Int) string {
	cmp := a.Cmp(b)
	bit := func(c bool) string {
		if c {
			return "1"
		}
		return "0"
	}
	sub := new(big.Int).Sub(a, b)
	if sub.Sign() < 0 {
		sub.SetInt64(0)
	}
	mn, mx := a, b
	if cmp > 0 {
		mn, mx = b, a
	}
	sat := a
	if a.Cmp(maxInt64) > 0 {
		sat = maxInt64
	}
	s := fmt.Sprintf("%v %v %v %d %s %s %s %v %v %v",
		new(big.Int).Add(a, b), sub, new(big.Int).Mul(a, b),
		cmp, bit(cmp < 0), bit(cmp <= 0), bit(cmp == 0), mn, mx, sat)
	if b.Sign() != 0 {
		q, m := new(big.Int).QuoRem(a, b, new(big.Int))
		c := new(big.Int).Set(q)
		if m.Sign() != 0 {
			c.Add(c, big.NewInt(1))
		}
		s += fmt.Sprintf(" %v %v %v %v %v", q, m, c, q, m)
	}
	return s
}

// TestInt checks every operation of int.lua against math/big on random
// operands of 0 to 256 bits and on the edges of its representation.
func TestInt(t *testing.T) {
	t.Parallel()
	d := newDriver(t)
	r, _ := newRand(t, 0)
	var as, bs []*big.Int
	edges := bigEdges()
	for _, a := range edges {
		for _, b := range edges {
			as, bs = append(as, a), append(bs, b)
		}
	}
	for _, c := range addBack {
		a, _ := new(big.Int).SetString(c[0], 10)
		b, _ := new(big.Int).SetString(c[1], 10)
		as, bs = append(as, a), append(bs, b)
	}
	for range 20000 {
		var a, b *big.Int
		switch r.IntN(7) {
		case 0: // numbers: the floating-point fast paths
			a, b = randBig(r, 53), randBig(r, 53)
		case 1: // a floor division whose quotient is just below an integer
			b = new(big.Int).Add(randBig(r, 52), big.NewInt(1))
			qmax := (1<<53 - 1) / b.Uint64()
			q := new(big.Int).SetUint64(r.Uint64N(qmax + 1))
			a = q.Mul(q, b).Add(q, new(big.Int).Sub(b, big.NewInt(1)))
			if a.Cmp(two53) >= 0 {
				a.Sub(a, b)
			}
		case 2: // a 256-bit product divided by one of its factors, plus a bit
			b = randBig(r, 128)
			a = new(big.Int).Mul(randBig(r, 128), b)
			a.Add(a, randBig(r, 128))
		case 3: // an exact multiple, or one off, of a short divisor
			b = new(big.Int).Add(randBig(r, 51), big.NewInt(1))
			a = new(big.Int).Mul(randBig(r, 72), b)
			switch r.IntN(3) {
			case 0:
				a.Add(a, big.NewInt(1))
			case 1:
				a.Add(a, b).Sub(a, big.NewInt(1))
			}
		case 4:
			a, b = randBig(r, 128), randBig(r, 64)
		default:
			a, b = randBig(r, 128), randBig(r, 128)
		}
		if r.IntN(20) == 0 {
			b = edges[r.IntN(len(edges))]
		}
		as, bs = append(as, a), append(bs, b)
	}
	cases := make([]string, len(as))
	for i := range as {
		cases[i] = as[i].String() + " " + bs[i].String()
	}
	got := d.batches("int", cases, 5000)
	for i, g := range got {
		if want := intExpect(as[i], bs[i]); g != want {
			t.Fatalf("a=%v b=%v:\n lua %s\n  go %s", as[i], bs[i], g, want)
		}
	}
	t.Logf("%d operand pairs", len(cases))
}

// TestIntParse checks the parsing and formatting of decimal strings:
// leading zeros, the 2^53 boundary, 39-digit values, and strings that are
// not integers.
func TestIntParse(t *testing.T) {
	t.Parallel()
	d := newDriver(t)
	cases := []struct{ in, want string }{
		{"0", "0"},
		{"000", "0"},
		{"0009007199254740993", "9007199254740993"},
		{"9007199254740991", "9007199254740991"},
		{"9007199254740992", "9007199254740992"},
		{"9007199254740993", "9007199254740993"},
		{"18446744073709551615", "18446744073709551615"},
		{"9223372036854775807", "9223372036854775807"},
		{"340282366920938463463374607431768211455", "340282366920938463463374607431768211455"},
		{"0340282366920938463463374607431768211456", "340282366920938463463374607431768211456"},
		{"100000000000000000000000000000", "100000000000000000000000000000"},
		{"1e5", "nil"},
		{"-1", "nil"},
		{"0x10", "nil"},
		{" 1", "nil"},
		{"1.0", "nil"},
		{"", "nil"},
	}
	in := make([]string, len(cases))
	for i, c := range cases {
		in[i] = c.in
	}
	for i, g := range d.run("parse", in) {
		if g != cases[i].want {
			t.Errorf("parse %q: %s, want %s", cases[i].in, g, cases[i].want)
		}
	}
}
