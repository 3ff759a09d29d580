package httpconf

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"

	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/base/yamlwalk"
)

// conflict finds the other pattern in a ServeMux conflict panic.
var conflict = regexp.MustCompile(`conflicts with pattern ("(?:[^"\\]|\\.)*")`)

// check registers the routes on a ServeMux, as a front door will, and
// builds their middleware, reporting at the route's line what either
// refuses: an invalid pattern, two patterns that conflict (both match some
// request and neither is more specific), a configuration httplimit
// rejects. Nothing that passes can fail when a front door is built.
func (p *parser) check(s *Section) {
	mux := http.NewServeMux()
	lines := map[string]int{}
	for _, r := range s.Routes {
		if msg := register(mux, r.Pattern); msg != "" {
			if m := conflict.FindStringSubmatch(msg); m != nil {
				other, _ := strconv.Unquote(m[1])
				p.Errs = append(p.Errs, yamlwalk.Note{Line: r.Line, Msg: fmt.Sprintf(
					"pattern %q conflicts with the pattern %q of the route at line %d: both match some requests and neither is more specific",
					r.Pattern, other, lines[other])})
			} else {
				p.Errs = append(p.Errs, yamlwalk.Note{Line: r.Line, Msg: fmt.Sprintf("pattern %q: %s", r.Pattern, msg)})
			}
			continue
		}
		lines[r.Pattern] = r.Line
		conc := r.Concurrency
		if conc != nil {
			c := *conc // New records its counts in it: not in s
			conc = &c
		}
		_, err := httplimit.New(httplimit.Config{
			Decider:     new(decide.Decider), // never asked: the middleware is only checked
			Domain:      "check",
			ClientIP:    s.ClientIP,
			Descriptors: r.Descriptors,
			Headers:     s.Headers,
			Shaping:     r.Shaping,
			Failures:    r.Failures,
			Concurrency: conc,
		})
		if err != nil {
			p.Errs = append(p.Errs, yamlwalk.Note{Line: r.Line, Msg: err.Error()})
		}
	}
}

// register adds pattern to mux and returns why ServeMux refused it, which
// it says only by panicking.
func register(mux *http.ServeMux, pattern string) (msg string) {
	defer func() {
		if e := recover(); e != nil {
			msg = fmt.Sprint(e)
		}
	}()
	mux.Handle(pattern, http.NotFoundHandler())
	return ""
}
