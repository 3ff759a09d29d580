package redisstore

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testsupport/secrettest"
)

// TestClientOptionHidesPasswords: for thousands of random passwords, in
// URLs and addresses of every form (valid or not, percent-encoded or
// not), the store either refuses the configuration with an error that
// shows no piece of the password, or takes it and dials only addresses
// that hold none: the errors of dialling them name them.
func TestClientOptionHidesPasswords(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 3000 {
		p := secrettest.New(r, false)
		for _, u := range secrettest.URLForms(p.Text) {
			cfg := Config{URL: u}
			if !strings.Contains(u, "://") {
				cfg = Config{Addrs: strings.Split(u, ",")}
			}
			opt, err := clientOption(cfg)
			if err != nil {
				if run := p.Shown(err.Error()); run != "" {
					t.Fatalf("password %q: %+v: error %q shows %q", p.Text, cfg, err, run)
				}
				continue
			}
			shown := strings.Join(opt.InitAddress, " ") + " " + opt.Sentinel.MasterSet
			if run := p.Shown(shown); run != "" {
				t.Fatalf("password %q: %+v: dials %q, which shows %q", p.Text, cfg, opt.InitAddress, run)
			}
		}
	}
}

// TestClientOptionRefusesAmbiguousURLs: a URL whose password would end
// elsewhere than its writer meant is refused, never dialled: an @ after
// the host, or a second @ before it (url.Parse ends the password at the
// last, so that the host after it would be dialled with the password).
func TestClientOptionRefusesAmbiguousURLs(t *testing.T) {
	for _, u := range []string{
		"redis://u:S3crPASS@127.0.0.1:1@evil/0",
		"redis://u:p@ss@127.0.0.1:1",
		"redis://:a/b@127.0.0.1:1",
		"rediss://u:p?q@127.0.0.1:1",
	} {
		_, err := clientOption(Config{URL: u})
		if err == nil {
			t.Errorf("%s: accepted", u)
			continue
		}
		for _, secret := range []string{"S3crPASS", "p@ss", "ss@", "a/b", "p?q"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("%s: the error %q shows %q", u, err, secret)
			}
		}
	}
	if _, err := clientOption(Config{URL: "redis://u:p%40ss@127.0.0.1:1/0"}); err != nil {
		t.Errorf("a percent-encoded @: %v", err)
	}
}
