package httplimit

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

// naiveObjects walks b with encoding/json's tokenizer: whether it is one
// JSON object, how deep it nests, and whether an object of it repeats a
// key, compared as bytes.EqualFold compares (encoding/json's own matching
// of field names).
func naiveObjects(b []byte) (object bool, depth int, repeats bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	type frame struct {
		obj  bool
		keys []string
		key  bool // the next string of an object is a key
	}
	var stack []frame
	first := true
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return
		}
		if err != nil {
			return false, 0, false
		}
		if first {
			object = tok == json.Delim('{')
			first = false
		}
		top := len(stack) - 1
		if s, ok := tok.(string); ok && top >= 0 && stack[top].obj && stack[top].key {
			for _, k := range stack[top].keys {
				if strings.EqualFold(k, s) {
					repeats = true
				}
			}
			stack[top].keys = append(stack[top].keys, s)
			stack[top].key = false
			continue
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			stack = append(stack, frame{obj: tok == json.Delim('{'), key: true})
			depth = max(depth, len(stack))
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:top]
		}
		if top = len(stack) - 1; top >= 0 && stack[top].obj {
			stack[top].key = true
		}
	}
}

// FuzzStrictJSON holds strictJSON to encoding/json: what it accepts,
// encoding/json reads as one object with the same top-level members, no
// key repeated in any case, in valid UTF-8; and what encoding/json reads so
// (without surrogate escapes, which strictJSON refuses alone in keys), it
// accepts.
func FuzzStrictJSON(f *testing.F) {
	for _, seed := range []string{
		`{"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`,
		`{"a":{"b":[1,2.5e-3,-0,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9"]}}`,
		`{"max_tokens":1,"MAX_TOKENS":2}`,
		`{"a":1}{"a":2}`,
		"\xef\xbb\xbf{}",
		`{"k\u212aey":1,"kkey":2}`,
		`{"a":NaN}`,
		`{"a\ud800":1}`,
		`{"a":"\ud83d\ude00"}`,
		` { } `,
		`[[[]]]`,
		`{"a":01}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := new(strictJSON)
		err := s.scan(b)
		object, depth, repeats := naiveObjects(b)
		valid := json.Valid(b) && utf8.Valid(b)
		if err == nil {
			if !valid || !object || repeats || depth > maxJSONDepth {
				t.Fatalf("accepted %q: valid %v, object %v, repeats %v, depth %d", b, valid, object, repeats, depth)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(b, &m); err != nil || len(m) != len(s.top) {
				t.Fatalf("accepted %q: %d members, encoding/json %d (%v)", b, len(s.top), len(m), err)
			}
			for _, mem := range s.top {
				raw, ok := m[string(mem.key)]
				if !ok || !bytes.Equal(raw, b[mem.vs:mem.ve]) {
					t.Fatalf("accepted %q: member %q is %q, encoding/json %q", b, mem.key, b[mem.vs:mem.ve], raw)
				}
			}
			return
		}
		if valid && object && !repeats && depth <= maxJSONDepth && !bytes.Contains(bytes.ToLower(b), []byte(`\ud`)) && !bytes.Contains(b, []byte(`\u0000`)) {
			t.Fatalf("refused %q (%v), which encoding/json reads as one object without repeats", b, err)
		}
	})
}
