package loadgen

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/testsupport/stall"
)

func TestBodies(t *testing.T) {
	const keys = 50
	pb, err := protoBodies("dom", "user", keys)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := jsonBodies("d\"om", "us\\er", keys)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i <= keys; i++ {
		var got rlsv3.RateLimitRequest
		if err := proto.Unmarshal(pb.body(i), &got); err != nil {
			t.Fatalf("proto body %d: %v", i, err)
		}
		if want := Request("dom", "user", i, keys); !proto.Equal(&got, want) {
			t.Errorf("proto body %d = %v, want %v", i, &got, want)
		}
		got.Reset()
		if err := protojson.Unmarshal(jb.body(i), &got); err != nil {
			t.Fatalf("json body %d %s: %v", i, jb.body(i), err)
		}
		if want := Request("d\"om", "us\\er", i, keys); !proto.Equal(&got, want) {
			t.Errorf("json body %d = %v, want %v", i, &got, want)
		}
	}
	if v := KeyValue(keys, keys); v != HotValue {
		t.Errorf("key %d of %d = %q, want the hot value", keys, keys, v)
	}
}

func TestOverallCode(t *testing.T) {
	for _, code := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_UNKNOWN, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT, 7} {
		resp := nullResponse(Request("d", "k", 1, 2))
		resp.OverallCode = code
		resp.RawBody = []byte("body")
		b, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		got, err := overallCode(b)
		if err != nil || got != code {
			t.Errorf("overallCode(%v) = %v, %v", code, got, err)
		}
		if _, err := overallCode(b[:len(b)-1]); err == nil {
			t.Errorf("truncated response with code %v: no error", code)
		}
	}
}

// fakeRLS answers OK, except OVER_LIMIT for the hot value, records the
// values it saw and, when hang is set, answers nothing until the caller
// gives up.
type fakeRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	hang bool
	mu   sync.Mutex
	seen map[string]int
}

func (f *fakeRLS) answer(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	v := req.GetDescriptors()[0].GetEntries()[0].GetValue()
	f.mu.Lock()
	if f.seen == nil {
		f.seen = map[string]int{}
	}
	f.seen[v]++
	f.mu.Unlock()
	resp := nullResponse(req)
	if v == HotValue {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		resp.Statuses[0].Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return resp
}

func (f *fakeRLS) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if f.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return f.answer(req), nil
}

func (f *fakeRLS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp := f.answer(&req)
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	out, _ := protojson.Marshal(resp)
	w.Write(out)
}

func (f *fakeRLS) distinct() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seen)
}

// serveGRPC serves srv on 127.0.0.1:0 until the test ends.
func serveGRPC(t *testing.T, srv rlsv3.RateLimitServiceServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(s, srv)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// serveHTTP serves h on 127.0.0.1:0 until the test ends.
func serveHTTP(t *testing.T, h http.Handler) string {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

// deadAddr returns an address on 127.0.0.1 where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// checkSane checks what holds for every run that got answers: no latency
// above the timeout and the longest the machine stalled the test.
func checkSane(t *testing.T, res *Result, stalled time.Duration) {
	t.Helper()
	if res.Requests != res.OK+res.OverLimit+res.Unknown+res.Errors {
		t.Errorf("requests %d != ok %d + over %d + unknown %d + errors %d", res.Requests, res.OK, res.OverLimit, res.Unknown, res.Errors)
	}
	var kinds int64
	for _, n := range res.ErrorKinds {
		kinds += n
	}
	if kinds != res.Errors {
		t.Errorf("error kinds add up to %d, errors %d", kinds, res.Errors)
	}
	l := res.Latency
	if res.Requests > res.Errors {
		if !(0 < l.Min && l.Min <= l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.P999 && l.P999 <= l.Max) {
			t.Errorf("latency out of order: %+v", l)
		}
		if l.Mean < l.Min || l.Mean > l.Max {
			t.Errorf("mean %v outside [%v, %v]", l.Mean, l.Min, l.Max)
		}
		if l.Max > res.Config.Timeout+stalled {
			t.Errorf("max latency %v above the timeout %v (the machine stalled up to %v)", l.Max, res.Config.Timeout, stalled)
		}
	}
}

// run runs cfg and checks that it ended within slack of its time limit.
// deadlineSlack is how late a request at its timeout may return under
// -race on a loaded machine (seen: 112 ms past a 2 s timeout).
const deadlineSlack = 250 * time.Millisecond

func run(t *testing.T, cfg Config) *Result {
	res, _ := runStalled(t, cfg)
	return res
}

// runStalled runs cfg and checks its result, allowing for the longest the
// machine stalled the test's process (stall.Meter) on top of every bound
// in time; it returns that stall too.
func runStalled(t *testing.T, cfg Config) (*Result, time.Duration) {
	t.Helper()
	stalls := stall.Watch(t)
	begin := time.Now()
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A request at its timeout returns once its deadline's timer has run
	// and its goroutine been scheduled: a margin past the timeout for that.
	stalled := stalls.Max() + deadlineSlack
	if cfg.Duration > 0 {
		took := time.Since(begin)
		limit := cfg.Warmup + cfg.Duration + res.Config.Timeout + 2*time.Second + stalled
		if took > limit {
			t.Errorf("run took %v, should have stopped within %v (the machine stalled up to %v)", took, limit, stalled)
		}
		if res.Requests > 0 && (res.Elapsed < cfg.Duration*8/10 || res.Elapsed > cfg.Duration+res.Config.Timeout+stalled) {
			t.Errorf("measured %v for a duration of %v (the machine stalled up to %v)", res.Elapsed, cfg.Duration, stalled)
		}
	}
	checkSane(t, res, stalled)
	return res, stalled
}

func TestRunNullServer(t *testing.T) {
	grpcAddr := serveGRPC(t, &NullServer{})
	httpAddr := serveHTTP(t, &NullServer{})
	for _, tc := range []struct {
		mode   Mode
		target string
	}{{GRPC, grpcAddr}, {JSON, httpAddr}} {
		t.Run(string(tc.mode), func(t *testing.T) {
			res := run(t, Config{
				Target: tc.target, Mode: tc.mode, Connections: 2, Concurrency: 4,
				Keys: 100, Warmup: 50 * time.Millisecond, Duration: 400 * time.Millisecond,
			})
			if res.Requests == 0 || res.OK != res.Requests || res.Hot != 0 || res.Warmup == 0 {
				t.Errorf("null server: %+v", res)
			}
		})
	}
}

func TestRunHotKey(t *testing.T) {
	f := &fakeRLS{}
	grpcAddr := serveGRPC(t, f)
	httpAddr := serveHTTP(t, f)
	for _, tc := range []struct {
		mode   Mode
		target string
	}{{GRPC, grpcAddr}, {JSON, httpAddr}} {
		t.Run(string(tc.mode), func(t *testing.T) {
			const n = 4000
			res := run(t, Config{
				Target: tc.target, Mode: tc.mode, Concurrency: 8, Keys: 1000, Hot: 0.25, Requests: n,
			})
			if res.Requests != n {
				t.Fatalf("%d requests, want the cap %d", res.Requests, n)
			}
			if res.OverLimit != res.Hot || res.OK != n-res.Hot || res.Errors != 0 {
				t.Errorf("hot %d: ok %d over %d errors %d; want every hot request over the limit, every other OK", res.Hot, res.OK, res.OverLimit, res.Errors)
			}
			// 4000 draws at p = 0.25: the standard deviation is 27.
			if share := float64(res.Hot) / n; share < 0.22 || share > 0.28 {
				t.Errorf("hot share %.3f, want 0.25", share)
			}
		})
	}
	for _, hot := range []float64{0, 1} {
		res := run(t, Config{Target: grpcAddr, Keys: 10, Hot: hot, Requests: 200})
		if want := int64(hot * 200); res.Hot != want {
			t.Errorf("hot %v: %d hot requests of 200, want %d", hot, res.Hot, want)
		}
	}
}

// TestRunHTTP gets a path with each key's value in a header: the server
// answers 429 for the hot value, 200 for the others.
func TestRunHTTP(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	addr := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.RequestURI() != "/items?x=1" {
			http.NotFound(w, r)
			return
		}
		v, ok := r.Header["X-Key"]
		mu.Lock()
		seen[strings.Join(v, ",")]++
		mu.Unlock()
		if ok && v[0] == HotValue {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		io.WriteString(w, "body")
	}))
	const n = 2000
	res := run(t, Config{Target: addr, Mode: HTTP, Path: "/items?x=1", Header: "x-key", Concurrency: 4, Keys: 100, Hot: 0.25, Requests: n})
	if res.Requests != n || res.OverLimit != res.Hot || res.OK != n-res.Hot || res.Errors != 0 {
		t.Errorf("requests %d hot %d: ok %d over %d errors %d %v", res.Requests, res.Hot, res.OK, res.OverLimit, res.Errors, res.ErrorSamples)
	}
	if len(seen) != 101 || seen["k0"] == 0 || seen["k99"] == 0 {
		t.Errorf("server saw %d distinct values, want 100 keys and the hot one", len(seen))
	}
	clear(seen)
	res = run(t, Config{Target: addr, Mode: HTTP, Path: "/items?x=1", Concurrency: 2, Requests: 100})
	if res.OK != 100 || len(seen) != 1 || seen[""] != 100 {
		t.Errorf("no header: ok %d, server saw %v", res.OK, seen)
	}
	res = run(t, Config{Target: addr, Mode: HTTP, Concurrency: 2, Requests: 10})
	if res.Errors != 10 || res.ErrorKinds["http 404"] != 10 {
		t.Errorf("path /: %+v", res.ErrorKinds)
	}
}

func TestRunFill(t *testing.T) {
	f := &fakeRLS{}
	res := run(t, Config{Target: serveGRPC(t, f), Concurrency: 4, Keys: 300, Fill: true, Requests: 1})
	if res.Filled != 301 || f.distinct() != 301 {
		t.Errorf("filled %d, server saw %d distinct values; want 300 keys and the hot one", res.Filled, f.distinct())
	}
}

func TestRunOpenLoop(t *testing.T) {
	res, stalled := runStalled(t, Config{
		Target: serveGRPC(t, &NullServer{}), Concurrency: 8, Rate: 2000,
		Warmup: 100 * time.Millisecond, Duration: 500 * time.Millisecond,
	})
	// 1000 requests are due; the schedule is absolute, so late wake-ups
	// catch up, but for those the machine's stall kept past the end.
	if least := 900 - int64(2000*stalled.Seconds()); res.Requests < least || res.Requests > 1001 {
		t.Errorf("%d requests at 2000/s for 0.5s, want about 1000 (at least %d: the machine stalled up to %v)", res.Requests, least, stalled)
	}
}

func TestRunServerDown(t *testing.T) {
	for _, tc := range []struct {
		mode Mode
		kind string
	}{{GRPC, "Unavailable"}, {JSON, "connection refused"}} {
		t.Run(string(tc.mode), func(t *testing.T) {
			res := run(t, Config{
				Target: deadAddr(t), Mode: tc.mode, Concurrency: 2,
				Duration: 200 * time.Millisecond, Timeout: 500 * time.Millisecond,
			})
			if res.Requests == 0 || res.Errors != res.Requests || res.ErrorKinds[tc.kind] == 0 {
				t.Errorf("server down: %d requests, %d errors, kinds %v; want every request an error of kind %q", res.Requests, res.Errors, res.ErrorKinds, tc.kind)
			}
			if res.ErrorSamples[tc.kind] == "" {
				t.Errorf("no sample message for %q", tc.kind)
			}
		})
	}
}

func TestRunServerHangs(t *testing.T) {
	res := run(t, Config{
		Target: serveGRPC(t, &fakeRLS{hang: true}), Concurrency: 3,
		Duration: 300 * time.Millisecond, Timeout: 100 * time.Millisecond,
	})
	if res.Requests == 0 || res.ErrorKinds["DeadlineExceeded"] != res.Requests {
		t.Errorf("hung server: %d requests, kinds %v; want every request DeadlineExceeded", res.Requests, res.ErrorKinds)
	}
}

func TestRunCanceled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	begin := time.Now()
	res, err := Run(ctx, Config{Target: serveGRPC(t, &NullServer{}), Duration: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took > 5*time.Second {
		t.Errorf("canceled after 200ms, returned after %v", took)
	}
	if res.Errors != 0 {
		t.Errorf("interrupted requests counted as errors: %v", res.ErrorKinds)
	}
	checkSane(t, res, 0)
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{Duration: time.Second},
		{Target: "x:1"},
		{Target: "x:1", Duration: time.Second, Mode: "udp"},
		{Target: "x:1", Duration: time.Second, Hot: 1.5},
		{Target: "x:1", Duration: time.Second, Concurrency: 2, Connections: 3},
		{Target: "x:1", Duration: time.Second, Keys: -1},
		{Target: "x:1", Duration: time.Second, Rate: -1},
		{Target: "x:1", Duration: -time.Second},
		{Target: "x:1", Duration: time.Second, Mode: HTTP, Path: "items"},
		{Target: "x:1", Duration: time.Second, Mode: HTTP, Header: "X Key"},
	} {
		if _, err := Run(context.Background(), cfg); err == nil {
			t.Errorf("Run(%+v): no error", cfg)
		}
	}
}

func TestNullServerHTTP(t *testing.T) {
	addr := serveHTTP(t, &NullServer{})
	resp, err := http.Post("http://"+addr+"/json", "application/json", strings.NewReader(`{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]},{"entries":[{"key":"k2"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var got rlsv3.RateLimitResponse
	if err := protojson.Unmarshal(body, &got); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	if resp.StatusCode != 200 || got.OverallCode != rlsv3.RateLimitResponse_OK || len(got.Statuses) != 2 || got.Statuses[1].GetCurrentLimit().GetRequestsPerUnit() != nullLimit {
		t.Errorf("status %d, response %v", resp.StatusCode, &got)
	}
	for _, tc := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/json", "{not json", 400},
		{"GET", "/json", "", 405},
		{"GET", "/healthz", "", 200},
		{"GET", "/nope", "", 404},
	} {
		req, _ := http.NewRequest(tc.method, "http://"+addr+tc.path, strings.NewReader(tc.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.want)
		}
	}
}
