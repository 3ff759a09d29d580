package openai

import (
	"bytes"
	"fmt"
	"strconv"
)

// The inputs whose tokens the body's size bounds, and what Enforce refuses
// (unless AllowUnbounded): see Format.

// The kinds of content a message or an input may hold and still be
// bounded by the body's size: text.
var (
	textParts    = []string{"text", "input_text", "output_text", "refusal"}
	textPartKeys = []string{"type", "text", "refusal", "annotations", "logprobs", "cache_control", "citations", "prompt_cache_breakpoint"}
	textItems    = []string{"message", "function_call", "custom_tool_call"}
	outputItems  = []string{"function_call_output", "custom_tool_call_output"}
	clientTools  = []string{"function", "custom"}
	mediaKeys    = []string{"audio", "images", "image", "files", "file", "file_ids", "attachments"}
)

// unboundedOnce notes, when checking, the first reason the body's cost
// cannot be bounded.
func (rd *bodyRead) unboundedOnce(check bool, format string, args ...any) {
	if check && rd.unbounded == "" {
		rd.unbounded = fmt.Sprintf(format, args...)
	}
}

// stringIn reports whether the JSON value v is a string among names.
func stringIn(v []byte, names []string) bool {
	if len(v) < 2 || v[0] != '"' {
		return false
	}
	s := v[1 : len(v)-1]
	if bytes.IndexByte(s, '\\') >= 0 {
		d, err := decodeKey(s)
		if err != nil {
			return false
		}
		s = d
	}
	for _, n := range names {
		if string(s) == n {
			return true
		}
	}
	return false
}

// keyIn reports whether the raw key k names one of names, as a parser
// that folds case reads it.
func keyIn(k []byte, names []string) bool {
	for _, n := range names {
		if keyIs(k, n) {
			return true
		}
	}
	return false
}

// member finds the value of the member name of the object obj, as a parser
// that folds case finds it; nil when absent.
func member(obj []byte, name string) []byte {
	var got []byte
	eachMember(obj, func(k, v []byte) bool {
		if keyIs(k, name) {
			got = v
			return false
		}
		return true
	})
	return got
}

// where is the place of a message, an item or a part in a body, for a
// message: list[i].field[j], without .field when field is empty, without
// [j] when j < 0. It is made a string only to say what is refused.
type where struct {
	list  string
	i     int
	field string
	j     int
}

func (w where) String() string {
	s := w.list + "[" + strconv.Itoa(w.i) + "]"
	if w.field != "" {
		s += "." + w.field
	}
	if w.j >= 0 {
		s += "[" + strconv.Itoa(w.j) + "]"
	}
	return s
}

// checkMessages checks the messages of a chat: text only.
func (rd *bodyRead) checkMessages(v []byte) {
	if v[0] != '[' {
		rd.unboundedOnce(true, "messages is not a list")
		return
	}
	at := where{list: "messages", j: -1}
	eachElement(v, func(msg []byte) bool {
		rd.checkMessage(msg, at)
		at.i++
		return rd.unbounded == ""
	})
}

// checkMessage checks a message (or an input item that is one) at at:
// its content text, and nothing that carries media beside it.
func (rd *bodyRead) checkMessage(msg []byte, at where) {
	if msg[0] != '{' {
		rd.unboundedOnce(true, "%s is not an object", at)
		return
	}
	eachMember(msg, func(k, v []byte) bool {
		switch {
		case keyIs(k, "content"):
			at.field = "content"
			rd.checkContent(v, at)
		case string(v) != "null" && keyIn(k, mediaKeys):
			rd.unboundedOnce(true, "%s has %s", at, quoteKey(k))
		}
		return rd.unbounded == ""
	})
}

// checkContent checks a message's content (or a function call's output)
// at at: a string, or a list of text parts.
func (rd *bodyRead) checkContent(v []byte, at where) {
	switch v[0] {
	case '"', 'n':
	case '{':
		rd.checkPart(v, at)
	case '[':
		at.j = 0
		eachElement(v, func(part []byte) bool {
			switch part[0] {
			case '"':
			case '{':
				rd.checkPart(part, at)
			default:
				rd.unboundedOnce(true, "%s is not text", at)
			}
			at.j++
			return rd.unbounded == ""
		})
	default:
		rd.unboundedOnce(true, "%s is not text", at)
	}
}

// checkPart checks a part of a message's content at at: text, and nothing
// else.
func (rd *bodyRead) checkPart(part []byte, at where) {
	if typ := member(part, "type"); !stringIn(typ, textParts) {
		if typ == nil {
			typ = []byte("none")
		}
		rd.unboundedOnce(true, "%s is a part of type %s, not text", at, typ)
		return
	}
	eachMember(part, func(k, _ []byte) bool {
		if !keyIn(k, textPartKeys) {
			rd.unboundedOnce(true, "%s, a text part, has %s", at, quoteKey(k))
		}
		return rd.unbounded == ""
	})
}

// checkInput checks the input of a Responses (or embeddings) request:
// text, token IDs, messages, function calls and their outputs.
func (rd *bodyRead) checkInput(v []byte) {
	switch v[0] {
	case '"':
		return
	case '[':
	default:
		rd.unboundedOnce(true, "input is not text or a list")
		return
	}
	at := where{list: "input", j: -1}
	eachElement(v, func(item []byte) bool {
		switch item[0] {
		case '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		case '[': // token IDs
			eachElement(item, func(e []byte) bool {
				if e[0] == '{' || e[0] == '[' {
					rd.unboundedOnce(true, "%s is not text or token IDs", at)
				}
				return rd.unbounded == ""
			})
		case '{':
			typ := member(item, "type")
			switch {
			case typ == nil || stringIn(typ, textItems[:1]):
				rd.checkMessage(item, at)
			case stringIn(typ, textItems):
			case stringIn(typ, outputItems):
				if out := member(item, "output"); out != nil {
					o := at
					o.field = "output"
					rd.checkContent(out, o)
				}
			default:
				rd.unboundedOnce(true, "%s is an item of type %s", at, typ)
			}
		default:
			rd.unboundedOnce(true, "%s is not text", at)
		}
		at.i++
		return rd.unbounded == ""
	})
}

// checkTools checks the tools of a request: functions the client runs,
// not tools the API runs.
func (rd *bodyRead) checkTools(v []byte) {
	if v[0] != '[' {
		rd.unboundedOnce(true, "tools is not a list")
		return
	}
	i := 0
	eachElement(v, func(tool []byte) bool {
		if tool[0] != '{' {
			rd.unboundedOnce(true, "tools[%d] is not an object", i)
		} else if typ := member(tool, "type"); typ != nil && !stringIn(typ, clientTools) {
			rd.unboundedOnce(true, "tools[%d] is a tool of type %s, which the API runs", i, typ)
		}
		i++
		return rd.unbounded == ""
	})
}
