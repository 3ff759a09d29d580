package overrides_test

import (
	"math/rand"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/quick"

	"github.com/sluicehq/sluice/internal/decision/overrides"
)

// idCase is a domain and a path, generated from pieces that hold every
// separator of an ID, "%" escapes and what looks like them, wildcards,
// empty strings and unicode.
type idCase struct {
	Domain string
	Path   []overrides.Entry
}

var idPieces = []string{"", "q", "c", "team", "/", "=", "|", "%", "%2F", "%3D", "%25", "%7C", "%2", "*", "k_*", "ü", "✓", "q/team=c", "a=b", "\x00"}

func idString(r *rand.Rand) string {
	var b strings.Builder
	for range r.Intn(4) {
		b.WriteString(idPieces[r.Intn(len(idPieces))])
	}
	return b.String()
}

func (idCase) Generate(r *rand.Rand, _ int) reflect.Value {
	c := idCase{Domain: idString(r)}
	for range 1 + r.Intn(4) {
		c.Path = append(c.Path, overrides.Entry{Key: idString(r), Value: idString(r)})
	}
	return reflect.ValueOf(c)
}

// checkIDs holds the ID to its contract against the naive reference,
// equality of the domain and the path entry by entry: two cases share an
// ID exactly when they are equal; an ID reads back (ParseID) as its case,
// wildcards included, and that case's ID is the ID again; a path reads
// back (ParsePath) as itself.
func checkIDs(t *testing.T, a, b idCase) {
	t.Helper()
	oa := &overrides.Override{Domain: a.Domain, Path: a.Path}
	ob := &overrides.Override{Domain: b.Domain, Path: b.Path}
	same := a.Domain == b.Domain && slices.Equal(a.Path, b.Path)
	if (oa.ID() == ob.ID()) != same {
		t.Fatalf("%+v and %+v: IDs %q and %q (equal cases: %v)", a, b, oa.ID(), ob.ID(), same)
	}
	for _, o := range []*overrides.Override{oa, ob} {
		d, p, err := overrides.ParseID(o.ID())
		if err != nil || d != o.Domain || !slices.Equal(p, o.Path) {
			t.Fatalf("ParseID(%q) = %q, %+v, %v; want %q, %+v", o.ID(), d, p, err, o.Domain, o.Path)
		}
		if again := (&overrides.Override{Domain: d, Path: p}).ID(); again != o.ID() {
			t.Fatalf("ID -> path -> ID: %q -> %q", o.ID(), again)
		}
		if p, err := overrides.ParsePath(overrides.PathString(o.Path)); err != nil || !slices.Equal(p, o.Path) {
			t.Fatalf("ParsePath(PathString(%+v)) = %+v, %v", o.Path, p, err)
		}
	}
}

// TestIDsQuick: the ID's contract (checkIDs) on generated pairs, half of
// them equal cases, and on pairs that differ in one piece.
func TestIDsQuick(t *testing.T) {
	prop := func(a, b idCase, same bool) bool {
		if same {
			b = idCase{a.Domain, slices.Clone(a.Path)}
		}
		checkIDs(t, a, b)
		return true
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 20000}); err != nil {
		t.Fatal(err)
	}
}

// FuzzID: the ID's contract (checkIDs) on two cases written as fields
// split on "\t": the domain, then keys and values in turn (at least one
// entry: an override's path is never empty).
func FuzzID(f *testing.F) {
	f.Add("api\tuser\tq/team=c", "api\tuser\tq\tteam\tc")
	f.Add("api\tuser\t*", "api\tuser\t%2A")
	f.Add("a|b\tc\td", "a\tb|c\td")
	f.Add("api\tk=\tv", "api\tk\t=v")
	f.Add("api\tk\t%2F", "api\tk\t/")
	f.Add("api\tk\t", "api\tk\t%")
	f.Add("api\tü\t✓/=", "api\tü\t✓%2F=")
	f.Fuzz(func(t *testing.T, a, b string) {
		checkIDs(t, fuzzCase(a), fuzzCase(b))
	})
}

func fuzzCase(s string) idCase {
	f := strings.Split(s, "\t")
	c := idCase{Domain: f[0]}
	for i := 1; i < max(len(f), 2); i += 2 {
		var e overrides.Entry
		if i < len(f) {
			e.Key = f[i]
		}
		if i+1 < len(f) {
			e.Value = f[i+1]
		}
		c.Path = append(c.Path, e)
	}
	return c
}
