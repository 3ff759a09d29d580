package httplimit_test

import (
	"bufio"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

// unwrapOnly is a ResponseWriter that adds nothing but Unwrap, as many
// wrappers do (sluice proxy's own, which counts what became of each
// request): http.ResponseController goes through it, a type assertion
// does not.
type unwrapOnly struct{ http.ResponseWriter }

func (w unwrapOnly) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Under every writer the middleware may hand the handler (none, the
// failure limits', the token budget's), over a writer that only unwraps,
// what a streaming handler asks of its writer reaches the server's: a
// flush, through http.Flusher (of the middleware's writers) or
// http.ResponseController, sends what was
// written before the handler goes on (the handler writes its next event
// only once the client has the one before), and a flush before any write
// sends the header once, 200, as the server's own does; write and read
// deadlines and full duplex are set. Before, the token budget's writer
// looked for http.Flusher on the writer below and, not finding it,
// dropped every flush: the client got the stream at its end; and a flush
// before any write left the middleware's writers to write the header a
// second time ("superfluous response.WriteHeader call").
func TestWritersPassFlushAndControls(t *testing.T) {
	const rules = `
domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: api_key_tokens
    rate_limit: {unit: hour, requests_per_unit: 100000}
  - key: failed
    rate_limit: {unit: hour, requests_per_unit: 100}
`
	key := httplimit.Descriptor{{Key: "api_key", Source: httplimit.APIKey("Authorization")}}
	configs := map[string]httplimit.Config{
		"plain": {},
		"failures": {Failures: &httplimit.Failures{
			Descriptors: []httplimit.Descriptor{{{Key: "failed", Source: httplimit.APIKey("Authorization")}}},
			Statuses:    []int{500},
		}},
		"tokens": {Tokens: &httplimit.Tokens{
			Descriptor: httplimit.Descriptor{{Key: "api_key_tokens", Source: httplimit.APIKey("Authorization")}},
			Default:    100,
		}},
	}
	const wait = 10 * time.Second
	for name, cfg := range configs {
		for _, under := range []string{"server", "unwrap-only"} {
			t.Run(name+" over "+under, func(t *testing.T) {
				store := memstore.New(memstore.Config{})
				t.Cleanup(func() { store.Close() })
				cfg.Decider = mustDecider(sluice.NewLimiter(store), rulestest.Config(t, rules))
				cfg.Domain = "api"
				cfg.Descriptors = []httplimit.Descriptor{key}
				mw, err := httplimit.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				got := make(chan int, 3)
				var mu sync.Mutex
				var problems []string
				problem := func(format string, args ...any) {
					mu.Lock()
					defer mu.Unlock()
					problems = append(problems, fmt.Sprintf(format, args...))
				}
				h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					io.Copy(io.Discard, r.Body)
					rc := http.NewResponseController(w)
					if err := rc.EnableFullDuplex(); err != nil {
						problem("EnableFullDuplex: %v", err)
					}
					if err := rc.SetWriteDeadline(time.Now().Add(time.Hour)); err != nil {
						problem("SetWriteDeadline: %v", err)
					}
					if err := rc.SetReadDeadline(time.Time{}); err != nil {
						problem("SetReadDeadline: %v", err)
					}
					w.Header().Set("Content-Type", "text/event-stream")
					// The header first, as event streams often do.
					if err := rc.Flush(); err != nil {
						problem("flush of the header: %v", err)
					}
					flushes := []func() error{
						func() error {
							if _, mine := w.(unwrapOnly); mine {
								return rc.Flush() // not wrapped: the test's own writer
							}
							f, ok := w.(http.Flusher)
							if !ok {
								return fmt.Errorf("%T is not an http.Flusher", w)
							}
							f.Flush()
							return nil
						},
						rc.Flush,
					}
					for i, flush := range flushes {
						fmt.Fprintf(w, "data: %d\n\n", i+1)
						if err := flush(); err != nil {
							problem("flush %d: %v", i+1, err)
						}
						select {
						case <-got:
						case <-time.After(wait):
							problem("event %d did not reach the client within %v of its flush", i+1, wait)
						}
					}
					io.WriteString(w, "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n")
				}))
				var serverLog strings.Builder
				srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if under == "unwrap-only" {
						w = unwrapOnly{w}
					}
					h.ServeHTTP(w, r)
				}))
				srv.Config.ErrorLog = log.New(&lockedWriter{w: &serverLog}, "", 0)
				srv.Start()
				t.Cleanup(srv.Close)
				req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"stream":true}`))
				req.Header.Set("Authorization", "Bearer k")
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				n := 0
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					if strings.HasPrefix(sc.Text(), "data: ") {
						n++
						got <- n
					}
				}
				if resp.StatusCode != http.StatusOK || n != 3 || sc.Err() != nil {
					t.Errorf("%d, %d events, %v", resp.StatusCode, n, sc.Err())
				}
				srv.Close()
				for _, p := range problems {
					t.Error(p)
				}
				if l := serverLog.String(); l != "" {
					t.Errorf("the server logged: %s", l)
				}
			})
		}
	}
}
