// Package openai is the OpenAI wire format of httplimit's token budgets
// (httplimit.Tokens, sluice proxy's tokens:): what a request reserves,
// read from its JSON body (the output caps, n, best_of, the prompt's
// bytes, and with Enforce the caps written back into the body), what an
// answer spent, read from its usage (a JSON answer's or a server-sent
// event stream's), and OpenAI's x-ratelimit-*-tokens headers. The strict
// JSON scanner the body is read with is here too. httplimit owns the rest
// of a budget: its descriptor, the reservation's decision, the
// settlement, and the usage header.
//
// This package imports the root package, decide and the standard
// library; it must not import httplimit, which sees it through two small
// interfaces (a request's cost, an answer's usage reader).
package openai

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/sluicehq/sluice"
)

// Config is the wire format's part of httplimit.Tokens, whose fields it
// names in its errors: see httplimit.Tokens for each field.
type Config struct {
	Fields                    []string
	Header                    string
	Default, Max              int64
	PromptBytes               bool
	InputWeight, OutputWeight int64
	Enforce, AllowUnbounded   bool
	MaxBody                   int64
}

// Format is a validated Config: it reads requests (Reserve) and answers
// (NewUsage). It is safe for concurrent use.
type Format struct {
	fields         []string
	header         string
	def, max       int64
	promptBytes    bool
	wIn, wOut      int64
	enforce        bool
	allowUnbounded bool
	maxBody        int64
	outFields      []string              // fields, then the defaultFields they do not name
	known          map[string]knownField // the body's fields read, by folded name
}

// Invalid is a request the format refuses as invalid (400): it names the
// header or field at fault, never its value.
type Invalid string

func (e Invalid) Error() string { return string(e) }

// The request bodies the format cannot read: one compressed (415), one
// over MaxBody (413).
var (
	ErrEncodedBody  = errors.New("a compressed request body cannot be read for its token reservation")
	ErrBodyTooLarge = errors.New("request body too large for its token reservation")
)

// defaultFields are the JSON fields of the output reserved, in OpenAI's
// Chat Completions (the current name, then the former) and Responses APIs.
var defaultFields = []string{"max_completion_tokens", "max_tokens", "max_output_tokens"}

// defaultMaxBody is Tokens.MaxBody's default.
const defaultMaxBody = 8 << 20

// New checks cfg and returns its Format. Its errors name the fields of
// httplimit.Tokens.
func New(cfg Config) (*Format, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	t := &Format{
		header: cfg.Header, def: cfg.Default, max: cfg.Max,
		promptBytes: cfg.PromptBytes, wIn: max(cfg.InputWeight, 1), wOut: max(cfg.OutputWeight, 1),
		enforce: cfg.Enforce, allowUnbounded: cfg.AllowUnbounded, maxBody: cfg.MaxBody,
		fields: append([]string(nil), cfg.Fields...),
	}
	if t.max == 0 {
		t.max = t.def
	}
	if len(t.fields) == 0 {
		t.fields = defaultFields
	}
	if t.maxBody == 0 {
		t.maxBody = defaultMaxBody
	}
	t.outFields = append([]string(nil), t.fields...)
	for _, d := range defaultFields {
		if !slices.ContainsFunc(t.fields, func(f string) bool { return strings.EqualFold(f, d) }) {
			t.outFields = append(t.outFields, d)
		}
	}
	t.known = knownFields(t.outFields)
	return t, nil
}

// configName is the configuration the errors of New name.
const configName = "Tokens"

// check checks cfg's values.
func (cfg *Config) check() error {
	switch {
	case cfg.Default <= 0 || cfg.Default > sluice.MaxCost:
		return fmt.Errorf("%s.Default must be between 1 and %d, got %d", configName, int64(sluice.MaxCost), cfg.Default)
	case cfg.Max < 0 || cfg.Max > sluice.MaxCost:
		return fmt.Errorf("%s.Max must be between 0 and %d, got %d", configName, int64(sluice.MaxCost), cfg.Max)
	case cfg.Max != 0 && cfg.Max < cfg.Default:
		return fmt.Errorf("%s.Max %d is below Default %d", configName, cfg.Max, cfg.Default)
	case cfg.InputWeight < 0 || cfg.OutputWeight < 0 || cfg.InputWeight > 1<<20 || cfg.OutputWeight > 1<<20:
		return fmt.Errorf("%s weights must be between 0 (meaning 1) and %d", configName, 1<<20)
	case cfg.MaxBody < 0:
		return fmt.Errorf("%s.MaxBody must not be negative", configName)
	case cfg.AllowUnbounded && !cfg.Enforce:
		return fmt.Errorf("%s.AllowUnbounded needs Enforce (without it nothing is refused)", configName)
	case len(cfg.Fields) > 16:
		return fmt.Errorf("%s has %d fields (at most 16)", configName, len(cfg.Fields))
	}
	for _, f := range cfg.Fields {
		if f == "" || len(f) > 128 {
			return fmt.Errorf("%s field names must be 1 to 128 bytes", configName)
		}
	}
	return nil
}

// satAdd is a+b, at most MaxCost (a, b in 0..MaxCost).
func satAdd(a, b int64) int64 {
	return min(a+b, sluice.MaxCost) // both at most MaxCost: no overflow
}

// encoded reports whether a request's Content-Encoding, of every line and
// every item of each, names any coding but identity: an upstream reads
// them all ("identity" then "gzip" is a gzip body).
func encoded(h http.Header) bool {
	for _, v := range h.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				return true
			}
		}
	}
	return false
}
