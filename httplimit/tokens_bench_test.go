package httplimit_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/testsupport/rulestest"
	"github.com/sluicehq/sluice/memstore"
)

// BenchmarkTokens is the cost a token budget adds to a request through the
// middleware, in this process, with no network: the same chat request (a
// JSON body of about 1 KB) and the same answer (JSON with usage, or an
// event stream of 20 chunks ending with usage) through a route limited by
// the API key alone ("plain"), and through one with a token budget too
// ("tokens": the body read for its reservation, the answer read for its
// usage, the settlement). Limits are far above what a run spends. Compare
// the pairs with benchstat; bench/tokens.sh measures the built proxy from
// outside.
func BenchmarkTokens(b *testing.B) {
	const rules = `
domain: llm
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 1000000000000}
  - key: api_key_tokens
    rate_limit: {unit: minute, requests_per_unit: 1000000000000}
`
	body := []byte(`{"model":"m","max_tokens":256,"messages":[{"role":"user","content":"` + strings.Repeat("lorem ipsum ", 80) + `"}]}`)
	answer := []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("dolor ", 40) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":240,"completion_tokens":40,"total_tokens":280}}`)
	var stream bytes.Buffer
	for range 20 {
		stream.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"dolor "}}]}` + "\n\n")
	}
	stream.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":240,"completion_tokens":20,"total_tokens":260}}` + "\n\ndata: [DONE]\n\n")
	api := func(sse bool) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if sse {
				w.Header().Set("Content-Type", "text/event-stream")
				w.Write(stream.Bytes())
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write(answer)
		})
	}
	for _, sse := range []bool{false, true} {
		for _, withTokens := range []bool{false, true} {
			name := fmt.Sprintf("json/%s", map[bool]string{false: "plain", true: "tokens"}[withTokens])
			if sse {
				name = "stream/" + name[len("json/"):]
			}
			b.Run(name, func(b *testing.B) {
				clock := func() time.Time { return fixedNow }
				store := memstore.New(memstore.Config{Now: clock})
				defer store.Close()
				d, err := decide.New(decide.Config{Limiter: sluice.NewLimiter(store), Rules: rulestest.Config(b, rules), Now: clock})
				if err != nil {
					b.Fatal(err)
				}
				cfg := httplimit.Config{
					Decider:     d,
					Domain:      "llm",
					Descriptors: []httplimit.Descriptor{{{Key: "api_key", Source: httplimit.APIKey("Authorization")}}},
				}
				if withTokens {
					tok := tokenBudget()
					tok.Enforce, tok.PromptBytes = true, true
					cfg.Tokens = &tok
				}
				mw, err := httplimit.New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				h := mw(api(sse))
				b.ReportAllocs()
				b.SetBytes(int64(len(body)))
				for b.Loop() {
					r := httptest.NewRequest("POST", "/v1/chat/completions", bytes.NewReader(body))
					r.Header.Set("Authorization", "Bearer sk-1")
					r.Header.Set("Content-Type", "application/json")
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					if w.Code != 200 {
						b.Fatalf("status %d: %s", w.Code, w.Body)
					}
				}
			})
		}
	}
}
