package simulate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// MaxLineBytes bounds one line of a trace.
const MaxLineBytes = 1 << 20

// Event is one line of a trace: an Envoy RLS v3 request at a time.
type Event struct {
	Line    int                     // 1-based line number in the trace
	At      time.Time               // when the request arrives
	RawAt   json.RawMessage         // "at" as written, echoed in the output
	Request *rlsv3.RateLimitRequest // the request, as protobuf
}

// LineError is a problem with one line of a trace.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// ReadTrace reads a whole JSON-lines trace: one Envoy RateLimitRequest in
// protobuf JSON per line plus "at" (an RFC 3339 time, or Unix milliseconds).
// Blank lines are skipped. It reads everything before returning, so that a
// malformed line anywhere fails the run before any decision is made; the
// error lists every malformed line (up to maxErrors).
func ReadTrace(r io.Reader, validate func(*rlsv3.RateLimitRequest) error) ([]Event, error) {
	const maxErrors = 20
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxLineBytes)
	var (
		events []Event
		errs   []error
		line   int
	)
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		ev, err := parseLine(text, validate)
		if err != nil {
			errs = append(errs, &LineError{Line: line, Err: err})
			if len(errs) == maxErrors {
				errs = append(errs, errors.New("too many errors; stopped reading"))
				return nil, errors.Join(errs...)
			}
			continue
		}
		ev.Line = line
		events = append(events, ev)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			err = fmt.Errorf("line longer than %d bytes", MaxLineBytes)
		}
		errs = append(errs, &LineError{Line: line + 1, Err: err})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return events, nil
}

func parseLine(text []byte, validate func(*rlsv3.RateLimitRequest) error) (Event, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(text, &fields); err != nil {
		return Event{}, fmt.Errorf("not a JSON object: %v", err)
	}
	rawAt, ok := fields["at"]
	if !ok {
		return Event{}, errors.New(`missing "at" (an RFC 3339 time or Unix milliseconds)`)
	}
	at, err := parseAt(rawAt)
	if err != nil {
		return Event{}, err
	}
	delete(fields, "at")
	rest, err := json.Marshal(fields)
	if err != nil {
		return Event{}, err
	}
	req := new(rlsv3.RateLimitRequest)
	if err := protojson.Unmarshal(rest, req); err != nil {
		return Event{}, fmt.Errorf("not a RateLimitRequest: %v", err)
	}
	if validate != nil {
		if err := validate(req); err != nil {
			return Event{}, err
		}
	}
	return Event{At: at, RawAt: rawAt, Request: req}, nil
}

// parseAt reads "at": a JSON string in RFC 3339, or a JSON integer of Unix
// milliseconds.
func parseAt(raw json.RawMessage) (time.Time, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return time.Time{}, fmt.Errorf(`"at": %q is not an RFC 3339 time`, s)
		}
		return t, nil
	}
	ms, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf(`"at": %s is neither an RFC 3339 string nor integer Unix milliseconds`, raw)
	}
	const maxMs = 1 << 53 // far beyond any real date, still exact
	if ms < 0 || ms > maxMs {
		return time.Time{}, fmt.Errorf(`"at": %d milliseconds is out of range`, ms)
	}
	return time.UnixMilli(ms).UTC(), nil
}
