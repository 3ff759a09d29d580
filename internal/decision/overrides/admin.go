package overrides

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/rules"
)

// Backend is where overrides are kept: FileStore for one node,
// RedisStore for nodes that share a Redis.
type Backend interface {
	List() []*Override
	Get(domain string, path []Entry) (*Override, bool)
	Put(o *Override, by string) (*Change, error)
	Delete(domain string, path []Entry, by string) (*Change, error)
}

// Token is one bearer token of the admin API and the name changes made
// with it are logged under.
type Token struct {
	Name   string
	Secret []byte
}

// LoadTokens reads a token file: one token a line, "name:secret" (the
// name is what the audit log shows; the secret runs to the end of the
// line); blank lines and lines starting with # are skipped. A line with
// no colon or no name, or a secret shorter than 16 bytes, is refused
// with its line number, never its text: one line that does not say what
// it means fails the file, rather than a token that answers 401 or one
// under a name nobody gave it.
func LoadTokens(path string) ([]Token, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Token
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, secret, ok := strings.Cut(line, ":")
		switch {
		case !ok:
			return nil, fmt.Errorf("%s, line %d: not name:secret (no colon)", path, i+1)
		case strings.TrimSpace(name) == "":
			return nil, fmt.Errorf("%s, line %d: a token with no name before its colon (name:secret)", path, i+1)
		}
		if len(secret) < 16 {
			return nil, fmt.Errorf("%s, line %d: a token of %d bytes: at least 16", path, i+1, len(secret))
		}
		out = append(out, Token{Name: name, Secret: []byte(secret)})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no token", path)
	}
	return out, nil
}

// ExplainFunc explains what applies to a request's descriptors.
type ExplainFunc func(ctx context.Context, domain string, descs []rules.Descriptor) (any, error)

// AdminConfig configures the admin API.
type AdminConfig struct {
	Backend Backend // nil: no overrides kept (sluice proxy): their routes answer 404
	Tokens  []Token
	Explain ExplainFunc  // nil: no /v1/explain
	Logger  *slog.Logger // the audit log; nil: discard
}

// Request bodies are bounded: an import of many overrides gets more room.
const (
	maxBody   = 1 << 20
	maxImport = 256 << 20
	maxPage   = 1000
)

// NewAdmin returns the admin API's handler:
//
//	GET    /v1/overrides?domain=D&prefix=P&limit=N&after=ID   a page, sorted by ID
//	GET    /v1/override?domain=D&path=P                      one
//	PUT    /v1/override                                      put (body: an override)
//	DELETE /v1/override?domain=D&path=P                      delete
//	POST   /v1/overrides/import                              JSON lines, all valid or none put
//	GET    /v1/overrides/export                              JSON lines
//	POST   /v1/explain                                       {"domain": D, "descriptors": [[{"key": K, "value": V}, ...], ...]}
//
// Every request needs "Authorization: Bearer <token>"; every change is one
// audit log line (who, what, before, after).
func NewAdmin(cfg AdminConfig) http.Handler {
	a := &admin{cfg: cfg, log: cfg.Logger}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	if cfg.Backend != nil {
		mux.HandleFunc("GET /v1/overrides", a.list)
		mux.HandleFunc("GET /v1/override", a.get)
		mux.HandleFunc("PUT /v1/override", a.put)
		mux.HandleFunc("DELETE /v1/override", a.del)
		mux.HandleFunc("POST /v1/overrides/import", a.importLines)
		mux.HandleFunc("GET /v1/overrides/export", a.export)
	} else {
		for _, p := range []string{"/v1/overrides", "/v1/override", "/v1/overrides/"} {
			mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
				a.fail(w, http.StatusNotFound, "", errors.New("no runtime overrides are kept here"))
			})
		}
	}
	mux.HandleFunc("POST /v1/explain", a.explain)
	return a.auth(mux)
}

type admin struct {
	cfg AdminConfig
	log *slog.Logger
}

// auth checks the bearer token, in constant time against each token.
func (a *admin) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		secret, ok := strings.CutPrefix(h, "Bearer ")
		name := ""
		if ok {
			for _, t := range a.cfg.Tokens {
				if subtle.ConstantTimeCompare([]byte(secret), t.Secret) == 1 {
					name = t.Name
				}
			}
		}
		if name == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice admin"`)
			a.fail(w, http.StatusUnauthorized, "", errors.New("a valid bearer token is required"))
			return
		}
		r.Header.Set("X-Sluice-Admin-Name", name)
		next.ServeHTTP(w, r)
	})
}

func who(r *http.Request) string { return r.Header.Get("X-Sluice-Admin-Name") }

// fail answers an error as JSON, naming the field at fault when known.
func (a *admin) fail(w http.ResponseWriter, code int, field string, err error) {
	var fe *FieldError
	if field == "" && errors.As(err, &fe) {
		field = fe.Field
	}
	body := map[string]any{"error": err.Error()}
	if field != "" {
		body["field"] = field
	}
	a.json(w, code, body)
}

func (a *admin) json(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// target reads domain and path from the query.
func target(r *http.Request) (string, []Entry, error) {
	domain := r.URL.Query().Get("domain")
	if domain == "" {
		return "", nil, &FieldError{"domain", "missing"}
	}
	path, err := ParsePath(r.URL.Query().Get("path"))
	return domain, path, err
}

func (a *admin) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 100
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxPage {
			a.fail(w, http.StatusBadRequest, "limit", fmt.Errorf("%q is not a number from 1 to %d", s, maxPage))
			return
		}
		limit = n
	}
	domain, prefix, after := q.Get("domain"), q.Get("prefix"), q.Get("after")
	out := struct {
		Overrides []*Override `json:"overrides"`
		Next      string      `json:"next,omitempty"`
	}{Overrides: []*Override{}}
	for _, o := range a.cfg.Backend.List() {
		id := o.ID()
		if domain != "" && o.Domain != domain || !strings.HasPrefix(PathString(o.Path), prefix) || after != "" && id <= after {
			continue
		}
		if len(out.Overrides) == limit {
			out.Next = out.Overrides[limit-1].ID()
			break
		}
		out.Overrides = append(out.Overrides, o)
	}
	a.json(w, http.StatusOK, out)
}

func (a *admin) get(w http.ResponseWriter, r *http.Request) {
	domain, path, err := target(r)
	if err != nil {
		a.fail(w, http.StatusBadRequest, "", err)
		return
	}
	o, ok := a.cfg.Backend.Get(domain, path)
	if !ok {
		a.fail(w, http.StatusNotFound, "", fmt.Errorf("no override for %s %s", domain, PathString(path)))
		return
	}
	a.json(w, http.StatusOK, o)
}

// decodeOverride reads one override, refusing unknown fields.
func decodeOverride(data []byte) (*Override, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var o Override
	if err := dec.Decode(&o); err != nil {
		return nil, &FieldError{"body", err.Error()}
	}
	o.Updated, o.UpdatedBy = timeZero, ""
	if err := o.Compile(); err != nil {
		return nil, err
	}
	return &o, nil
}

func (a *admin) put(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		a.fail(w, http.StatusRequestEntityTooLarge, "body", err)
		return
	}
	o, err := decodeOverride(data)
	if err != nil {
		a.fail(w, http.StatusBadRequest, "", err)
		return
	}
	c, err := a.cfg.Backend.Put(o, who(r))
	if err != nil {
		a.fail(w, http.StatusInternalServerError, "", err)
		return
	}
	a.audit(c)
	a.json(w, http.StatusOK, c)
}

func (a *admin) del(w http.ResponseWriter, r *http.Request) {
	domain, path, err := target(r)
	if err != nil {
		a.fail(w, http.StatusBadRequest, "", err)
		return
	}
	c, err := a.cfg.Backend.Delete(domain, path, who(r))
	if err != nil {
		a.fail(w, http.StatusInternalServerError, "", err)
		return
	}
	if c == nil {
		a.fail(w, http.StatusNotFound, "", fmt.Errorf("no override for %s %s", domain, PathString(path)))
		return
	}
	a.audit(c)
	a.json(w, http.StatusOK, c)
}

// importLines puts every override of a JSON lines body, after checking
// all of them: one invalid line and none is put.
func (a *admin) importLines(w http.ResponseWriter, r *http.Request) {
	sc := bufio.NewScanner(http.MaxBytesReader(w, r.Body, maxImport))
	sc.Buffer(make([]byte, 64<<10), maxBody)
	var all []*Override
	var problems []string
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		o, err := decodeOverride(line)
		if err != nil {
			problems = append(problems, fmt.Sprintf("line %d: %v", n, err))
			continue
		}
		all = append(all, o)
	}
	if err := sc.Err(); err != nil {
		a.fail(w, http.StatusBadRequest, "body", err)
		return
	}
	if len(problems) > 0 {
		a.json(w, http.StatusBadRequest, map[string]any{"error": "nothing imported", "problems": problems})
		return
	}
	for _, o := range all {
		c, err := a.cfg.Backend.Put(o, who(r))
		if err != nil {
			a.fail(w, http.StatusInternalServerError, "", err)
			return
		}
		a.audit(c)
	}
	a.json(w, http.StatusOK, map[string]int{"imported": len(all)})
}

func (a *admin) export(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/jsonl")
	enc := json.NewEncoder(w)
	for _, o := range a.cfg.Backend.List() {
		enc.Encode(o)
	}
}

// explainBody is the body of POST /v1/explain.
type explainBody struct {
	Domain      string    `json:"domain"`
	Descriptors [][]Entry `json:"descriptors"`
}

func (a *admin) explain(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Explain == nil {
		a.fail(w, http.StatusNotFound, "", errors.New("explain is not served here"))
		return
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	var b explainBody
	if err := dec.Decode(&b); err != nil {
		a.fail(w, http.StatusBadRequest, "body", err)
		return
	}
	descs := make([]rules.Descriptor, len(b.Descriptors))
	for i, d := range b.Descriptors {
		for _, e := range d {
			descs[i].Entries = append(descs[i].Entries, rules.Entry{Key: e.Key, Value: e.Value})
		}
		descs[i].Cost = 1
	}
	out, err := a.cfg.Explain(r.Context(), b.Domain, descs)
	if err != nil {
		a.fail(w, http.StatusBadRequest, "", err)
		return
	}
	a.json(w, http.StatusOK, out)
}

// audit logs one change: who, what, before and after.
func (a *admin) audit(c *Change) {
	if c == nil {
		return
	}
	id := ""
	switch {
	case c.After != nil:
		id = c.After.ID()
	case c.Before != nil:
		id = c.Before.ID()
	}
	before, _ := json.Marshal(c.Before)
	after, _ := json.Marshal(c.After)
	a.log.Info("override changed", "who", c.By, "op", c.Op, "id", id, "before", string(before), "after", string(after))
}
