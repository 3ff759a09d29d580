package overrides

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Change is one change of the overrides, as the store's log and the audit
// log record it.
type Change struct {
	Op     string    `json:"op"` // put or delete
	At     time.Time `json:"at"`
	By     string    `json:"by,omitempty"`
	Before *Override `json:"before,omitempty"`
	After  *Override `json:"after,omitempty"`
}

// FileStore keeps overrides in a local file, for one node (the embedded
// store): an append-only log of changes, each written and synced before
// the change is answered, replayed at open, and compacted (all live
// overrides written to a new file, synced, renamed over the log, and the
// directory synced) when it grows to twice what is live. A crash at any
// point loses no answered change: before the rename the old log is whole,
// after it the new one is.
type FileStore struct {
	path string
	idx  *Index
	now  func() time.Time

	liveSet
	f       *os.File
	entries int // lines in the log
}

// OpenFile opens (or creates) the store at path and loads it into idx.
// A torn last line (a crash while appending) is dropped; any other bad
// line is an error.
func OpenFile(path string, idx *Index, now func() time.Time) (*FileStore, error) {
	if now == nil {
		now = time.Now
	}
	s := &FileStore{path: path, idx: idx, now: now, liveSet: liveSet{live: map[string]*Override{}}}
	// A compaction that crashed before its rename leaves its temporary
	// file: the log is whole, the temporary file is not to be trusted.
	os.Remove(path + ".tmp")
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	// A last line without its newline is a torn append: kept if whole,
	// dropped if not (its change was never answered).
	torn := len(data) > 0 && data[len(data)-1] != '\n'
	lines := strings.SplitAfter(string(data), "\n")
	good := 0
	for i, line := range lines {
		body := strings.TrimSuffix(line, "\n")
		if strings.TrimSpace(body) == "" {
			good += len(line)
			continue
		}
		var c Change
		err := json.Unmarshal([]byte(body), &c)
		if err == nil {
			err = s.apply(&c)
		}
		if err != nil {
			if torn && i == len(lines)-1 {
				break
			}
			return nil, fmt.Errorf("overrides file %s, line %d: %w", path, i+1, err)
		}
		s.entries++
		good += len(line)
	}
	if good < len(data) {
		if err := os.Truncate(path, int64(good)); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	s.f = f
	if torn && good == len(data) {
		// The torn line was whole: end it, so that appends start anew.
		if _, err := f.Write([]byte("\n")); err != nil {
			f.Close()
			return nil, err
		}
	}
	return s, nil
}

// apply replays one change of the log.
func (s *FileStore) apply(c *Change) error {
	switch c.Op {
	case "put":
		if c.After == nil {
			return errors.New("put without an override")
		}
		if err := c.After.compile(false); err != nil {
			return err
		}
		s.live[c.After.ID()] = c.After
		s.idx.Put(c.After)
	case "delete":
		if c.Before == nil {
			return errors.New("delete without an override")
		}
		delete(s.live, c.Before.ID())
		s.idx.Delete(c.Before.Domain, c.Before.Path)
	default:
		return fmt.Errorf("unknown op %q", c.Op)
	}
	return nil
}

// Close closes the file.
func (s *FileStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f.Close()
}

// Put adds or replaces o (validated here), on behalf of by, and returns the
// change.
func (s *FileStore) Put(o *Override, by string) (*Change, error) {
	if err := o.Compile(); err != nil {
		return nil, err
	}
	o.Updated, o.UpdatedBy = s.now().UTC(), by
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &Change{Op: "put", At: o.Updated, By: by, Before: s.live[o.ID()], After: o}
	if err := s.append(c); err != nil {
		return nil, err
	}
	s.live[o.ID()] = o
	s.idx.Put(o)
	return c, s.maybeCompact()
}

// Delete removes the override of domain and path; the change is nil when
// there was none.
func (s *FileStore) Delete(domain string, path []Entry, by string) (*Change, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deleteLocked((&Override{Domain: domain, Path: path}).ID(), by)
}

func (s *FileStore) deleteLocked(id, by string) (*Change, error) {
	before := s.live[id]
	if before == nil {
		return nil, nil
	}
	c := &Change{Op: "delete", At: s.now().UTC(), By: by, Before: before}
	if err := s.append(c); err != nil {
		return nil, err
	}
	delete(s.live, id)
	s.idx.Delete(before.Domain, before.Path)
	return c, s.maybeCompact()
}

// Sweep deletes the overrides expired at now, and returns the changes.
func (s *FileStore) Sweep() ([]*Change, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Change
	for id, o := range s.live {
		if o.expired(now) {
			c, err := s.deleteLocked(id, "expiry")
			if err != nil {
				return out, err
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// append writes c to the log and syncs it.
func (s *FileStore) append(c *Change) error {
	line, err := json.Marshal(c)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	if _, err := s.f.Write(line); err != nil {
		return err
	}
	if err := s.f.Sync(); err != nil {
		return err
	}
	s.entries++
	return nil
}

// maybeCompact rewrites the log when it holds more than twice the live
// overrides (and at least 1,000 lines).
func (s *FileStore) maybeCompact() error {
	if s.entries < 1000 || s.entries < 2*len(s.live) {
		return nil
	}
	return s.compact(nil)
}

// compact writes every live override to a new log and renames it over the
// old one. beforeRename, when set (tests), runs between the two: a crash
// there must lose nothing.
func (s *FileStore) compact(beforeRename func()) error {
	tmp := s.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	ids := make([]string, 0, len(s.live))
	for id := range s.live {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		o := s.live[id]
		line, err := json.Marshal(&Change{Op: "put", At: o.Updated, By: o.UpdatedBy, After: o})
		if err != nil {
			f.Close()
			return err
		}
		w.Write(line)
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if beforeRename != nil {
		beforeRename()
	}
	if err := os.Rename(tmp, s.path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(s.path)); err == nil {
		d.Sync()
		d.Close()
	}
	nf, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	s.f.Close()
	s.f = nf
	s.entries = len(ids)
	return nil
}
