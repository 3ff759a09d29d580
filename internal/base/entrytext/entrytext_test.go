package entrytext

import (
	"strings"
	"testing"
)

// FuzzRoundTrip: whatever the string and the separators escaped, the
// escaped text holds no separator (never a
// hex digit) and no "%" but its escapes, and reads
// back whole; a list of entries written as key=value pairs joined by "/"
// reads back as the same list.
func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"", "acme", "q/team=c", "100%", "%2F", "%zz", "a%", "k_*", "ü/✓=", "\x00\xff"} {
		f.Add(s, "q=c", "/=")
	}
	f.Fuzz(func(t *testing.T, key, value, special string) {
		special = strings.Map(func(r rune) rune {
			if r >= 0x80 || isHex(byte(r)) {
				return -1 // special holds ASCII separators, never hex digits
			}
			return r
		}, special)
		for _, s := range []string{key, value} {
			e := string(AppendEscaped(nil, s, special))
			if got := Unescape(e); got != s {
				t.Fatalf("Unescape(AppendEscaped(%q, %q)) = %q", s, special, got)
			}
			for i := 0; i < len(e); i++ {
				if strings.IndexByte(special, e[i]) >= 0 && e[i] != '%' {
					t.Fatalf("AppendEscaped(%q, %q) = %q holds %q", s, special, e, e[i])
				}
			}
		}
		entries := [][2]string{{key, value}, {value, key}, {"", ""}}
		var b []byte
		for i, e := range entries {
			if i > 0 {
				b = append(b, '/')
			}
			b = AppendEscaped(b, e[0], "/=")
			b = append(b, '=')
			b = AppendEscaped(b, e[1], "/=")
		}
		parts := strings.Split(string(b), "/")
		if len(parts) != len(entries) {
			t.Fatalf("%q: %d parts, want %d", b, len(parts), len(entries))
		}
		for i, p := range parts {
			k, v, ok := Cut(p)
			if !ok || k != entries[i][0] || v != entries[i][1] {
				t.Fatalf("%q part %d: %q=%q (%v), want %q", b, i, k, v, ok, entries[i])
			}
		}
	})
}

// TestUnescape: a "%" that escapes nothing reads as itself; hex digits
// of either case are read.
func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"50%off": "50%off", "%": "%", "a%2": "a%2", "%2f%2F": "//", "%25%32%46": "%2F", "%zz%41": "%zzA",
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
