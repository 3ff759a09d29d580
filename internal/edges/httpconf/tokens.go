package httpconf

import (
	"go.yaml.in/yaml/v3"
	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/httplimit"
)

// The keys of a route's tokens block.
var (
	tokensKeys  = []string{"descriptor", "reserve", "usage", "enforce", "unbounded", "max_body"}
	reserveKeys = []string{"fields", "header", "default", "max", "prompt"}
	usageKeys   = []string{"input_weight", "output_weight", "header"}
)

// maxTokens bounds a reservation's default and max in the file: a billion
// tokens.
const maxTokens = 1 << 30

// tokens reads a route's token budget (httplimit.Tokens):
//
//	tokens:
//	  descriptor: [{key: api_key_tokens, api_key: Authorization}]
//	  reserve:
//	    fields: [max_completion_tokens, max_tokens]   # default: these and max_output_tokens
//	    header: X-Max-Tokens                          # optional, before fields
//	    default: 1024                                 # required
//	    max: 4096                                     # default: default
//	    prompt: bytes                                 # bytes | none (default)
//	  usage: {input_weight: 1, output_weight: 1, header: X-Tokens-Used}
//	  enforce: true
//	  unbounded: refuse                               # refuse (default) | allow; with enforce
//	  max_body: 8388608
func (p *parser) tokens(n *yaml.Node) *httplimit.Tokens {
	t := &httplimit.Tokens{}
	var desc, reserve bool
	var unbounded *yaml.Node
	if !p.fields(n, "tokens", tokensKeys, func(key string, k, v *yaml.Node) {
		switch key {
		case "descriptor":
			desc = true
			t.Descriptor = p.entries(v, "descriptor (a list of entries)", "descriptor is empty")
		case "reserve":
			reserve = true
			p.reserve(t, v)
		case "usage":
			p.fields(v, "usage", usageKeys, func(key string, k, v *yaml.Node) {
				switch key {
				case "input_weight":
					t.InputWeight = int64(p.integer(v, "input_weight", 1, 1<<20))
				case "output_weight":
					t.OutputWeight = int64(p.integer(v, "output_weight", 1, 1<<20))
				case "header":
					t.UsageHeader = p.headerName(v, "usage header")
				}
			})
		case "enforce":
			t.Enforce = p.boolean(v, "enforce")
		case "unbounded":
			unbounded = v
			if s, ok := p.str(v, "unbounded"); ok {
				switch s {
				case "allow":
					t.AllowUnbounded = true
				case "refuse":
				default:
					p.Errorf(p.node(v), "unbounded must be refuse (a request whose tokens the reservation cannot bound is refused) or allow, got %q", s)
				}
			}
		case "max_body":
			t.MaxBody = int64(p.integer(v, "max_body", 1, 1<<30))
		}
	}) {
		return t
	}
	if !desc {
		p.Errorf(p.node(n), "tokens needs descriptor: the entries of the descriptor whose limits count the tokens")
	}
	if !reserve {
		p.Errorf(p.node(n), "tokens needs reserve, with at least default: the tokens to reserve when a request names none")
	}
	if unbounded != nil && !t.Enforce {
		p.Errorf(p.node(unbounded), "unbounded needs enforce: true (without it no request is refused)")
	}
	return t
}

// reserve reads a token budget's reserve block into t.
func (p *parser) reserve(t *httplimit.Tokens, n *yaml.Node) {
	hasDefault := false
	isMap := p.fields(n, "reserve", reserveKeys, func(key string, k, v *yaml.Node) {
		switch key {
		case "fields":
			items, ok := p.List(v, "fields", 16)
			if !ok {
				return
			}
			if len(items) == 0 {
				p.Errorf(p.node(v), "fields is empty (leave it out for max_completion_tokens, max_tokens and max_output_tokens)")
			}
			for _, it := range items {
				if f, ok := p.str(it, "a field name"); ok {
					t.Fields = append(t.Fields, f)
				}
			}
		case "header":
			t.Header = p.headerName(v, "reserve header")
		case "default":
			hasDefault = true
			t.Default = int64(p.integer(v, "default", 1, maxTokens))
		case "max":
			t.Max = int64(p.integer(v, "max", 1, maxTokens))
		case "prompt":
			if s, ok := p.str(v, "prompt"); ok {
				switch s {
				case "bytes":
					t.PromptBytes = true
				case "none":
				default:
					p.Errorf(p.node(v), "prompt must be bytes (the body's size bounds the prompt's tokens) or none, got %q", s)
				}
			}
		}
	})
	if isMap && !hasDefault {
		p.Errorf(p.node(n), "reserve needs default: the tokens to reserve when a request names none")
	}
	if t.Max != 0 && t.Default > t.Max {
		p.Errorf(p.node(n), "reserve: default %d is above max %d", t.Default, t.Max)
	}
}

// headerName reads an HTTP header name.
func (p *parser) headerName(n *yaml.Node, what string) string {
	s, ok := p.str(n, what)
	if ok && !httpguts.ValidHeaderFieldName(s) {
		p.Errorf(p.node(n), "%s %q is not a valid header name", what, s)
		return ""
	}
	return s
}

// entries reads one descriptor's list of entries, described as what;
// empty is the problem of an empty list.
func (p *parser) entries(n *yaml.Node, what, empty string) httplimit.Descriptor {
	items, ok := p.List(n, what, httplimit.MaxEntries)
	if !ok {
		return nil
	}
	if len(items) == 0 {
		p.Errorf(p.node(n), "%s", empty)
		return nil
	}
	var d httplimit.Descriptor
	for _, e := range items {
		if en, _, ok := p.entry(e); ok {
			d = append(d, en)
		}
	}
	return d
}
