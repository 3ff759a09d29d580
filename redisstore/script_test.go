package redisstore

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/internal/testsupport/redistest"
)

// TestReadAnswers reads the forms of take.lua's answers as Redis sends
// them: six integers, two (allowed and committed), the string form (with
// the permits dropped), and a failed request's "!error" for each of its
// hits.
func TestReadAnswers(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{URL: srv.URL(), Heartbeat: -1}, nil)
	c := s.client.Load().c
	const script = "return {0, 5, 60, 7, 0, 0, -4, 60, '1 9007199254740993 60 0 0 1 2', '!boom', '!boom'}"
	msgs, err := c.Do(context.Background(), c.B().Eval().Script(script).Numkeys(0).Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	got := make([]answer, 3)
	used, err := readAnswers(msgs, 3, got)
	if err != nil || used != 9 {
		t.Fatalf("read %d messages, %v", used, err)
	}
	want := []answer{
		{v: [6]int64{0, 5, 60, 7, 0, 0}},
		{v: [6]int64{1, 3, 60, 0, 0, 1}},
		{v: [6]int64{1, 9007199254740993, 60, 0, 0, 1}, dropped: 2},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("answer %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	used, err = readAnswers(msgs[9:], 2, got)
	if re, ok := err.(*requestError); !ok || re.msg != "boom" || used != 2 {
		t.Errorf("a failed request: read %d messages, %v", used, err)
	}
	if _, err := readAnswers(msgs[:7], 2, got); err == nil {
		t.Error("a truncated answer read without error")
	}
}
