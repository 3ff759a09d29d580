package rlsclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/edges/rls"
	"github.com/sluicehq/sluice/internal/edges/rlsclient"
	"github.com/sluicehq/sluice/internal/edges/server"
	"github.com/sluicehq/sluice/internal/vocab/permittrace"
	"github.com/sluicehq/sluice/rules"
)

const permitRules = `
domain: api
descriptors:
  - key: slot
    concurrency: {max: 2, ttl: 30s}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
`

// permitCounts counts what a permittrace.Trace is told of acquisitions
// and releases.
type permitCounts struct{ acquired, released, failed atomic.Int64 }

func (pc *permitCounts) context() context.Context {
	return permittrace.With(context.Background(), &permittrace.Trace{
		Acquired: func(n int) { pc.acquired.Add(int64(n)) },
		Released: func(n int, err error) {
			if err != nil {
				pc.failed.Add(int64(n))
			} else {
				pc.released.Add(int64(n))
			}
		},
	})
}

// TestPermits: a request that a remote sluice serve admits holding a
// permit of a concurrency limit is answered with the serve's permit token
// in the dynamic metadata (alone, or among envoyproxy/ratelimit's
// metadata), which Ask puts in Outcome.PermitToken; the Decider makes
// Outcome.Permit of it, whose Release gives the slot back on the remote:
// one call with the request's descriptors, each with the token, made even
// when the context it is given is cancelled (a client that hung up). A
// denied request holds nothing. The Trace of the request's context counts
// the permits acquired, released and whose release failed (the remote
// down); a failed release succeeds when called again once the remote is
// back. The remote counts every release, and refuses none (the
// descriptor of a rate only counts nowhere). Nothing renews the permits.
func TestPermits(t *testing.T) {
	for _, metadata := range []bool{false, true} {
		t.Run(fmt.Sprint("metadata=", metadata), func(t *testing.T) {
			r := startRemote(t, permitRules, func(c *server.Config) { c.DynamicMetadata = metadata })
			c := newClient(t, rlsclient.Config{Target: r.addr, Timeout: 5 * time.Second, BreakerCooldown: 20 * time.Millisecond})
			dec := viaRemote(t, c, nil, decide.Failover{})
			var pc permitCounts
			ctx := pc.context()
			request := func() *decide.Request {
				return &decide.Request{Domain: "api", Descriptors: []rules.Descriptor{
					{Entries: []rules.Entry{{Key: "user", Value: "u"}}, Cost: 1},
					{Entries: []rules.Entry{{Key: "slot", Value: "a"}}, Cost: 1},
				}}
			}
			admit := func(what string) *decide.Outcome {
				t.Helper()
				var o decide.Outcome
				if err := dec.Decide(ctx, request(), &o); err != nil {
					t.Fatal(err)
				}
				if !o.Overall.Allowed || o.Permit == nil || !strings.HasPrefix(o.PermitToken, "s") || len(o.PermitToken) != 1+34 {
					t.Fatalf("%s: %+v, permit %v, token %q; want admitted holding one permit", what, o.Overall, o.Permit, o.PermitToken)
				}
				return &o
			}
			denied := func(what string) {
				t.Helper()
				var o decide.Outcome
				if err := dec.Decide(ctx, request(), &o); err != nil {
					t.Fatal(err)
				}
				if o.Overall.Allowed || o.Permit != nil || o.PermitToken != "" {
					t.Fatalf("%s: %+v, permit %v, token %q; want denied holding nothing", what, o.Overall, o.Permit, o.PermitToken)
				}
			}

			// The client alone reads the token; the Decider makes the
			// Permit. (This one is given back by the next release of
			// its token, below.)
			var raw decide.Outcome
			if err := c.Ask(ctx, request(), &raw); err != nil || raw.PermitToken == "" || raw.Permit != nil {
				t.Fatalf("Ask: %v, token %q, permit %v", err, raw.PermitToken, raw.Permit)
			}
			if err := c.Ask(ctx, &decide.Request{Domain: "api", Descriptors: request().Descriptors, Release: []string{raw.PermitToken, raw.PermitToken}}, &raw); err != nil {
				t.Fatal(err)
			}

			a, b := admit("the first"), admit("the second")
			denied("the third, at the cap")
			if held, err := a.Permit.Renew(ctx); held || !errors.Is(err, errors.ErrUnsupported) {
				t.Errorf("Renew: %v %v, want ErrUnsupported", held, err)
			}
			gone, cancel := context.WithCancel(ctx)
			cancel()
			if err := a.Permit.Release(gone); err != nil {
				t.Fatalf("release with a cancelled context: %v", err)
			}
			admit("after a release")
			denied("at the cap again")

			r.stop()
			if err := b.Permit.Release(ctx); !errors.Is(err, rlsclient.ErrUnavailable) {
				t.Fatalf("release with the remote down: %v, want ErrUnavailable", err)
			}
			r.restart()
			deadline := time.Now().Add(20 * time.Second)
			for b.Permit.Release(ctx) != nil {
				if time.Now().After(deadline) {
					t.Fatal("the release does not succeed once the remote is back")
				}
				time.Sleep(20 * time.Millisecond)
			}
			admit("after the release that failed first")
			denied("at the cap, last")

			if got := [3]int64{pc.acquired.Load(), pc.released.Load()}; got != [3]int64{4, 2} || pc.failed.Load() < 1 {
				t.Errorf("trace: acquired %d released %d failed %d, want 4, 2 and at least 1", got[0], got[1], pc.failed.Load())
			}
			m := gather(t, r.reg)
			for event, want := range map[string]float64{"issued": 5, "released": 3, "refused": 0, "failed": 0} {
				if got := m["sluice_permit_tokens_total{event="+event+"}"]; got != want {
					t.Errorf("the remote's %s: %v, want %v", event, got, want)
				}
			}
		})
	}
}

// TestHTTPLimitRemotePermits: the middleware deciding on a remote sluice
// serve with a concurrency limit of 2 holds the remote's slots while its
// requests run and gives them back when they end, a client's hang-up
// included: 2 admitted, the 3rd denied while they run, 2 admitted again
// at once after they end (the permits' TTL is 30 s, on a clock that does
// not move).
func TestHTTPLimitRemotePermits(t *testing.T) {
	r := startRemote(t, "domain: api\ndescriptors:\n  - key: remote_address\n    concurrency: {max: 2, ttl: 30s}\n")
	c := newClient(t, rlsclient.Config{Target: r.addr, Timeout: 5 * time.Second})
	mw, err := httplimit.New(httplimit.Config{Decider: viaRemote(t, c, nil, decide.Failover{}), Domain: "api"})
	if err != nil {
		t.Fatal(err)
	}
	started, hold := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			started <- struct{}{}
			select {
			case <-hold:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "ok")
	})))
	t.Cleanup(srv.Close)
	get := func(ctx context.Context, path string) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	slow := func(ctx context.Context) *sync.WaitGroup {
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() { get(ctx, "/slow") })
			<-started
		}
		return &wg
	}
	for _, hangUp := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		wg := slow(ctx)
		if code, err := get(context.Background(), "/"); code != http.StatusTooManyRequests {
			t.Fatalf("hang-up %v: a third request while 2 run: %d %v, want 429", hangUp, code, err)
		}
		if hangUp {
			cancel()
		} else {
			hold <- struct{}{}
			hold <- struct{}{}
		}
		wg.Wait()
		cancel()
		// A client that hung up is not told when the handler returns:
		// wait for the release.
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, err := get(context.Background(), "/")
			if code == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("hang-up %v: after the 2 ended: %d %v, want 200 (their slots released)", hangUp, code, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// tokenService answers every request OK with the token it is given in
// its dynamic metadata, and keeps the requests it gets.
type tokenService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	token string
	mu    sync.Mutex
	got   []*rlsv3.RateLimitRequest
}

func (s *tokenService) ShouldRateLimit(_ context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.mu.Lock()
	s.got = append(s.got, r)
	s.mu.Unlock()
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for range r.Descriptors {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK})
	}
	resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{rls.PermitKey: structpb.NewStringValue(s.token)}}
	return resp, nil
}

func (s *tokenService) requests() []*rlsv3.RateLimitRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// TestPermitTokenFromService: what a service (hostile, or another
// version) puts under sluice_permit is taken only when it is a token as
// sluice serve writes them: anything else (a wrong format, more than 64
// permits, a number) is dropped, and no Permit is made. A token that is
// one, forged or not, is sent back once, when the Permit is released:
// every descriptor of the request, entries, cost and per-request limit
// as asked, with the token in a sluice_permit entry added last.
func TestPermitTokenFromService(t *testing.T) {
	item := "0123abcd" + strings.Repeat("A", 26)
	descs := []rules.Descriptor{
		{Entries: []rules.Entry{{Key: "user", Value: "u"}, {Key: "path", Value: "/x"}}, Cost: 3},
		{Entries: []rules.Entry{{Key: "slot", Value: "a"}}, Cost: 1, Override: &rules.Override{RequestsPerUnit: 5, Unit: rules.Minute, UnitMultiplier: 1}},
	}
	for _, bad := range []string{"", "x", "s", "s" + item + "0", "S" + item, "s" + strings.Repeat(item, 65), "l0." + item} {
		svc := &tokenService{token: bad}
		c := newClient(t, rlsclient.Config{Target: serveRLS(t, svc), Timeout: 5 * time.Second})
		var o decide.Outcome
		if err := viaRemote(t, c, nil, decide.Failover{}).Decide(context.Background(), &decide.Request{Domain: "api", Descriptors: descs}, &o); err != nil {
			t.Fatal(err)
		}
		if !o.Overall.Allowed || o.Permit != nil || o.PermitToken != "" {
			t.Errorf("token %.40q: %+v, permit %v, token %.40q; want allowed, holding nothing", bad, o.Overall, o.Permit, o.PermitToken)
		}
	}

	token := "l3." + item + "89abcdef" + strings.Repeat("B", 26)
	svc := &tokenService{token: token}
	c := newClient(t, rlsclient.Config{Target: serveRLS(t, svc), Timeout: 5 * time.Second})
	var pc permitCounts
	var o decide.Outcome
	if err := viaRemote(t, c, nil, decide.Failover{}).Decide(pc.context(), &decide.Request{Domain: "api", Descriptors: descs}, &o); err != nil {
		t.Fatal(err)
	}
	if o.Permit == nil || o.PermitToken != token || pc.acquired.Load() != 2 {
		t.Fatalf("a token of 2 permits: permit %v, token %q, %d acquired", o.Permit, o.PermitToken, pc.acquired.Load())
	}
	descs[0].Entries[0].Value = "changed after the decision"
	for range 2 {
		if err := o.Permit.Release(pc.context()); err != nil {
			t.Fatal(err)
		}
	}
	got := svc.requests()
	if len(got) != 2 || pc.released.Load() != 2 {
		t.Fatalf("%d calls, %d permits released; want 2 (the decision, one release) and 2", len(got), pc.released.Load())
	}
	want, err := rls.RateLimitRequest(&decide.Request{Domain: "api", Descriptors: descs})
	if err != nil {
		t.Fatal(err)
	}
	want.Descriptors[0].Entries[0].Value = "u"
	for _, pd := range want.Descriptors {
		pd.Entries = append(pd.Entries, &rlv3.RateLimitDescriptor_Entry{Key: rls.PermitKey, Value: token})
	}
	if !proto.Equal(got[1], want) {
		t.Errorf("the release:\n%v\nwant\n%v", got[1], want)
	}
}
