package proxy

import (
	"io"
	"sync/atomic"
)

// endedBody is the body of a request to the upstream that, once it has
// ended, answers every further read with io.EOF without reading the
// client's body again.
//
// The transport forwarding the body reads it once more after its
// Content-Length's worth, to check that nothing follows, on its own
// goroutine; net/http's HTTP/1 server drains and closes the client's
// request body when the response's header goes out. When the upstream had
// answered by then (a stream's first event) and the transport's goroutine
// had not yet made that last read (on a busy machine), the read found the
// body closed and failed, and the transport closed the connection to the
// upstream in the middle of the response: the client had the first event
// only. The body had ended; its end is all that read needs to hear again.
//
// It wraps the outgoing request's body (ReverseProxy's copy), never the
// client's request: the server reads the type of that one's body to
// decide whether the connection may serve another request.
//
// (Full duplex, http.ResponseController.EnableFullDuplex, would keep the
// server off the body instead, but then the server no longer closes a
// connection whose request body was not read to its end, and reads the
// rest of it after the handler returns, racing its read of the next
// request.)
type endedBody struct {
	io.ReadCloser
	ended atomic.Bool
}

func (b *endedBody) Read(p []byte) (int, error) {
	if b.ended.Load() {
		return 0, io.EOF
	}
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.ended.Store(true)
	}
	return n, err
}
