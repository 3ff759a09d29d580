package overrides_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/decision/overrides"
	"github.com/sluicehq/sluice/rules"
)

const secret = "s3cret-token-of-32-bytes-000000000"

func newAdmin(t *testing.T) (*httptest.Server, *overrides.FileStore, *bytes.Buffer) {
	t.Helper()
	idx := overrides.NewIndex(nil)
	fs, err := overrides.OpenFile(filepath.Join(t.TempDir(), "o.jsonl"), idx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	var audit bytes.Buffer
	h := overrides.NewAdmin(overrides.AdminConfig{
		Backend: fs,
		Tokens:  []overrides.Token{{Name: "ops", Secret: []byte(secret)}},
		Explain: func(_ context.Context, domain string, descs []rules.Descriptor) (any, error) {
			return map[string]any{"domain": domain, "n": len(descs), "override": idx.Lookup(domain, descs[0].Entries) != nil}, nil
		},
		Logger: slog.New(slog.NewJSONHandler(&audit, nil)),
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, fs, &audit
}

func call(t *testing.T, srv *httptest.Server, method, path, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAdminAuth: without a token, with a wrong one, or with a prefix of
// the right one, every endpoint answers 401 and changes nothing.
func TestAdminAuth(t *testing.T) {
	srv, fs, _ := newAdmin(t)
	body := `{"domain":"api","path":[{"key":"tenant","value":"acme"}],"limit":{"unit":"minute","requests_per_unit":5}}`
	for _, tok := range []string{"", "wrong-token-wrong-token-wrong", secret[:len(secret)-1], secret + "x"} {
		for _, c := range []struct{ method, path string }{{"PUT", "/v1/override"}, {"GET", "/v1/overrides"}, {"GET", "/v1/overrides/export"}, {"DELETE", "/v1/override?domain=api&path=tenant=acme"}, {"POST", "/v1/explain"}} {
			if code, _ := call(t, srv, c.method, c.path, tok, body); code != http.StatusUnauthorized {
				t.Errorf("%s %s with token %q: %d, want 401", c.method, c.path, tok, code)
			}
		}
	}
	if n := len(fs.List()); n != 0 {
		t.Errorf("%d overrides after refused calls", n)
	}
}

// TestAdminAPI: put, get, list with paging and filters, delete, import
// (all valid or none), export, explain; errors name the field; every
// change is an audit line with who, what, before and after.
func TestAdminAPI(t *testing.T) {
	srv, _, audit := newAdmin(t)
	put := func(body string) (int, string) { return call(t, srv, "PUT", "/v1/override", secret, body) }
	if code, out := put(`{"domain":"api","path":[{"key":"tenant","value":"acme"}],"limit":{"unit":"minute","requests_per_unit":5},"note":"launch"}`); code != 200 {
		t.Fatalf("put: %d %s", code, out)
	}
	if code, out := put(`{"domain":"api","path":[{"key":"tenant","value":"acme"}],"limit":{"unit":"minute","requests_per_unit":50}}`); code != 200 || !strings.Contains(out, `"before"`) {
		t.Fatalf("replace: %d %s, want the change with its before", code, out)
	}
	for _, c := range []struct{ body, field string }{
		{`{"domain":"","path":[{"key":"k","value":"v"}],"limit":{"unit":"minute","requests_per_unit":5}}`, "domain"},
		{`{"domain":"api","path":[{"key":"k","value":"v"}],"limit":{"unit":"minute","requests_per_unit":-1}}`, "limit"},
		{`{"domain":"api","path":[{"key":"k","value":"a*b"}],"limit":{"unit":"minute","requests_per_unit":1}}`, "path[0].value"},
		{`{"domain":"api","path":[{"key":"k","value":"v"}],"limit":{"unit":"minute","requests_per_unit":1},"colour":"red"}`, "body"},
		{`not json`, "body"},
		{`{"domain":"api","path":[{"key":"k","value":"v"}],"limit":{"unit":"minute"}}`, "limit"},
	} {
		code, out := put(c.body)
		var e struct{ Field string }
		json.Unmarshal([]byte(out), &e)
		if code != 400 || e.Field != c.field {
			t.Errorf("put %s: %d %s, want 400 naming %q", c.body, code, out, c.field)
		}
	}
	if _, out := put(`{"domain":"api","path":[{"key":"k","value":"v"}],"limit":{"unit":"minute"}}`); !strings.Contains(out, "requests_per_unit is missing") {
		t.Errorf("a limit without requests_per_unit: %s, want it said", out)
	}
	if code, out := call(t, srv, "GET", "/v1/override?domain=api&path=tenant=acme", secret, ""); code != 200 || !strings.Contains(out, `"requests_per_unit":50`) {
		t.Fatalf("get: %d %s", code, out)
	}
	var lines []string
	for _, v := range []string{"a", "b", "c", "d", "e"} {
		lines = append(lines, `{"domain":"api","path":[{"key":"user","value":"`+v+`"}],"limit":{"blocked":true}}`)
	}
	if code, out := call(t, srv, "POST", "/v1/overrides/import", secret, strings.Join(lines, "\n")+"\n"+`{"domain":"api","path":[],"limit":{"blocked":true}}`); code != 400 || !strings.Contains(out, "line 6") {
		t.Fatalf("import with a bad line: %d %s, want 400 naming line 6", code, out)
	}
	if _, out := call(t, srv, "GET", "/v1/overrides", secret, ""); strings.Contains(out, `"user"`) {
		t.Fatalf("an import with a bad line put some overrides: %s", out)
	}
	if code, out := call(t, srv, "POST", "/v1/overrides/import", secret, strings.Join(lines, "\n")); code != 200 || !strings.Contains(out, `"imported":5`) {
		t.Fatalf("import: %d %s", code, out)
	}
	// Paging: 6 overrides, 4 a page.
	var page struct {
		Overrides []overrides.Override
		Next      string
	}
	_, out := call(t, srv, "GET", "/v1/overrides?limit=4", secret, "")
	json.Unmarshal([]byte(out), &page)
	if len(page.Overrides) != 4 || page.Next == "" {
		t.Fatalf("first page: %d overrides, next %q", len(page.Overrides), page.Next)
	}
	_, out = call(t, srv, "GET", "/v1/overrides?limit=4&after="+page.Next, secret, "")
	page.Overrides, page.Next = nil, ""
	json.Unmarshal([]byte(out), &page)
	if len(page.Overrides) != 2 || page.Next != "" {
		t.Fatalf("second page: %d overrides, next %q", len(page.Overrides), page.Next)
	}
	_, out = call(t, srv, "GET", "/v1/overrides?prefix=user=", secret, "")
	page.Overrides, page.Next = nil, ""
	json.Unmarshal([]byte(out), &page)
	if len(page.Overrides) != 5 {
		t.Fatalf("prefix user=: %d overrides, want 5", len(page.Overrides))
	}
	if code, out := call(t, srv, "GET", "/v1/overrides/export", secret, ""); code != 200 || strings.Count(out, "\n") != 6 {
		t.Fatalf("export: %d, %d lines", code, strings.Count(out, "\n"))
	}
	if code, out := call(t, srv, "POST", "/v1/explain", secret, `{"domain":"api","descriptors":[[{"key":"user","value":"c"}]]}`); code != 200 || !strings.Contains(out, `"override":true`) {
		t.Fatalf("explain: %d %s", code, out)
	}
	if code, _ := call(t, srv, "DELETE", "/v1/override?domain=api&path=tenant=acme", secret, ""); code != 200 {
		t.Fatalf("delete: %d", code)
	}
	if code, _ := call(t, srv, "DELETE", "/v1/override?domain=api&path=tenant=acme", secret, ""); code != 404 {
		t.Fatalf("delete again: %d, want 404", code)
	}
	if code, _ := call(t, srv, "GET", "/v1/override?domain=api&path=tenant=acme", secret, ""); code != 404 {
		t.Fatalf("get after delete: %d, want 404", code)
	}
	// 2 puts, 5 imported, 1 delete: 8 audit lines, each with who and both sides.
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(audit.String()), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != "override changed" {
			continue
		}
		n++
		if rec["who"] != "ops" || rec["before"] == nil || rec["after"] == nil || rec["id"] == "" {
			t.Errorf("audit line without who, id, before or after: %s", line)
		}
		// The side the change is about is there, not JSON null.
		if rec["op"] == "put" && rec["after"] == "null" || rec["op"] == "delete" && rec["before"] == "null" {
			t.Errorf("audit line of a %v without the override: %s", rec["op"], line)
		}
	}
	if n != 8 {
		t.Errorf("%d audit lines, want 8:\n%s", n, audit.String())
	}
}

// TestAdminExplainOnly: without a Backend (sluice proxy keeps no
// overrides), explain is served behind the same tokens, and the
// overrides' routes answer 404 saying why.
func TestAdminExplainOnly(t *testing.T) {
	srv := httptest.NewServer(overrides.NewAdmin(overrides.AdminConfig{
		Tokens: []overrides.Token{{Name: "ops", Secret: []byte(secret)}},
		Explain: func(_ context.Context, domain string, descs []rules.Descriptor) (any, error) {
			return map[string]any{"domain": domain, "n": len(descs)}, nil
		},
	}))
	defer srv.Close()
	body := `{"domain":"api","descriptors":[[{"key":"user","value":"bob"}]]}`
	if code, got := call(t, srv, "POST", "/v1/explain", "", body); code != 401 {
		t.Errorf("explain without a token: %d %s, want 401", code, got)
	}
	if code, got := call(t, srv, "POST", "/v1/explain", secret, body); code != 200 || !strings.Contains(got, `"domain":"api","n":1`) {
		t.Errorf("explain: %d %s", code, got)
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/overrides"}, {"GET", "/v1/override?domain=api&path=user=bob"}, {"PUT", "/v1/override"},
		{"DELETE", "/v1/override?domain=api&path=user=bob"}, {"POST", "/v1/overrides/import"}, {"GET", "/v1/overrides/export"},
	} {
		if code, got := call(t, srv, c.method, c.path, secret, ""); code != 404 || !strings.Contains(got, "no runtime overrides are kept here") {
			t.Errorf("%s %s: %d %s, want 404 saying no overrides are kept", c.method, c.path, code, got)
		}
		if code, _ := call(t, srv, c.method, c.path, "", ""); code != 401 {
			t.Errorf("%s %s without a token: %d, want 401", c.method, c.path, code)
		}
	}
}

// TestLoadTokens: a token file is name:secret lines (the secret may hold
// colons), with blank lines and # comments. A line with no colon, with
// no name before it, or with a secret under 16 bytes fails the file with
// its line number, and the error never holds the line's text.
func TestLoadTokens(t *testing.T) {
	dir := t.TempDir()
	write := func(content string) string {
		path := filepath.Join(dir, "tokens")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	tokens, err := overrides.LoadTokens(write("# ops team\nops:" + secret + "\n\n  ci:a:b:c:0123456789abcdef  \n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(tokens) != 2 || tokens[0].Name != "ops" || string(tokens[0].Secret) != secret || tokens[1].Name != "ci" || string(tokens[1].Secret) != "a:b:c:0123456789abcdef" {
		t.Errorf("tokens %+v", tokens)
	}
	for _, c := range []struct{ content, want string }{
		{"ops:" + secret + "\ntokvalNOCOLONxxxxxxxxxxxxxxxx\n", "line 2: not name:secret (no colon)"},
		{"# x\n:tokvalEMPTYNAMExxxxxxxxxxxxx\n", "line 2: a token with no name"},
		{"  :tokvalEMPTYNAMExxxxxxxxxxxxx\n", "line 1: a token with no name"},
		{"ops:tokvalSHORT\n", "line 1: a token of 11 bytes: at least 16"},
		{"# nothing\n", "no token"},
	} {
		_, err := overrides.LoadTokens(write(c.content))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.content, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "tokval") {
			t.Errorf("%q: the error shows the secret: %v", c.content, err)
		}
	}
}
