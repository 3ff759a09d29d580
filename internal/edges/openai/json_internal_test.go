package openai

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

// FuzzAnswerUsage holds answerScan to encoding/json: fed a JSON object in
// two writes, it finds the value of its top-level usage, as encoding/json
// does, and nothing else.
func FuzzAnswerUsage(f *testing.F) {
	for _, seed := range []string{
		`{"id":"x","usage":{"prompt_tokens":10,"completion_tokens":1000},"x":{"usage":{"total_tokens":0}}}`,
		`{"a":[{"usage":1}],"b":"\"usage\":2","usage" : null }`,
		`{"usage":{"a":[1,{"b":"}"}]}}`,
	} {
		f.Add([]byte(seed), uint16(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		if !json.Valid(b) || bytes.Contains(b, []byte(`\u`)) {
			return
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(b, &m) != nil {
			return
		}
		object, _, repeats := naiveObjects(b)
		if !object || repeats {
			return
		}
		want, ok := m["usage"]
		var got [][]byte
		var a answerScan
		k := int(cut) % (len(b) + 1)
		done := func(v []byte) { got = append(got, append([]byte(nil), v...)) }
		a.feed(b[:k], done)
		a.feed(b[k:], done)
		switch {
		case !ok && len(got) != 0:
			t.Fatalf("%q cut at %d: found %q, encoding/json no usage", b, k, got)
		case ok && (len(got) != 1 || !bytes.Equal(got[0], want)):
			t.Fatalf("%q cut at %d: found %q, encoding/json %q", b, k, got, want)
		}
	})
}

// BenchmarkStrictJSON is the strict scan of a chat body of about 1 MB (a
// long conversation), beside encoding/json's Valid, the least its own
// reading of the body costs.
func BenchmarkStrictJSON(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","max_completion_tokens":256,"stream":true,"messages":[`)
	for i := range 2000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"role":"user","content":"` + strings.Repeat(`lorem ipsum \"dolor\" sit amet, café `, 12) + `"}`)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	b.Run("strict", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		s := new(strictJSON)
		for b.Loop() {
			if err := s.scan(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json-valid", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if !json.Valid(body) {
				b.Fatal("invalid")
			}
		}
	})
}
