package redistest

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// Error is an error reply from Redis, such as "ERR unknown command" or
// "MOVED 3999 127.0.0.1:7001". Inside an array (the replies of EXEC, for
// example) it appears as a value; as the whole reply it is returned as the
// error.
type Error string

func (e Error) Error() string { return string(e) }

// Dialer says how to reach a server. The zero value dials a plain TCP
// connection, sends no AUTH, and waits at most 5 seconds for the dial and
// for each command.
type Dialer struct {
	Username string      // ACL user; empty means the default user
	Password string      // sent with AUTH when not empty
	TLS      *tls.Config // nil means plain TCP
	Timeout  time.Duration
}

// Conn is one RESP2 connection: a command, then its reply, in turn. It is
// not safe for concurrent use.
type Conn struct {
	nc      net.Conn
	r       *bufio.Reader
	w       *bufio.Writer
	timeout time.Duration
}

// Dial connects to addr and authenticates when the dialer has a password.
func (d Dialer) Dial(addr string) (*Conn, error) {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	nd := &net.Dialer{Timeout: timeout}
	var nc net.Conn
	var err error
	if d.TLS != nil {
		nc, err = (&tls.Dialer{NetDialer: nd, Config: d.TLS}).Dial("tcp", addr)
	} else {
		nc, err = nd.Dial("tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	c := &Conn{nc: nc, r: bufio.NewReader(nc), w: bufio.NewWriter(nc), timeout: timeout}
	if d.Password != "" {
		args := []any{"AUTH", d.Password}
		if d.Username != "" {
			args = []any{"AUTH", d.Username, d.Password}
		}
		if _, err := c.Do(args...); err != nil {
			nc.Close()
			return nil, fmt.Errorf("AUTH: %w", err)
		}
	}
	return c, nil
}

// Do sends one command and reads its reply. Arguments are strings, []byte,
// integers, floats or bools (as 1 and 0); anything else is formatted with
// fmt.Sprint. A reply is a string (simple or bulk), an int64, nil (a null
// bulk string or array), an []any, or an [Error] inside an array; an error
// reply is returned as the error, of type [Error].
func (c *Conn) Do(args ...any) (any, error) {
	if err := c.nc.SetDeadline(time.Now().Add(c.timeout)); err != nil {
		return nil, err
	}
	writeCommand(c.w, args)
	if err := c.w.Flush(); err != nil {
		return nil, err
	}
	v, err := readReply(c.r)
	if err != nil {
		return nil, err
	}
	if e, ok := v.(Error); ok {
		return nil, e
	}
	return v, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }

// do dials, runs one command and closes.
func (d Dialer) do(addr string, args ...any) (any, error) {
	c, err := d.Dial(addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Do(args...)
}

// writeCommand buffers a command; the writer keeps any error for Flush.
func writeCommand(w *bufio.Writer, args []any) {
	fmt.Fprintf(w, "*%d\r\n", len(args))
	for _, a := range args {
		var s string
		switch a := a.(type) {
		case string:
			s = a
		case []byte:
			s = string(a)
		case int:
			s = strconv.Itoa(a)
		case int64:
			s = strconv.FormatInt(a, 10)
		case uint64:
			s = strconv.FormatUint(a, 10)
		case float64:
			s = strconv.FormatFloat(a, 'g', -1, 64)
		case bool:
			s = "0"
			if a {
				s = "1"
			}
		default:
			s = fmt.Sprint(a)
		}
		fmt.Fprintf(w, "$%d\r\n%s\r\n", len(s), s)
	}
}

// Bounds on what the reader accepts, so that a corrupt stream cannot make
// it allocate without limit.
const (
	maxBulk  = 512 << 20
	maxArray = 1 << 24
	maxDepth = 64
)

var errProtocol = errors.New("redistest: RESP protocol error")

func readReply(r *bufio.Reader) (any, error) { return readValue(r, 0) }

// readValue reads one RESP2 value, depth arrays deep: its type's first
// byte and the rest of its line, then what the type says follows.
func readValue(r *bufio.Reader, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("%w: nesting deeper than %d", errProtocol, maxDepth)
	}
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	if len(line) == 0 {
		return nil, fmt.Errorf("%w: empty line", errProtocol)
	}
	// body is in r's buffer: read it before reading on.
	body := line[1:]
	switch line[0] {
	case '+':
		return string(body), nil
	case '-':
		return Error(body), nil
	case ':':
		n, err := strconv.ParseInt(string(body), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: integer %q", errProtocol, body)
		}
		return n, nil
	case '$':
		return readBulk(r, body)
	case '*':
		return readArray(r, body, depth)
	}
	return nil, fmt.Errorf("%w: unknown type %q", errProtocol, line[0])
}

// readBulk reads the bulk string of length head and the CRLF after it; a
// length of -1 is the null bulk string, nil.
func readBulk(r *bufio.Reader, head []byte) (any, error) {
	n, err := strconv.Atoi(string(head))
	if err != nil || n < -1 || n > maxBulk {
		return nil, fmt.Errorf("%w: bulk length %q", errProtocol, head)
	}
	if n == -1 {
		return nil, nil
	}
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	if buf[n] != '\r' || buf[n+1] != '\n' {
		return nil, fmt.Errorf("%w: bulk string not ended by CRLF", errProtocol)
	}
	return string(buf[:n]), nil
}

// readArray reads the head elements of an array that is depth arrays
// deep; a length of -1 is the null array, nil.
func readArray(r *bufio.Reader, head []byte, depth int) (any, error) {
	n, err := strconv.Atoi(string(head))
	if err != nil || n < -1 || n > maxArray {
		return nil, fmt.Errorf("%w: array length %q", errProtocol, head)
	}
	if n == -1 {
		return nil, nil
	}
	a := make([]any, 0, min(n, 1024))
	for range n {
		v, err := readValue(r, depth+1)
		if err != nil {
			return nil, err
		}
		a = append(a, v)
	}
	return a, nil
}

// readLine reads up to CRLF and returns the line without it.
func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		return nil, fmt.Errorf("%w: line longer than %d bytes", errProtocol, r.Size())
	}
	if err != nil {
		return nil, err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("%w: line not ended by CRLF", errProtocol)
	}
	return line[:len(line)-2], nil
}
