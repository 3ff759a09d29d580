package server

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/internal/edges/rls"
)

// Handler serves the HTTP API:
//
//	POST /json     a RateLimitRequest in protobuf JSON; 200 (OK) or 429
//	               (OVER_LIMIT) with the RateLimitResponse in protobuf
//	               JSON, as envoyproxy/ratelimit; 400 for a malformed or
//	               invalid request, 413 for a body over MaxJSONBody, 503
//	               without configuration or store; errors as
//	               {"code":400,"error":"..."}
//	GET /healthz   200 while the process is alive
//	GET /readyz    200 when ready (a configuration loaded, Config.Ready
//	               passing, not draining, the store up or the default
//	               failure policy not fail_closed), else 503 with the
//	               reason; then a line with the store's state
//	               ("store: up", "store: down: ...") when it reports one,
//	               and while a failure policy answers requests (within
//	               the last minute) a line that says since when, how
//	               many and why ("failure policy: answered ...")
//	GET /healthcheck  /readyz under envoyproxy/ratelimit's name
//	GET /metrics   Prometheus metrics of Config.Registry
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/json", s.serveJSON)
	mux.HandleFunc("/healthz", s.serveHealthz)
	mux.HandleFunc("/readyz", s.serveReadyz)
	mux.HandleFunc("/healthcheck", s.serveReadyz)
	mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{
		ErrorLog:          slogPrinter{s},
		EnableOpenMetrics: true,
	}))
	return mux
}

// slogPrinter adapts the logger to promhttp's error log.
type slogPrinter struct{ s *Server }

func (p slogPrinter) Println(v ...any) {
	if len(v) > 0 {
		if err, ok := v[len(v)-1].(error); ok {
			p.s.log.Warn("serving metrics", "err", err)
			return
		}
	}
	p.s.log.Warn("serving metrics", "detail", v)
}

func (s *Server) serveJSON(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed: POST a RateLimitRequest in protobuf JSON")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	if err != nil {
		s.m.requests[viaHTTP][resultInvalid].Inc()
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			s.m.tooLarge[viaHTTP].Inc()
			writeError(w, http.StatusRequestEntityTooLarge, "request body larger than "+strconv.Itoa(MaxJSONBody)+" bytes")
			return
		}
		writeError(w, http.StatusBadRequest, "reading the request body: "+err.Error())
		return
	}
	if err := scanJSON(body); err != nil {
		f := s.fail(err, viaHTTP)
		writeError(w, f.httpStatus(), f.msg)
		return
	}
	req := new(rlsv3.RateLimitRequest)
	if err := protojson.Unmarshal(body, req); err != nil {
		s.m.requests[viaHTTP][resultInvalid].Inc()
		writeError(w, http.StatusBadRequest, "malformed RateLimitRequest JSON: "+err.Error())
		return
	}
	exact := r.Header.Get(rls.DialectKey) == rls.DialectExactValue
	resp, f := s.answer(r.Context(), req, viaHTTP, exact, rls.Preference(r.Header.Get(rls.AllOrNothingKey)))
	if f != nil {
		writeError(w, f.httpStatus(), f.msg)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		s.log.Error("encoding a RateLimitResponse", "err", err)
		writeError(w, http.StatusInternalServerError, "encoding the response: "+err.Error())
		return
	}
	h := w.Header()
	for _, hv := range resp.ResponseHeadersToAdd {
		h.Set(hv.Key, hv.Value)
	}
	h.Set("Content-Type", "application/json")
	code := http.StatusOK
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		code = http.StatusTooManyRequests
	}
	w.WriteHeader(code)
	w.Write(out)
}

// writeError answers with code and a JSON body {"code":…,"error":msg}.
func writeError(w http.ResponseWriter, code int, msg string) {
	body, _ := json.Marshal(struct {
		Code  int    `json:"code"`
		Error string `json:"error"`
	}{code, msg})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	w.Write(append(body, '\n'))
}

// allowGet answers 405 to a request that is neither GET nor HEAD.
func allowGet(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed")
	return false
}

func (s *Server) serveHealthz(w http.ResponseWriter, r *http.Request) {
	if !allowGet(w, r) {
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "OK\n")
}

func (s *Server) serveReadyz(w http.ResponseWriter, r *http.Request) {
	if !allowGet(w, r) {
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := s.readiness(r.Context()); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "not ready: "+err.Error()+"\n")
	} else {
		io.WriteString(w, "OK\n")
	}
	if s.storeUp != nil {
		if err := s.storeUp(); err != nil {
			io.WriteString(w, "store: down: "+err.Error()+" (requests are answered by the failure policies; the default is "+s.dec.Failover().Default.String()+")\n")
		} else {
			io.WriteString(w, "store: up\n")
		}
	}
	if st := s.policy.status(time.Now()); st != "" {
		io.WriteString(w, st+"\n")
	}
}
