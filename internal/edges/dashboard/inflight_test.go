package dashboard

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/internal/edges/hitters"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// TestInFlightData: with HeldPermits, a concurrency rule's top askers of
// the hour are listed with the permits each holds in the store now, and
// its offenders carry them too; a rate rule's keys carry none.
func TestInFlightData(t *testing.T) {
	mem := memstore.New(memstore.Config{SweepInterval: -1})
	defer mem.Close()
	dom, err := rules.Parse("api.yaml", []byte("domain: api\ndescriptors:\n  - key: tenant\n    concurrency: {max: 4}\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rules.NewConfig(dom)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(mem), Rules: cfg})
	if err != nil {
		t.Fatal(err)
	}
	top := hitters.New(hitters.Config{})
	defer top.Close()
	ask := func(key, value string) bool {
		var o decide.Outcome
		err := dec.Decide(context.Background(), &decide.Request{Domain: "api", Descriptors: []rules.Descriptor{{Entries: []rules.Entry{{Key: key, Value: value}}, Cost: 1}}}, &o)
		if err != nil {
			t.Fatal(err)
		}
		top.Add(o.Descriptors[0].StatKey, uint64(hitters.NewKeyHash.Entry(key, value)), hitters.OutcomeOf(o.Descriptors[0].Over, false), func(b []byte) []byte { return hitters.AppendEntry(b, 0, key, value) })
		return o.Overall.Allowed
	}
	for range 5 { // 4 held, 1 denied
		ask("tenant", "acme")
	}
	ask("tenant", "bob")
	ask("user", "carol")
	ask("user", "carol")

	mux := http.NewServeMux()
	Register(mux, Config{Tracker: top, InFlight: HeldPermits(dec)})
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/dashboard/data", nil))
	var d data
	if err := json.Unmarshal(rec.Body.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	held := map[string]string{}
	for _, r := range d.Rules {
		for _, it := range r.InFlight {
			held[r.Rule+" "+it.Key] = jsonOf(t, it)
		}
		for _, it := range r.Offenders {
			held[r.Rule+" offender "+it.Key] = jsonOf(t, it)
		}
	}
	want := map[string]string{
		"api.tenant tenant=acme":          `{"key":"tenant=acme","count":5,"count_low":5,"in_flight":4,"in_flight_max":4}`,
		"api.tenant tenant=bob":           `{"key":"tenant=bob","count":1,"count_low":1,"in_flight":1,"in_flight_max":4}`,
		"api.tenant offender tenant=acme": `{"key":"tenant=acme","count":1,"count_low":1,"in_flight":4,"in_flight_max":4}`,
		"api.user offender user=carol":    `{"key":"user=carol","count":1,"count_low":1}`,
	}
	if len(held) != len(want) {
		t.Errorf("listed %v, want %v", held, want)
	}
	for k, w := range want {
		if held[k] != w {
			t.Errorf("%s: %s, want %s", k, held[k], w)
		}
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
