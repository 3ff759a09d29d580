package main

// Adversarial end-to-end tests of the doors of sluice serve and sluice
// proxy, written for the rows of docs/internals/threats.md that had none:
// a hostile client, a hostile file or a hostile remote against the real
// binary, each failing if its bound breaks.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/base/yamlwalk"
	"github.com/sluicehq/sluice/internal/edges/envoyquota"
	"github.com/sluicehq/sluice/internal/edges/grpcraw"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/internal/testsupport/loopback"
	"github.com/sluicehq/sluice/internal/testsupport/testpart"
	"github.com/sluicehq/sluice/internal/vocab/bounds"
	"github.com/sluicehq/sluice/memstore"
	"github.com/sluicehq/sluice/rules"
)

// hostileRules limit user to 2 a day (the victim's counter), and flood,
// whose every value is a stats key of its own (detailed_metric), to many.
const hostileRules = `domain: h
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: flood
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 1000000}
`

// descs returns n descriptors of entries entries each (keys k0, k1, ...),
// the values made of tag and the descriptor's index, none of which a
// rule of hostileRules matches.
func descs(tag string, n, entries int) []*ratelimitv3.RateLimitDescriptor {
	out := make([]*ratelimitv3.RateLimitDescriptor, n)
	for i := range out {
		kv := make([]string, 0, 2*entries)
		for j := range entries {
			kv = append(kv, fmt.Sprint("k", j), fmt.Sprint(tag, i))
		}
		out[i] = desc(kv...)
	}
	return out
}

// TestServeE2EHostileRequests: a client of the gRPC port and of POST /json
// sends what no Envoy sends, each just over a bound of one request:
// more descriptors, more entries, more bytes, deeper JSON, longer keys
// and values, and hits_addend past MaxCost (including values that wrap
// to negative as int64). Each is refused (InvalidArgument, 400, 413 or
// ResourceExhausted) and consumes nothing, while the same request just
// within the bound is answered. Then it floods a detailed_metric rule
// with distinct values: the rule labels stop at the cap, the rest count
// under _other, and the top keys stop at their rule cap.
func TestServeE2EHostileRequests(t *testing.T) {
	beside(t)
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rulesFile, hostileRules)
	p := startSluice(t, nil, "--config", rulesFile)
	victim := func() *ratelimitv3.RateLimitDescriptor { return desc("user", "victim") }
	// refused checks that req is refused on both transports as too large
	// or invalid, with want in the message; the victim rides along, so
	// that a request consumed in part shows in its remaining count.
	refused := func(t *testing.T, name string, req *rlsv3.RateLimitRequest, want string) {
		t.Helper()
		req.Descriptors = append([]*ratelimitv3.RateLimitDescriptor{victim()}, req.Descriptors...)
		_, err := p.rlReq(req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), want) {
			t.Errorf("%s over gRPC: %v, want InvalidArgument naming %q", name, err, want)
		}
		b, err := protojson.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if code, body, _ := p.http("POST", "/json", string(b)); code != 400 || !strings.Contains(body, want) {
			t.Errorf("%s over HTTP: %d %.300s, want 400 naming %q", name, code, body, want)
		}
	}
	// answered checks that req is answered on both transports.
	answered := func(t *testing.T, name string, req *rlsv3.RateLimitRequest) {
		t.Helper()
		if _, err := p.rlReq(req); err != nil {
			t.Errorf("%s over gRPC: %v, want an answer", name, err)
		}
		b, err := protojson.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if code, body, _ := p.http("POST", "/json", string(b)); code != 200 && code != 429 {
			t.Errorf("%s over HTTP: %d %.300s, want an answer", name, code, body)
		}
	}
	victimUntouched := func(t *testing.T) {
		t.Helper()
		if rem := p.must("h", peek(victim())).Statuses[0].LimitRemaining; rem != 2 {
			t.Errorf("the victim has %d of 2 left: a refused request consumed", rem)
		}
	}

	t.Run("counts", func(t *testing.T) {
		p.t = t
		req := func(ds []*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
			return &rlsv3.RateLimitRequest{Domain: "h", Descriptors: ds}
		}
		refused(t, "descriptors", req(descs("d", bounds.MaxDescriptors, 1)), "more than 256 descriptors")
		refused(t, "entries of one", req(descs("e", 1, bounds.MaxEntries+1)), "more than 64 entries")
		refused(t, "entries in all", req(descs("a", bounds.MaxTotalEntries/bounds.MaxEntries, bounds.MaxEntries)), "entries in all")
		refused(t, "20,000 descriptors", req(descs("x", 20_000, 1)), "more than 256 descriptors")
		victimUntouched(t)
		answered(t, "descriptors at the bound", req(descs("d", bounds.MaxDescriptors, 1)))
		answered(t, "entries of one at the bound", req(descs("e", 1, bounds.MaxEntries)))
		answered(t, "entries in all at the bound", req(descs("a", bounds.MaxTotalEntries/bounds.MaxEntries, bounds.MaxEntries)))
	})

	t.Run("bytes", func(t *testing.T) {
		p.t = t
		// A gRPC message over the bound is refused by gRPC itself.
		huge := &rlsv3.RateLimitRequest{Domain: strings.Repeat("x", server.MaxRequestBytes), Descriptors: []*ratelimitv3.RateLimitDescriptor{victim()}}
		if _, err := p.rlReq(huge); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a message of %d bytes: %v, want ResourceExhausted", server.MaxRequestBytes, err)
		}
		b, _ := protojson.Marshal(huge)
		if code, body, _ := p.http("POST", "/json", string(b)); code != 413 {
			t.Errorf("a body of %d bytes: %d %.200s, want 413", len(b), code, body)
		}
		// Bytes that are not a RateLimitRequest: refused before any
		// decoding, never an internal error.
		for _, b := range [][]byte{[]byte("GET / HTTP/1.1\r\n\r\n"), {0x12, 0x7f, 0x0a}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}} {
			err := p.conn.Invoke(t.Context(), rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &grpcraw.Message{Bytes: b}, &grpcraw.Message{}, grpc.ForceCodecV2(grpcraw.Codec()))
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("%q over gRPC: %v, want InvalidArgument", b, err)
			}
		}
		// JSON nested deeper than any request, within the byte bound.
		for _, depth := range []int{33, 400_000} {
			deep := `{"domain":"h","descriptors":[{"entries":[{"key":"user","value":"victim"}]}],"x":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`
			if code, body, _ := p.http("POST", "/json", deep); code != 400 || !strings.Contains(body, "nested") {
				t.Errorf("JSON nested %d deep: %d %.200s, want 400 naming the nesting", depth, code, body)
			}
		}
		victimUntouched(t)
	})

	t.Run("entry length", func(t *testing.T) {
		p.t = t
		long := strings.Repeat("v", rules.MaxEntryLen+1)
		for name, d := range map[string]*ratelimitv3.RateLimitDescriptor{
			"a value of 1,025 bytes": desc("user", long),
			"a key of 1,025 bytes":   desc(long, "v"),
		} {
			refused(t, name, &rlsv3.RateLimitRequest{Domain: "h", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}, "longer than 1024 bytes")
		}
		victimUntouched(t)
		at := desc("user", long[:rules.MaxEntryLen])
		if got := codesOf(p.must("h", at)); got != "OK:OK" {
			t.Errorf("a value of 1,024 bytes: %s, want OK:OK", got)
		}
	})

	t.Run("hits_addend", func(t *testing.T) {
		p.t = t
		for _, n := range []uint64{math.MaxUint64, 1 << 63, sluice.MaxCost + 1} {
			d := desc("user", "bulk")
			d.HitsAddend = wrapperspb.UInt64(n)
			refused(t, fmt.Sprintf("descriptor hits_addend %d", n), &rlsv3.RateLimitRequest{Domain: "h", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}, "too large")
		}
		victimUntouched(t)
		if rem := p.must("h", peek(desc("user", "bulk"))).Statuses[0].LimitRemaining; rem != 2 {
			t.Errorf("user=bulk has %d of 2 left after refused requests", rem)
		}
		// The request's hits_addend is a uint32: its largest is a cost.
		r, err := p.rlReq(&rlsv3.RateLimitRequest{Domain: "h", HitsAddend: math.MaxUint32, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "big")}})
		if err != nil || codesOf(r) != "OVER_LIMIT:OVER_LIMIT" {
			t.Errorf("request hits_addend MaxUint32: %v %v, want OVER_LIMIT", codesOf(r), err)
		}
		// MaxCost itself is a cost: over the limit, denied, and (as
		// envoy-rl counts) a debt that no arithmetic wraps.
		d := desc("user", "debtor")
		d.HitsAddend = wrapperspb.UInt64(sluice.MaxCost)
		if got := codesOf(p.must("h", d)); got != "OVER_LIMIT:OVER_LIMIT" {
			t.Errorf("hits_addend MaxCost: %s, want OVER_LIMIT", got)
		}
		for range 2 {
			if got := codesOf(p.must("h", d)); got != "OVER_LIMIT:OVER_LIMIT" {
				t.Errorf("hits_addend MaxCost again: %s, want OVER_LIMIT", got)
			}
		}
		if got := codesOf(p.must("h", desc("user", "debtor"))); got != "OVER_LIMIT:OVER_LIMIT" {
			t.Errorf("after debts of 3×MaxCost: %s, want OVER_LIMIT (a wrapped counter would admit)", got)
		}
	})

	t.Run("limit override", func(t *testing.T) {
		p.t = t
		// A descriptor's own limit (Envoy's override) is the caller's
		// to choose, on a counter of its own: the rules' counter of the
		// same entries is untouched.
		d := victim()
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: math.MaxUint32, Unit: typev3.RateLimitUnit_SECOND}
		for range 3 {
			if got := codesOf(p.must("h", d)); got != "OK:OK" {
				t.Errorf("the victim's entries under an override of 4 billion a second: %s", got)
			}
		}
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(math.MaxUint32)}
		refused(t, "an override of 136 years", &rlsv3.RateLimitRequest{Domain: "h", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}, "too long")
		victimUntouched(t)
	})

	t.Run("label cardinality", func(t *testing.T) {
		p.t = t
		const values = server.DefaultMaxRuleLabels + 500
		for start := 0; start < values; start += sluice.MaxHits {
			var ds []*ratelimitv3.RateLimitDescriptor
			for i := start; i < min(start+sluice.MaxHits, values); i++ {
				ds = append(ds, desc("flood", fmt.Sprint("v", i)))
			}
			p.must("h", ds...)
		}
		// Some 50,000 series: under -race on a loaded machine, a scrape
		// takes longer than the harness's usual wait.
		start := time.Now()
		resp, err := (&http.Client{Timeout: 4 * e2eWait}).Get("http://" + p.httpAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		body := string(b)
		t.Logf("/metrics: %d bytes in %v", len(body), time.Since(start).Round(time.Millisecond))
		labels, hits, other := 0, 0.0, 0.0
		for line := range strings.SplitSeq(body, "\n") {
			series, value, ok := strings.Cut(line, " ")
			if !ok || !strings.HasPrefix(series, `sluice_rule_hits_total{domain="h",`) {
				continue
			}
			var v float64
			fmt.Sscan(value, &v)
			switch {
			case strings.Contains(series, `rule="_other"`):
				other = v
			case strings.Contains(series, `rule="h.flood_`):
				labels++
				hits += v
			}
		}
		if labels > server.DefaultMaxRuleLabels || other == 0 || hits+other != values {
			t.Errorf("%d rule labels of flood values holding %v hits, %v under _other; want at most %d labels and the %d hits all counted",
				labels, hits, other, server.DefaultMaxRuleLabels, values)
		}
	})

	t.Run("top keys", func(t *testing.T) {
		p.t = t
		// The top keys keep at most 100 rules (stats keys), whatever
		// the flood of detailed_metric values above, and the text of
		// a key cut at 96 bytes.
		p.must("h", desc("user", strings.Repeat("w", rules.MaxEntryLen)))
		code, body, _ := httpDo(t, "GET", "http://"+p.dbg+"/hitters?kind=requests&k=1", "")
		var reports []struct{ Rule string }
		if err := json.Unmarshal([]byte(body), &reports); code != 200 || err != nil {
			t.Fatalf("/hitters: %d %v", code, err)
		}
		if len(reports) > 100 {
			t.Errorf("/hitters: %d rules, want at most 100", len(reports))
		}
		if code, _, _ := httpDo(t, "GET", "http://"+p.dbg+"/hitters?k=1001", ""); code != 400 {
			t.Errorf("/hitters?k=1001: %d, want 400", code)
		}
		code, body, _ = httpDo(t, "GET", "http://"+p.dbg+"/hitters?rule=h.user&kind=requests&k=1000", "")
		var users []struct{ Top []struct{ Key string } }
		if err := json.Unmarshal([]byte(body), &users); code != 200 || err != nil || len(users) != 1 {
			t.Fatalf("/hitters?rule=h.user: %d %v %.300s", code, err, body)
		}
		long := false
		for _, it := range users[0].Top {
			if len(it.Key) > 96+len("…") {
				t.Errorf("/hitters shows a key of %d bytes, want at most 96 and an ellipsis", len(it.Key))
			}
			long = long || strings.HasPrefix(it.Key, "user=www")
		}
		if !long {
			t.Errorf("/hitters lacks the long key, cut: %.300s", body)
		}
	})

	if code, _, _ := p.http("GET", "/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz after the hostile requests: %d", code)
	}

	t.Run("keys under --max-bytes", func(t *testing.T) {
		// A flood of distinct keys: the store stays within its cap, the
		// keys due to idle soonest evicted and counted.
		const capBytes = 256 << 10
		q := startSluice(t, nil, "--config", rulesFile, "--max-bytes", "256KiB")
		for start := 0; start < 30_000; start += sluice.MaxHits {
			var ds []*ratelimitv3.RateLimitDescriptor
			for i := start; i < start+sluice.MaxHits; i++ {
				ds = append(ds, desc("user", fmt.Sprint("u", i)))
			}
			q.must("h", ds...)
		}
		keys, size, evicted := q.metricSum("sluice_store_keys"), q.metricSum("sluice_store_bytes"), q.metricSum("sluice_store_evictions_total")
		if size > capBytes || keys == 0 || evicted == 0 {
			t.Errorf("after 30,000 keys: %v keys in %v bytes, %v evicted; want them within --max-bytes %d, the rest evicted", keys, size, evicted, capBytes)
		}
		t.Logf("after 30,000 keys: %v keys in %v bytes, %v evicted", keys, size, evicted)
	})
}

// adminDo sends one request to the admin API of p with the Authorization
// header auth (none when empty) and returns the status and body.
func adminDo(t *testing.T, p *proc, method, path, auth, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+p.addr("admin")+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeE2EAdminHostile: the admin API of the real binary against a
// caller without the token, and a caller with it who sends what the API
// must refuse. Every route refuses a missing, malformed, truncated,
// extended or foreign token (401) and changes nothing; with the token,
// bodies over 1 MiB (413), paths of 17 entries, keys, values and domains
// over 1,024 bytes, pages over 1,000, an import with one bad line and an
// explain of 257 descriptors are refused (400) and change nothing. At
// the end the overrides file is attacked: a torn last line (a crash
// mid-append) is dropped at start, a damaged line before it stops the
// start with its line named, and nothing else of the file is lost.
func TestServeE2EAdminHostile(t *testing.T) {
	beside(t)
	args, _ := overridesServe(t, 5)
	const secret = "0123456789abcdef0123456789abcdef"
	p := startSluice(t, nil, args...)
	good := "Bearer " + secret
	put := `{"domain":"api","path":[{"key":"tenant","value":"acme"}],"limit":{"blocked":true}}`
	routes := []struct{ method, path, body string }{
		{"PUT", "/v1/override", put},
		{"GET", "/v1/override?domain=api&path=tenant=acme", ""},
		{"DELETE", "/v1/override?domain=api&path=tenant=acme", ""},
		{"GET", "/v1/overrides", ""},
		{"POST", "/v1/overrides/import", put + "\n"},
		{"GET", "/v1/overrides/export", ""},
		{"POST", "/v1/explain", `{"domain":"api","descriptors":[[{"key":"tenant","value":"acme"}]]}`},
	}
	for _, auth := range []string{
		"", "Bearer", "Bearer ", "bearer " + secret, "Basic " + secret, "Bearer " + secret[:len(secret)-1],
		"Bearer " + secret + "0", "Bearer " + secret[:16], "Bearer " + strings.Repeat("f", len(secret)), secret,
		"Bearer " + secret + " " + secret, "Bearer\t" + secret,
	} {
		for _, r := range routes {
			if code, body := adminDo(t, p, r.method, r.path, auth, r.body); code != http.StatusUnauthorized {
				t.Errorf("%s %s with Authorization %q: %d %.200s, want 401", r.method, r.path, auth, code, body)
			}
		}
	}
	nothingStored := func(when string) {
		t.Helper()
		if code, body := adminDo(t, p, "GET", "/v1/overrides", good, ""); code != 200 || !strings.Contains(body, `"overrides":[]`) {
			t.Errorf("%s: list %d %s, want no override", when, code, body)
		}
		if got := codesOf(p.must("api", desc("tenant", "acme"))); got != "OK:OK" {
			t.Errorf("%s: tenant=acme %s, want OK under the rules (5 an hour)", when, got)
		}
	}
	nothingStored("after calls without the token")

	long := strings.Repeat("v", rules.MaxEntryLen+1)
	path := make([]string, 17)
	for i := range path {
		path[i] = fmt.Sprintf(`{"key":"k%d","value":"v"}`, i)
	}
	for _, c := range []struct {
		name, method, path, body string
		code                     int
	}{
		{"a body of 1 MiB and a byte", "PUT", "/v1/override", `{"domain":"api","note":"` + strings.Repeat("n", 1<<20) + `"}`, 413},
		{"17 path entries", "PUT", "/v1/override", `{"domain":"api","path":[` + strings.Join(path, ",") + `],"limit":{"blocked":true}}`, 400},
		{"a value over 1,024 bytes", "PUT", "/v1/override", `{"domain":"api","path":[{"key":"tenant","value":"` + long + `"}],"limit":{"blocked":true}}`, 400},
		{"a key over 1,024 bytes", "PUT", "/v1/override", `{"domain":"api","path":[{"key":"` + long + `","value":"acme"}],"limit":{"blocked":true}}`, 400},
		{"a domain over 1,024 bytes", "PUT", "/v1/override", `{"domain":"` + long + `","path":[{"key":"tenant","value":"acme"}],"limit":{"blocked":true}}`, 400},
		{"a page of 1,001", "GET", "/v1/overrides?limit=1001", "", 400},
		{"an import with one bad line", "POST", "/v1/overrides/import", put + "\n" + strings.Replace(put, "acme", "beta", 1) + "\n" + `{"domain":"api","path":[],"limit":{"blocked":true}}` + "\n", 400},
		{"an import line of 1 MiB", "POST", "/v1/overrides/import", put + "\n" + `{"domain":"api","note":"` + strings.Repeat("n", 1<<20) + `"}` + "\n", 400},
		{"an explain of 257 descriptors", "POST", "/v1/explain", `{"domain":"api","descriptors":[` + strings.TrimSuffix(strings.Repeat(`[{"key":"tenant","value":"acme"}],`, 257), ",") + `]}`, 400},
		{"an explain of a 1,025-byte value", "POST", "/v1/explain", `{"domain":"api","descriptors":[[{"key":"tenant","value":"` + long + `"}]]}`, 400},
	} {
		if code, body := adminDo(t, p, c.method, c.path, good, c.body); code != c.code {
			t.Errorf("%s: %d %.300s, want %d", c.name, code, body, c.code)
		}
	}
	nothingStored("after refused calls with the token")

	// The overrides file: two overrides, then a torn append.
	if code, body := adminDo(t, p, "PUT", "/v1/override", good, put); code != 200 {
		t.Fatalf("put: %d %s", code, body)
	}
	if code, body := adminDo(t, p, "PUT", "/v1/override", good, strings.Replace(put, "acme", "beta", 1)); code != 200 {
		t.Fatalf("put: %d %s", code, body)
	}
	if code := p.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d", code)
	}
	file := args[slices.Index(args, "--overrides-file")+1]
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, append(bytes.Clone(data), `{"op":"put","after":{"domain":"api","pa`...), 0o600); err != nil {
		t.Fatal(err)
	}
	p = startSluice(t, nil, args...)
	for _, tenant := range []string{"acme", "beta"} {
		if got := codesOf(p.must("api", desc("tenant", tenant))); got != "OVER_LIMIT:OVER_LIMIT" {
			t.Errorf("after a torn last line, tenant=%s: %s, want its block kept", tenant, got)
		}
	}
	p.stop(syscall.SIGTERM)
	// A damaged line that is not the last: refused at start, by line.
	lines := strings.SplitAfter(string(data), "\n")
	lines[0] = strings.Replace(lines[0], `"op":"put"`, `"op":"pwn"`, 1)
	if err := os.WriteFile(file, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := launch(t, nil, args...)
	if code := bad.wait(); code != 1 || !strings.Contains(bad.log(), "line 1") {
		t.Errorf("a damaged overrides file: exit %d, want 1 naming line 1:\n%s", code, bad.log())
	}
}

// TestServeE2EHostileStateFile: the --state-file of sluice serve, written
// by someone else. A snapshot of 30,000 keys restored under --max-bytes
// 512KiB keeps the store within its cap; a snapshot crafted with a correct
// checksum whose sketch record claims the largest dimensions in a few
// bytes is refused at start (moved aside, the node starts empty) without
// the process allocating what the record claims.
func TestServeE2EHostileStateFile(t *testing.T) {
	beside(t)
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	writeRules(t, rulesFile, dayRule("s", "k", 5))

	t.Run("over the cap", func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "state")
		big := memstore.New(memstore.Config{})
		lim := sluice.NewLimiter(big)
		l := &sluice.Limit{Rate: 10, Period: time.Hour}
		for i := range 30_000 {
			if _, err := lim.Allow(t.Context(), fmt.Sprint("k", i), l); err != nil {
				t.Fatal(err)
			}
		}
		if err := big.WriteFile(state); err != nil {
			t.Fatal(err)
		}
		big.Close()
		const capBytes = 512 << 10
		p := startSluice(t, nil, "--config", rulesFile, "--state-file", state, "--max-bytes", "512KiB")
		p.waitLog("state restored")
		keys, size := p.metricSum("sluice_store_keys"), p.metricSum("sluice_store_bytes")
		if size > capBytes || keys == 0 || keys >= 30_000 {
			t.Errorf("restored %v keys in %v bytes under --max-bytes %d, want some keys within the cap", keys, size, capBytes)
		}
		t.Logf("%v of 30,000 keys restored in %v bytes", keys, size)
	})

	t.Run("crafted sketch", func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "state")
		if err := os.WriteFile(state, craftedSnapshot(), 0o600); err != nil {
			t.Fatal(err)
		}
		p := startSluice(t, nil, "--config", rulesFile, "--state-file", state)
		p.waitLog("state file is corrupt", state+".corrupt")
		if got := codesOf(p.must("s", desc("k", "v"))); got != "OK:OK" {
			t.Errorf("after a refused state file: %s, want OK:OK", got)
		}
		// The record claims 2 × 2^24 cells of 4 bytes, 128 MiB; the
		// process allocates a fraction of that in all.
		if got := p.metricSum("go_memstats_alloc_bytes_total"); got > 64<<20 {
			t.Errorf("the process allocated %v bytes at start with a 124-byte state file, want under 64 MiB", got)
		}
	})
}

// craftedSnapshot is a memstore snapshot (version 2, memstore/snapshot.go)
// of one sketch record that claims the largest dimensions (4096 × 4096
// cells) and holds a sketch header without cells, sealed with a correct
// checksum.
func craftedSnapshot() []byte {
	le := binary.LittleEndian
	b := le.AppendUint32(le.AppendUint32([]byte("SLUICEMS"), 2), 0)
	b = le.AppendUint64(b, 0x5eed)
	b = le.AppendUint64(b, uint64(time.Now().UnixNano()))
	b = append(b, 0x01)
	b = le.AppendUint32(b, 1)
	b = append(b, 's')
	b = le.AppendUint64(le.AppendUint64(le.AppendUint64(b, 10), uint64(time.Second)), 10)
	b = le.AppendUint32(le.AppendUint32(b, 4096), 4096)
	b = le.AppendUint64(b, uint64(time.Now().Add(time.Hour).UnixNano()))
	blob := le.AppendUint64(le.AppendUint64(le.AppendUint32(le.AppendUint32([]byte("sluice-cms-1\n"), 2), 2), 0), 0)
	b = le.AppendUint32(b, uint32(len(blob)))
	b = append(append(b, blob...), 0xff)
	return le.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// aliasBomb is a rules file whose descriptors nest ten levels of ten
// aliases of the level below: 10^10 descriptors once expanded, in a few
// hundred bytes.
func aliasBomb(domain string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n  - &a0 {key: k0, rate_limit: {unit: day, requests_per_unit: 1}}\n", domain)
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&b, "  - &a%d {key: k%d, descriptors: [%s]}\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*a%d, ", i-1), 10), ", "))
	}
	return b.String()
}

// TestServeE2EHostileRulesFile: a rules file that expands to 10^10
// descriptors through YAML aliases (a billion laughs), written over the
// rules in force, is refused within the parser's bounds (its budget of
// node visits, its 100 problems): the reload fails, is counted and logged
// in at most 101 problem lines, and the rules in force stay; at start,
// the same file stops the process with the problems named.
func TestServeE2EHostileRulesFile(t *testing.T) {
	beside(t)
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rulesFile, dayRule("r", "user", 1))
	p := startSluice(t, nil, "--config", rulesFile)
	if got := codesOf(p.must("r", desc("user", "a"))); got != "OK:OK" {
		t.Fatal(got)
	}
	writeRules(t, rulesFile, aliasBomb("r"))
	poll(t, "the reload refused", func() bool { return p.metric(`sluice_config_loads_total{result="failure"}`) == "1" })
	p.waitLog(`"msg":"rules reload rejected`)
	if n := strings.Count(p.log(), `"msg":"rules problem"`); n == 0 || n > yamlwalk.MaxProblems+1 {
		t.Errorf("%d rules problems logged, want from 1 to %d", n, yamlwalk.MaxProblems+1)
	}
	if got := codesOf(p.must("r", desc("user", "a"))); got != "OVER_LIMIT:OVER_LIMIT" {
		t.Errorf("after the refused reload: %s, want the rules in force (1 a day)", got)
	}
	bomb := filepath.Join(t.TempDir(), "bomb.yaml")
	writeRules(t, bomb, aliasBomb("b"))
	q := launch(t, nil, "--config", bomb)
	if code := q.wait(); code != 1 || !strings.Contains(q.log(), "more than 100 problems") || len(q.log()) > 1<<20 {
		t.Errorf("start with the bomb: exit %d and %d bytes of log, want 1 and the problems cut at 100:\n%.3000s", code, len(q.log()), q.log())
	}
}

// hostileProxyRules: client addresses from X-Forwarded-For of 127.0.0.1
// alone, IPv6 grouped by /64; routes keyed by the address, an API key, the
// path; one capped at 2 in flight per client, one shaped, one by its host.
const hostileProxyRules = `domain: api
http:
  client_ip: {trusted_proxies: [127.0.0.1], ipv6_prefix: 64}
  routes:
    - pattern: /ip
      descriptors: [[{key: remote_address}]]
    - pattern: /key
      descriptors: [[{key: api_key, api_key: X-Api-Key}]]
    - pattern: /path/
      descriptors: [[{key: path, source: path}]]
    - pattern: /slow
      descriptors: [[{key: tier, value: gold}]]
      concurrency: {max: 2}
    - pattern: /shaped
      descriptors: [[{key: shaped, source: remote_address}]]
      shaping: {max_delay: 5s, max_queue: 2}
    - pattern: "Api.Example.COM./host"
      descriptors: [[{key: vhost, value: api}]]
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: shaped
    rate_limit: {algorithm: leaky_bucket, unit: second, unit_multiplier: 2, requests_per_unit: 1, burst: 1}
  - key: vhost
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_log}
`

// rawStatus sends raw, a whole HTTP/1.1 request, to addr and returns the
// status of the answer (0 when the server closed the connection without
// one).
func rawStatus(t *testing.T, addr, raw string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, e2eWait)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(e2eWait))
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestProxyE2EHostileClient: clients of the real sluice proxy that try to
// pick their key, escape their limit, or hold the proxy's resources:
//   - a peer that is not a trusted proxy writes X-Forwarded-For, a new
//     address each time: it is limited as itself;
//   - through the trusted proxy, a client writes addresses to the left of
//     the one the proxy appended: only the appended one counts;
//   - a client rotates through its IPv6 /64: one limit for all;
//   - API keys over 256 bytes, sent twice or holding control characters,
//     and paths over 1,024 bytes or of invalid UTF-8, are refused (400)
//     and charge no one;
//   - a client starts 6 requests where 2 may be in flight: 2 reach the
//     upstream, 4 are denied at once;
//   - a client sends 8 requests at once to a shaped route of 1 every 2 s
//     with a queue of 2: the upstream sees the one the bucket holds and
//     the two queued, the 5 others are denied at once.
//   - a client spells a route's host otherwise (in capitals, with a
//     trailing dot, a port, in an absolute URI): held to the route's limit
//     of 1; a percent-escaped Host and CONNECT are refused.
func TestProxyE2EHostileClient(t *testing.T) {
	beside(t)
	release := make(chan struct{})
	var inFlight, most, shaped atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			n := inFlight.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-release
			inFlight.Add(-1)
		case "/shaped":
			shaped.Add(1)
		}
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, hostileProxyRules)
	p := startProxy(t, "--config", file, "--upstream", up.URL)
	front := "http://" + p.addrs["proxy"]
	get := func(c *http.Client, path string, header http.Header) (int, http.Header) {
		t.Helper()
		req, err := http.NewRequest("GET", front+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = header
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	statuses := func(c *http.Client, path string, headers ...http.Header) string {
		t.Helper()
		var out []string
		for _, h := range headers {
			code, _ := get(c, path, h)
			out = append(out, strconv.Itoa(code))
		}
		return strings.Join(out, ",")
	}
	// status is get for other goroutines than the test's: 0 on an error.
	status := func(path string) int {
		resp, err := http.Get(front + path)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	xff := func(v string) http.Header { return http.Header{"X-Forwarded-For": {v}} }
	const limited = "200,200,200,429,429"

	t.Run("untrusted peer", func(t *testing.T) {
		var hs []http.Header
		for i := range 5 {
			hs = append(hs, xff(fmt.Sprint("198.51.100.", i)))
		}
		if got := statuses(loopback.Client(t, "127.0.0.2"), "/ip", hs...); got != limited {
			t.Errorf("a peer not trusted, a new X-Forwarded-For each time: %s, want %s", got, limited)
		}
	})
	t.Run("spoofed left part", func(t *testing.T) {
		var hs []http.Header
		for i := range 5 {
			hs = append(hs, xff(fmt.Sprintf("203.0.113.%d, 10.0.0.%d, 192.0.2.77", i, i)))
		}
		if got := statuses(http.DefaultClient, "/ip", hs...); got != limited {
			t.Errorf("addresses written left of the proxy's: %s, want %s", got, limited)
		}
	})
	t.Run("IPv6 rotation", func(t *testing.T) {
		var hs []http.Header
		for i := range 5 {
			hs = append(hs, xff(fmt.Sprintf("2001:db8:1:2:%x:%x::%x", i*7919&0xffff, i*104729&0xffff, i+1)))
		}
		if got := statuses(http.DefaultClient, "/ip", hs...); got != limited {
			t.Errorf("five addresses of one /64: %s, want %s", got, limited)
		}
		if got := statuses(http.DefaultClient, "/ip", xff("2001:db8:1:3::1")); got != "200" {
			t.Errorf("another /64: %s, want 200", got)
		}
	})
	t.Run("bad values", func(t *testing.T) {
		addr := p.addrs["proxy"]
		long := strings.Repeat("k", 257)
		for name, raw := range map[string]string{
			"an API key of 257 bytes":  "GET /key HTTP/1.1\r\nHost: x\r\nX-Api-Key: " + long + "\r\n\r\n",
			"an API key sent twice":    "GET /key HTTP/1.1\r\nHost: x\r\nX-Api-Key: mine\r\nX-Api-Key: victim\r\n\r\n",
			"an API key with a DEL":    "GET /key HTTP/1.1\r\nHost: x\r\nX-Api-Key: victim\x7f\r\n\r\n",
			"an API key of bad UTF-8":  "GET /key HTTP/1.1\r\nHost: x\r\nX-Api-Key: victim\xff\r\n\r\n",
			"a path of 1,030 bytes":    "GET /path/" + strings.Repeat("p", 1024) + " HTTP/1.1\r\nHost: x\r\n\r\n",
			"a path of bad UTF-8":      "GET /path/%ff HTTP/1.1\r\nHost: x\r\n\r\n",
			"a path with a NUL":        "GET /path/a%00b HTTP/1.1\r\nHost: x\r\n\r\n",
			"an API key with a CR LF ": "GET /key HTTP/1.1\r\nHost: x\r\nX-Api-Key: mine\rX-Api-Key: victim\r\n\r\n",
		} {
			if code := rawStatus(t, addr, raw); code != 400 {
				t.Errorf("%s: %d, want 400", name, code)
			}
		}
		// No key was charged: the victim's key has its whole limit.
		if code, h := get(http.DefaultClient, "/key", http.Header{"X-Api-Key": {"victim"}}); code != 200 || h.Get("X-RateLimit-Remaining") != "2" {
			t.Errorf("the victim's key after the bad requests: %d, %s left, want 200 and 2", code, h.Get("X-RateLimit-Remaining"))
		}
	})
	t.Run("host spelling", func(t *testing.T) {
		addr := p.addrs["proxy"]
		req := func(target, host string) string { return "GET " + target + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n" }
		var got []string
		for _, raw := range []string{
			req("/host", "api.example.com"),
			req("/host", "API.Example.com"),
			req("/host", "api.example.com."),
			req("/host", "API.EXAMPLE.COM.:8090"),
			req("http://API.EXAMPLE.COM./host", "elsewhere.example"),
			req("/host", "api%2Eexample.com"),
			"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n",
		} {
			got = append(got, strconv.Itoa(rawStatus(t, addr, raw)))
		}
		if want := "200,429,429,429,429,400,400"; strings.Join(got, ",") != want {
			t.Errorf("one host in 5 spellings, then a Host escaped and a CONNECT: %s, want %s", strings.Join(got, ","), want)
		}
	})
	t.Run("concurrency", func(t *testing.T) {
		codes := make(chan int, 6)
		for range 6 {
			go func() { codes <- status("/slow") }()
		}
		denied, received := 0, 0
	answers:
		for range 4 {
			select {
			case code := <-codes:
				received++
				if code == 429 {
					denied++
				}
			case <-time.After(e2eWait):
				break answers // the others are held at the upstream
			}
		}
		if denied != 4 {
			t.Errorf("6 requests where 2 may be in flight: %d denied at once, want 4", denied)
		}
		if denied == 4 {
			poll(t, "2 requests at the upstream", func() bool { return inFlight.Load() == 2 })
		}
		close(release)
		for range 6 - received {
			if code := <-codes; code != 200 && code != 429 {
				t.Errorf("a request in flight: %d, want 200", code)
			}
		}
		if most.Load() != 2 {
			t.Errorf("the upstream had %d requests of the client in flight at once, want 2", most.Load())
		}
	})
	t.Run("shaping", func(t *testing.T) {
		codes := make(chan int, 8)
		start := time.Now()
		for range 8 {
			go func() { codes <- status("/shaped") }()
		}
		got := map[int]int{}
		var order []int
		for range 8 {
			code := <-codes
			got[code]++
			order = append(order, code)
		}
		// The bucket holds 1 and leaks 1 every 2 s: over the run, at
		// most 1 + elapsed/2s pass. The queue holds 2: the 5 others are
		// denied at once, before the queued two are let through 2 and
		// 4 s later (not after waiting out their max_delay of 5 s in a
		// longer queue).
		bound := 1 + int(time.Since(start)/(2*time.Second))
		if n := int(shaped.Load()); n > bound || n > 3 || got[200] != n || got[429] != 8-n || got[429] < 5 {
			t.Errorf("8 requests at once: %v, %d reached the upstream; want at most %d (the bucket, then 1 every 2 s) and at most 3 (1 and a queue of 2)", got, n, bound)
		}
		if got[200] == 3 && (order[6] != 200 || order[7] != 200) {
			t.Errorf("answers in the order %v: want the two queued let through last, the 5 beyond the queue denied at once", order)
		}
	})
}

// hostileRLS is a rate limit service that answers as its mode says: a
// status per descriptor that is OVER_LIMIT with absurd figures and a
// limit name meant to break headers ("absurd"), three statuses whatever
// was asked ("miscount"), or nothing ("hang").
type hostileRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	mode atomic.Value // string
}

func (h *hostileRLS) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	over := &rlsv3.RateLimitResponse_DescriptorStatus{
		Code: rlsv3.RateLimitResponse_OVER_LIMIT,
		CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{
			Name: "x\r\nX-Injected: 1\r\n\"\\" + strings.Repeat("n", 4096), RequestsPerUnit: math.MaxUint32, Unit: rlsv3.RateLimitResponse_RateLimit_YEAR,
		},
		LimitRemaining:     math.MaxUint32,
		DurationUntilReset: durationpb.New(200 * 365 * 24 * time.Hour),
	}
	switch h.mode.Load() {
	case "hang":
		<-ctx.Done()
		return nil, ctx.Err()
	case "miscount":
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors)+2)}, nil
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}
	for range req.Descriptors {
		resp.Statuses = append(resp.Statuses, over)
	}
	return resp, nil
}

// TestProxyE2EHostileRemote: sluice proxy --store remote in front of a
// rate limit service that lies. Absurd figures (a reset after 200 years,
// a limit of 4 billion a year with 4 billion left yet over, a name of 4 KB
// holding CR LF and quotes) make a 429 whose headers stay within their
// bounds (Retry-After at most ten years) and inject nothing; a count of
// statuses that does not match the request, and a service that never
// answers, are failures of the remote: the failure policy (fail_closed)
// answers each request within --rls-timeout, and the proxy stays ready
// to answer after.
func TestProxyE2EHostileRemote(t *testing.T) {
	beside(t)
	svc := &hostileRLS{}
	svc.mode.Store("absurd")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, svc)
	go gs.Serve(ln)
	defer gs.Stop()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, "domain: api\nhttp:\n  routes:\n    - pattern: /\n      descriptors: [[{key: user, header: X-User}]]\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n")
	const timeout = 300 * time.Millisecond
	p := startProxy(t, "--config", file, "--upstream", up.URL, "--store", "remote", "--rls-addr", ln.Addr().String(),
		"--rls-timeout", timeout.String(), "--failure-policy", "fail_closed")
	ask := func() (int, http.Header, time.Duration) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+p.addrs["proxy"]+"/", nil)
		req.Header.Set("X-User", "u")
		start := time.Now()
		resp, err := (&http.Client{Timeout: e2eWait}).Do(req)
		if err != nil {
			t.Fatalf("through a hostile remote: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header, time.Since(start)
	}

	code, h, _ := ask()
	ra, _ := strconv.ParseInt(h.Get("Retry-After"), 10, 64)
	if code != 429 || ra <= 0 || ra > 10*366*24*3600 || h.Get("X-Injected") != "" {
		t.Errorf("absurd figures: %d, Retry-After %q, X-Injected %q; want 429, Retry-After within ten years, nothing injected", code, h.Get("Retry-After"), h.Get("X-Injected"))
	}
	for name, vs := range h {
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n") || len(v) > 8<<10 {
				t.Errorf("header %s: %.100q (%d bytes)", name, v, len(v))
			}
		}
	}
	for _, mode := range []string{"miscount", "hang"} {
		svc.mode.Store(mode)
		for i := range 3 {
			code, h, took := ask()
			if code != 429 || h.Get("Retry-After") == "" {
				t.Errorf("%s, request %d: %d Retry-After %q, want fail_closed's 429", mode, i+1, code, h.Get("Retry-After"))
			}
			t.Logf("%s, request %d: answered after %v (--rls-timeout %v)", mode, i+1, took.Round(time.Millisecond), timeout)
		}
	}
	if n := p.log(); !strings.Contains(n, "descriptor statuses for 1 descriptors") {
		t.Errorf("the miscount is not logged:\n%s", n)
	}
	if code, _, body := fetch(t, "GET", "http://"+p.addrs["admin"]+"/metrics"); code != 200 || !strings.Contains(body, `sluice_remote_calls_total{result="timeout"}`) {
		t.Errorf("no remote timeout counted: %d\n%s", code, grepLines(body, "sluice_remote"))
	}
}

// TestE2ESlowHeaders: a client that sends its request headers a byte a
// second (a slowloris) on every HTTP listener of sluice serve (HTTP,
// debug, admin) and sluice proxy (proxy, admin) is let go when the
// headers' 10 s are up, however steadily it trickles.
func TestE2ESlowHeaders(t *testing.T) {
	beside(t)
	const headerTimeout = 10 * time.Second // newHTTPServer's ReadHeaderTimeout
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	writeRules(t, rulesFile, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n")
	tokens := writeFile(t, "tokens", "ops:0123456789abcdef0123456789abcdef\n")
	sv := startSluice(t, nil, "--config", rulesFile, "--admin-addr", "127.0.0.1:0", "--admin-token-file", tokens, "--overrides-file", filepath.Join(dir, "overrides.jsonl"))
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	px := startProxy(t, "--config", rulesFile, "--upstream", up.URL)
	type result struct {
		name   string
		took   time.Duration
		closed bool
		err    error
	}
	listeners := map[string]string{"serve http": sv.httpAddr, "serve debug": sv.dbg, "serve admin": sv.addr("admin"),
		"proxy": px.addrs["proxy"], "proxy admin": px.addrs["admin"]}
	results := make(chan result, len(listeners))
	for name, addr := range listeners {
		go func() {
			conn, err := net.DialTimeout("tcp", addr, e2eWait)
			if err != nil {
				results <- result{name: name, err: err}
				return
			}
			defer conn.Close()
			start := time.Now()
			io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
			closed := make(chan struct{})
			go func() { // the server's end, or the test's
				conn.SetReadDeadline(start.Add(headerTimeout + e2eWait))
				io.Copy(io.Discard, conn)
				close(closed)
			}()
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-closed:
					took := time.Since(start)
					results <- result{name: name, took: took, closed: took < headerTimeout+e2eWait}
					return
				case <-tick.C:
					conn.Write([]byte("X")) // a header name, a byte at a time
				}
			}
		}()
	}
	for range listeners {
		r := <-results
		switch {
		case r.err != nil:
			t.Errorf("%s: %v", r.name, r.err)
		case !r.closed:
			t.Errorf("%s: headers trickled a byte a second held the connection for %v", r.name, r.took.Round(time.Millisecond))
		default:
			t.Logf("%s: let go after %v", r.name, r.took.Round(time.Millisecond))
		}
	}
}

// nonLoopback returns an IPv4 address of this machine that is not a
// loopback address (testpart: missing, it fails the test in CI and skips
// it elsewhere).
func nonLoopback(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			ln, err := net.Listen("tcp", net.JoinHostPort(n.IP.String(), "0"))
			if err == nil {
				ln.Close()
				return n.IP.String()
			}
		}
	}
	testpart.Missing(t, "no IPv4 address other than the loopback's to connect from")
	return ""
}

// TestProxyE2EDashboardLoopback: sluice proxy's admin listener serves
// /metrics and health to any address (Kubernetes probes them), but its
// dashboard, which names keys (client addresses, users, API keys), only
// to the loopback: a client of another address of the machine gets 403,
// unless --dashboard-remote says otherwise.
func TestProxyE2EDashboardLoopback(t *testing.T) {
	beside(t)
	ip := nonLoopback(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, "domain: api\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 10}\n")
	for _, remote := range []bool{false, true} {
		args := []string{"--config", file, "--upstream", up.URL, "--admin-listen", "0.0.0.0:0"}
		if remote {
			args = append(args, "--dashboard-remote")
		}
		p := startProxy(t, args...)
		fetch(t, "GET", "http://"+p.addrs["proxy"]+"/") // a key to show
		_, port, _ := net.SplitHostPort(p.addrs["admin"])
		for _, c := range []struct {
			path string
			code int
		}{{"/dashboard", 403}, {"/dashboard/data", 403}, {"/metrics", 200}, {"/healthz", 200}} {
			if remote {
				c.code = 200
			}
			if code, _, body := fetch(t, "GET", "http://"+net.JoinHostPort(ip, port)+c.path); code != c.code {
				t.Errorf("--dashboard-remote=%v: %s from %s: %d %.100s, want %d", remote, c.path, ip, code, body, c.code)
			}
			if code, _, _ := fetch(t, "GET", "http://127.0.0.1:"+port+c.path); code != 200 {
				t.Errorf("--dashboard-remote=%v: %s from the loopback: %d, want 200", remote, c.path, code)
			}
		}
	}
}

// TestServeE2ERLQSHostile: on the Rate Limit Quota Service of the real
// binary, one stream lies about its usage (2^63 allowed and 2^62 denied
// in every report, a demand of some 10^19 a second) for the bucket an
// honest Envoy also asks for, at twice the limit. At every report the
// rates the two are assigned sum to at most the limit, and the liar
// takes no more than its max-min fair share: the honest Envoy is
// assigned half the limit. A bucket id of 65 entries, and one holding a
// value of 1,025 bytes, are abandoned, not matched.
func TestServeE2ERLQSHostile(t *testing.T) {
	beside(t)
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, rulesFile, "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1000}\n")
	p := startSluice(t, nil, "--config", rulesFile)
	const limit, interval = 1000.0, 200 * time.Millisecond
	client := rlqsv3.NewRateLimitQuotaServiceClient(p.conn)
	open := func() rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient {
		s, err := client.StreamRateLimitQuotas(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	liar, honest := open(), open()
	acme := map[string]string{"tenant": "acme"}
	usage := func(bucket map[string]string, allowed, denied uint64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
		return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: bucket},
			NumRequestsAllowed: allowed, NumRequestsDenied: denied, TimeElapsed: durationpb.New(interval)}
	}
	// honestUsage is what an Envoy asked at twice the limit reports: the
	// requests of the time since its last report (the server measures
	// that time itself, so on a loaded machine a fixed count would be a
	// smaller demand than the test means).
	lastHonest := time.Now()
	honestUsage := func() *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
		now := time.Now()
		elapsed := now.Sub(lastHonest)
		lastHonest = now
		n := uint64(limit * elapsed.Seconds())
		u := usage(acme, n, n)
		u.TimeElapsed = durationpb.New(elapsed)
		return u
	}
	wide := map[string]string{}
	for i := range 65 {
		wide[fmt.Sprint("k", i)] = "v"
	}
	// exchange sends one report and returns the answer's actions by
	// bucket: "abandon", or the assigned rate.
	exchange := func(s rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, us ...*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) map[string]any {
		t.Helper()
		if err := s.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: us}); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]any{}
		for _, a := range resp.BucketAction {
			name := fmt.Sprint(len(a.BucketId.Bucket), " entries, tenant of ", len(a.BucketId.Bucket["tenant"]), " bytes")
			if a.GetAbandonAction() != nil {
				out[name] = "abandon"
				continue
			}
			var b envoyquota.Bucket
			b.Apply(a, time.Now())
			out[name] = b.Rate(time.Now())
		}
		return out
	}
	const acmeName = "1 entries, tenant of 4 bytes"
	first := exchange(liar, usage(acme, 1<<63, 1<<62), usage(wide, 1, 0), usage(map[string]string{"tenant": strings.Repeat("x", rules.MaxEntryLen+1)}, 1, 0))
	for name, want := range map[string]any{"65 entries, tenant of 0 bytes": "abandon", "1 entries, tenant of 1025 bytes": "abandon"} {
		if got := first[name]; got != want {
			t.Errorf("the liar's bucket of %s: %v, want %v", name, got, want)
		}
	}
	liarRate, _ := first[acmeName].(float64)
	honestRate := 0.0
	for round := range 20 {
		time.Sleep(interval)
		if got, ok := exchange(honest, honestUsage())[acmeName].(float64); ok {
			honestRate = got
		}
		if got, ok := exchange(liar, usage(acme, 1<<63, 1<<62))[acmeName].(float64); ok {
			liarRate = got
		}
		if sum := liarRate + honestRate; sum > limit*(1+1e-9) || math.IsNaN(sum) {
			t.Fatalf("round %d: the liar is assigned %v a second and the honest Envoy %v: over the limit of %v together", round, liarRate, honestRate, limit)
		}
	}
	if honestRate < 0.45*limit || liarRate > 0.55*limit {
		t.Errorf("after 20 reports the liar is assigned %v a second and the honest Envoy %v, want about half the limit of %v each (max-min fair)", liarRate, honestRate, limit)
	}
	t.Logf("the liar is assigned %.0f a second, the honest Envoy %.0f", liarRate, honestRate)
}
