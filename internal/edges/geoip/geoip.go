// Package geoip answers a client address's country or autonomous system
// number from a MaxMind-format database file (GeoLite2-Country,
// GeoIP2-Country, GeoLite2-City, GeoLite2-ASN, DB-IP's mmdb files), and
// keeps the answer current while the file is replaced.
//
// A [DB] holds one file in memory. A lookup (DB.Country, DB.ASN) at most
// once every Options.CheckEvery starts a check of the file in the
// background: when its identity, size or modification time changed (a
// geoipupdate run renames a new file over it; a copy rewrites it), the new
// file is read, verified and swapped in atomically. A file that cannot be
// read, does not verify, or does not hold the field the DB was opened for
// is refused with one logged error, and the database in force keeps
// answering. Lookups never wait for a check: they read the database in
// force through an atomic pointer.
//
// An address the database does not know, a private, loopback, link-local
// or otherwise non-global address, and an invalid one have no value: "".
//
// This package imports maxminddb-golang and the standard library; it must
// not import httplimit (its Locator is satisfied structurally), stores or
// transports.
package geoip

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oschwald/maxminddb-golang/v2"
)

// Field is what a database answers for an address.
type Field uint8

// The fields a DB can be opened for.
const (
	// Country is the ISO 3166-1 alpha-2 code of the country the address
	// is in (country.iso_code), upper-case: "DE".
	Country Field = 1 << iota
	// ASN is the number of the autonomous system that announces the
	// address (autonomous_system_number), in decimal: "3320".
	ASN
)

// String names the field as the rules file does.
func (f Field) String() string {
	switch f {
	case Country:
		return "country"
	case ASN:
		return "asn"
	}
	return "field(" + strconv.Itoa(int(f)) + ")"
}

// path is where the field is in a record.
func (f Field) path() []any {
	if f == ASN {
		return []any{"autonomous_system_number"}
	}
	return []any{"country", "iso_code"}
}

// MaxFileSize is the largest database file read, in bytes.
const MaxFileSize = 1 << 30

// DefaultCheckEvery is how often the file is checked for a change when
// Options.CheckEvery is zero.
const DefaultCheckEvery = 10 * time.Second

// sample is how many networks of a new file are read to see that it holds
// the fields it is opened for.
const sample = 1024

// Options configures Open. Zero fields mean the default in their comment.
type Options struct {
	// CheckEvery is the least time between two checks of the file for a
	// change. Zero means DefaultCheckEvery; a negative value never checks.
	CheckEvery time.Duration

	// Logger receives the reloads and the refused files. Nil discards;
	// SetLogger changes it later.
	Logger *slog.Logger
}

// DB is one database file, reloaded when it changes; see the package
// documentation. It is safe for concurrent use.
type DB struct {
	path     string
	fields   Field
	every    time.Duration
	cur      atomic.Pointer[loaded]
	log      atomic.Pointer[slog.Logger]
	next     atomic.Int64 // Unix nanoseconds of the next check
	checking atomic.Bool
	mu       sync.Mutex // serializes checks; guards refused and missing
	refused  fileStamp  // the last file refused
	missing  bool       // the file could not be stat'ed at the last check
}

// loaded is one read of the file.
type loaded struct {
	r     *maxminddb.Reader
	stamp fileStamp
}

// fileStamp tells whether a file changed since it was read.
type fileStamp struct {
	info os.FileInfo
	size int64
	mod  time.Time
}

func stampOf(fi os.FileInfo) fileStamp {
	return fileStamp{info: fi, size: fi.Size(), mod: fi.ModTime()}
}

// same reports whether a and b are the same file, unchanged.
func (a fileStamp) same(b fileStamp) bool {
	return a.info != nil && b.info != nil && os.SameFile(a.info, b.info) && a.size == b.size && a.mod.Equal(b.mod)
}

// Open reads the database file at path and checks that it holds fields
// (Country, ASN or both): an error says why it cannot be used, and nothing
// is kept open.
func Open(path string, fields Field, opts Options) (*DB, error) {
	if fields == 0 || fields&^(Country|ASN) != 0 {
		return nil, fmt.Errorf("geoip: invalid fields %d", fields)
	}
	db := &DB{path: path, fields: fields, every: opts.CheckEvery}
	if db.every == 0 {
		db.every = DefaultCheckEvery
	}
	db.SetLogger(opts.Logger)
	l, err := db.read()
	if err != nil {
		return nil, err
	}
	db.cur.Store(l)
	if db.every > 0 {
		db.next.Store(time.Now().Add(db.every).UnixNano())
	}
	return db, nil
}

// SetLogger sets where reloads and refused files are logged; nil discards.
func (db *DB) SetLogger(l *slog.Logger) {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	db.log.Store(l)
}

// Path is the file's path as given to Open.
func (db *DB) Path() string { return db.path }

// Type is the database_type of the database in force: "GeoLite2-Country".
func (db *DB) Type() string { return db.cur.Load().r.Metadata.DatabaseType }

// read reads and verifies the file.
func (db *DB) read() (*loaded, error) {
	fi, err := os.Stat(db.path)
	if err != nil {
		return nil, fmt.Errorf("geoip: %w", err)
	}
	l := &loaded{stamp: stampOf(fi)}
	if !fi.Mode().IsRegular() {
		return l, fmt.Errorf("geoip: %s is not a regular file", db.path)
	}
	if fi.Size() > MaxFileSize {
		return l, fmt.Errorf("geoip: %s is larger than %d bytes", db.path, MaxFileSize)
	}
	data, err := os.ReadFile(db.path)
	if err != nil {
		return l, fmt.Errorf("geoip: %w", err)
	}
	// Held in memory, not mapped: a reader swapped out is freed by the
	// collector once no lookup holds it, and a file rewritten in place
	// never changes a database in force.
	r, err := maxminddb.OpenBytes(data)
	if err != nil {
		return l, fmt.Errorf("geoip: %s is not a MaxMind database: %w", db.path, err)
	}
	if err := r.Verify(); err != nil {
		return l, fmt.Errorf("geoip: %s is corrupt: %w", db.path, err)
	}
	for _, f := range []Field{Country, ASN} {
		if db.fields&f != 0 && !holds(r, f) {
			return l, fmt.Errorf("geoip: %s (%s) holds no %s in its first %d networks: not %s database",
				db.path, r.Metadata.DatabaseType, pathText(f), sample, noun(f))
		}
	}
	l.r = r
	return l, nil
}

func noun(f Field) string {
	if f == ASN {
		return "an ASN"
	}
	return "a country"
}

func pathText(f Field) string {
	if f == ASN {
		return "autonomous_system_number"
	}
	return "country.iso_code"
}

// holds reports whether some of r's first networks have a value of f.
func holds(r *maxminddb.Reader, f Field) bool {
	n := 0
	for res := range r.Networks() {
		if value(res, f) != "" {
			return true
		}
		if n++; n == sample {
			break
		}
	}
	return false
}

// value decodes f from a lookup's result; "" when it has none.
func value(res maxminddb.Result, f Field) string {
	if !res.Found() {
		return ""
	}
	if f == ASN {
		var n uint64
		if res.DecodePath(&n, f.path()...) != nil || n == 0 {
			return ""
		}
		return strconv.FormatUint(n, 10)
	}
	var s string
	if res.DecodePath(&s, f.path()...) != nil || len(s) != 2 || !letter(s[0]) || !letter(s[1]) {
		return ""
	}
	if s[0] >= 'a' || s[1] >= 'a' {
		return strings.ToUpper(s)
	}
	return s
}

// letter reports whether c is an ASCII letter.
func letter(c byte) bool { return 'a' <= c|0x20 && c|0x20 <= 'z' }

// Country is the upper-case ISO code of the country of addr, or "" (see
// the package documentation). The DB must have been opened for Country.
func (db *DB) Country(addr netip.Addr) string { return db.lookup(addr, Country) }

// ASN is the autonomous system number of addr in decimal, or "". The DB
// must have been opened for ASN.
func (db *DB) ASN(addr netip.Addr) string { return db.lookup(addr, ASN) }

func (db *DB) lookup(addr netip.Addr, f Field) string {
	db.maybeCheck()
	if db.fields&f == 0 {
		return ""
	}
	addr = addr.WithZone("").Unmap()
	if !addr.IsValid() || !addr.IsGlobalUnicast() || addr.IsPrivate() {
		return ""
	}
	return value(db.cur.Load().r.Lookup(addr), f)
}

// Locator is the lookup of one field of a DB, with the method
// httplimit.Locator asks for.
type Locator struct {
	db *DB
	f  Field
}

// Locator returns the lookup of f in db.
func (db *DB) Locator(f Field) Locator { return Locator{db: db, f: f} }

// Locate is the value of the field for addr, or "".
func (l Locator) Locate(addr netip.Addr) string { return l.db.lookup(addr, l.f) }

// maybeCheck starts a check of the file in the background when one is
// due and none is running.
func (db *DB) maybeCheck() {
	if db.every < 0 {
		return
	}
	now := time.Now().UnixNano()
	if now < db.next.Load() || !db.checking.CompareAndSwap(false, true) {
		return
	}
	db.next.Store(now + int64(db.every))
	go func() {
		defer db.checking.Store(false)
		db.check()
	}()
}

// ErrRefused is wrapped by Check's error when the changed file is refused
// and the database in force stays.
var ErrRefused = errors.New("geoip: changed database refused; the one in force stays")

// Check reads the file again if it changed, as a lookup does in the
// background when a check is due, and reports whether a new database was
// put in force. A file refused gives an error wrapping ErrRefused (logged
// once for each version of the file). Lookups go on answering meanwhile.
func (db *DB) Check() (bool, error) {
	return db.check()
}

func (db *DB) check() (bool, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	log := db.log.Load()
	cur := db.cur.Load()
	fi, err := os.Stat(db.path)
	if err != nil {
		if !db.missing {
			log.Error("geoip database file unreadable; the one in force stays", "path", db.path, "err", err)
		}
		db.missing = true
		return false, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	db.missing = false
	st := stampOf(fi)
	if st.same(cur.stamp) {
		db.refused = fileStamp{}
		return false, nil
	}
	if st.same(db.refused) {
		return false, fmt.Errorf("%w: %s unchanged since it was refused", ErrRefused, db.path)
	}
	l, err := db.read()
	if err != nil {
		// Remember the refused version only if it did not change while
		// it was read: a file caught half written is read again.
		if l != nil && l.stamp.same(st) {
			db.refused = st
		} else {
			db.refused = fileStamp{}
		}
		log.Error("geoip database refused; the one in force stays", "path", db.path, "err", err)
		return false, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	db.cur.Store(l)
	db.refused = fileStamp{}
	log.Info("geoip database loaded", "path", db.path, "type", l.r.Metadata.DatabaseType,
		"built", l.r.Metadata.BuildTime().UTC().Format(time.RFC3339))
	return true, nil
}
