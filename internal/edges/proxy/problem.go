package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ProblemBadGateway is the problem type (RFC 9457) of the 502 answer to a
// request the upstream did not answer: unreachable, refusing connections,
// failing before its response started, or a Config.ModifyResponse error.
// The body names no cause; the cause goes to Config.Logger.
const ProblemBadGateway = "https://pkg.go.dev/github.com/sluicehq/sluice/proxy#ProblemBadGateway"

// ProblemGatewayTimeout is the problem type of the 504 answer to a
// request whose upstream sent no response headers within
// Config.UpstreamTimeout once the request had been sent to it.
const ProblemGatewayTimeout = "https://pkg.go.dev/github.com/sluicehq/sluice/proxy#ProblemGatewayTimeout"

// ProblemPermitLost is the problem type of the 503 answer to a request
// cancelled while it ran because its concurrency permit was lost: a
// renewal found that the store no longer held it (a Redis restarted
// empty, a failover, a stall past the rule's ttl) and that other requests
// held every slot of its key. Sent only when the upstream's answer had
// not started; otherwise the answer is cut short.
const ProblemPermitLost = "https://pkg.go.dev/github.com/sluicehq/sluice/proxy#ProblemPermitLost"

// writeProblem writes an application/problem+json body with status.
func writeProblem(w http.ResponseWriter, status int, typ, title, detail string) {
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{typ, title, status, detail}) // strings and a number: cannot fail
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}
