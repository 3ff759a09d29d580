package proxy_test

import (
	"io"
	"net/http"
	"testing"
)

// A route's token budget is counted in sluice_proxy_tokens_total: what
// each request reserved, and what its answer's usage settled it to.
func TestTokensMetrics(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}`)
	})
	f := start(t, `domain: llm
http:
  routes:
    - pattern: "POST /v1/chat/completions"
      name: chat
      descriptors: [[{key: api_key, api_key: Authorization}]]
      tokens:
        descriptor: [{key: api_key_tokens, api_key: Authorization}]
        reserve: {default: 500}
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: api_key_tokens
    rate_limit: {unit: hour, requests_per_unit: 100000}
`, up)
	for range 2 {
		resp, body := f.do(nil, http.MethodPost, "/v1/chat/completions", "Authorization: Bearer k")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %q", resp.StatusCode, body)
		}
	}
	if r, s := f.count("sluice_proxy_tokens_total", "route", "chat", "kind", "reserved"), f.count("sluice_proxy_tokens_total", "route", "chat", "kind", "spent"); r != 1000 || s != 60 {
		t.Fatalf("tokens reserved %v, spent %v; want 1000 and 60", r, s)
	}
}
