package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestWriteCommand(t *testing.T) {
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	writeCommand(w, []any{"SET", "k", []byte("a\r\nb"), 42, int64(-7), uint64(8), 1.5, true, ""})
	w.Flush()
	want := "*9\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n$2\r\n42\r\n$2\r\n-7\r\n$1\r\n8\r\n$3\r\n1.5\r\n$1\r\n1\r\n$0\r\n\r\n"
	if b.String() != want {
		t.Fatalf("got %q\nwant %q", b.String(), want)
	}
}

func TestReadReply(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want any
	}{
		{"+OK\r\n", "OK"},
		{"-ERR bad\r\n", Error("ERR bad")},
		{":0\r\n", int64(0)},
		{":-12\r\n", int64(-12)},
		{"$5\r\nhello\r\n", "hello"},
		{"$0\r\n\r\n", ""},
		{"$4\r\na\r\nb\r\n", "a\r\nb"},
		{"$-1\r\n", nil},
		{"*-1\r\n", nil},
		{"*0\r\n", []any{}},
		{"*3\r\n:1\r\n$1\r\nx\r\n*2\r\n+a\r\n-MOVED 1 h:1\r\n", []any{int64(1), "x", []any{"a", Error("MOVED 1 h:1")}}},
	} {
		got, err := readReply(bufio.NewReader(strings.NewReader(tc.in)))
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: got %#v, want %#v", tc.in, got, tc.want)
		}
	}
}

func TestReadReplyErrors(t *testing.T) {
	for _, in := range []string{
		"",
		"\r\n",
		"+OK\n",
		"?x\r\n",
		":12a\r\n",
		"$3\r\nab\r\n",
		"$2\r\nabcd",
		"$-2\r\n",
		"$99999999999\r\n",
		"*2\r\n:1\r\n",
		"*-5\r\n",
		strings.Repeat("*1\r\n", maxDepth+2) + ":1\r\n",
	} {
		if v, err := readReply(bufio.NewReader(strings.NewReader(in))); err == nil {
			t.Errorf("%q: got %#v, want an error", in, v)
		}
	}
}

func TestErrorReply(t *testing.T) {
	var e Error
	if !errors.As(error(Error("NOAUTH x")), &e) || e.Error() != "NOAUTH x" {
		t.Fatalf("Error = %q", e)
	}
}

// FuzzReadReply checks that no input makes the reader panic or hang.
func FuzzReadReply(f *testing.F) {
	for _, s := range []string{"+OK\r\n", "$3\r\nabc\r\n", "*2\r\n:1\r\n$-1\r\n", "-ERR\r\n", "*1\r\n*1\r\n+x\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bufio.NewReader(bytes.NewReader(in))
		readReply(r)
	})
}
