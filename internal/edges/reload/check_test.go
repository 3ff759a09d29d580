package reload

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/rules"
)

// TestCheckFirstConfig: Check refuses the first config as it refuses a
// reload, so that a server cannot start with rules it would refuse later.
func TestCheckFirstConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	refused := errors.New("refused by the caller")
	var seen *rules.Config
	_, err := New(Config{Path: path, Check: func(c *rules.Config) error { seen = c; return refused }})
	if !errors.Is(err, refused) || seen == nil {
		t.Fatalf("New: %v (checked: %v), want the Check's error", err, seen != nil)
	}
	w, err := New(Config{Path: path, Check: func(*rules.Config) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	w.close()
}
