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
