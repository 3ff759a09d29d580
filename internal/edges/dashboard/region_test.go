package dashboard

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// getData answers GET /dashboard/data of a dashboard with cfg, decoded
// into a map of its top-level fields.
func getData(t *testing.T, cfg Config) map[string]json.RawMessage {
	t.Helper()
	mux := http.NewServeMux()
	Register(mux, cfg)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/dashboard/data", nil))
	if rec.Code != 200 {
		t.Fatalf("/dashboard/data: %d %s", rec.Code, rec.Body)
	}
	var d map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &d); err != nil {
		t.Fatalf("/dashboard/data: %v: %s", err, rec.Body)
	}
	return d
}

// TestDataRegion: with Region, the data carries the region's figures,
// read at each poll, under the names the page reads; without it, no
// region at all (the page then draws no Region panel).
func TestDataRegion(t *testing.T) {
	if d := getData(t, Config{Title: "sluice serve"}); d["region"] != nil {
		t.Errorf("no region tier, yet region: %s", d["region"])
	}
	calls := 0
	d := getData(t, Config{Region: func() Region {
		calls++
		return Region{Name: "eu", Allocation: 500, Demand: 12, Admitted: 40, Denied: 3, Granted: 200, GivenBack: 50, LedgerErrors: 2, LastGrant: 1_700_000_000}
	}})
	if calls != 1 {
		t.Errorf("Region called %d times for one poll", calls)
	}
	var got map[string]any
	if err := json.Unmarshal(d["region"], &got); err != nil {
		t.Fatalf("region: %v: %s", err, d["region"])
	}
	want := map[string]any{"name": "eu", "allocation": 500.0, "demand": 12.0, "admitted": 40.0, "denied": 3.0,
		"granted": 200.0, "given_back": 50.0, "ledger_errors": 2.0, "last_grant": 1_700_000_000.0}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("region.%s = %v, want %v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("region: %v, want the fields %v", got, want)
	}
}
