package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/fault"
	"github.com/sluicehq/sluice/internal/base/redact"
	"github.com/sluicehq/sluice/internal/stores/breaker"
)

// Connecting: the client's options from a Config, the connection made in
// the background while Redis is down, and the health that reports it.

// clientOption turns cfg into rueidis options. Its errors show a URL
// or an address with its userinfo masked (redact.Value), and never the
// piece of a URL that a parser quotes, which may be part of a password.
func clientOption(cfg Config) (rueidis.ClientOption, error) {
	var opt rueidis.ClientOption
	switch {
	case cfg.URL != "":
		if err := checkURL(cfg.URL); err != nil {
			return opt, err
		}
		o, err := rueidis.ParseURL(cfg.URL)
		if err != nil {
			return opt, fmt.Errorf("redisstore: bad URL %q: %s", redact.Value(cfg.URL), redact.URLError(err))
		}
		opt = o
	case len(cfg.Addrs) > 0:
		opt.InitAddress = cfg.Addrs
	default:
		return opt, errors.New("redisstore: no URL and no addresses")
	}
	for _, a := range opt.InitAddress {
		if opt.DialCtxFn == nil && strings.Contains(a, "@") {
			// The store would dial it, and its errors would name it; a
			// password with a comma is cut in two by a list of
			// addresses: name none of them.
			return opt, errors.New("redisstore: an address has an @ in it: give a user and password in a redis:// URL, or as Username and Password")
		}
	}
	for _, a := range opt.InitAddress {
		if opt.DialCtxFn != nil {
			if a == "" {
				return opt, errors.New("redisstore: a unix:// URL needs a socket path")
			}
			break
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return opt, fmt.Errorf("redisstore: address %q is not host:port", redact.Value(a))
		}
	}
	if cfg.SentinelMaster != "" {
		opt.Sentinel.MasterSet = cfg.SentinelMaster
	}
	if cfg.Username != "" {
		opt.Username = cfg.Username
	}
	if cfg.Password != "" {
		opt.Password = cfg.Password
	}
	if cfg.DB != 0 {
		opt.SelectDB = cfg.DB
	}
	if cfg.TLS != nil {
		opt.TLSConfig = cfg.TLS
	}
	if opt.Sentinel.MasterSet != "" {
		opt.Sentinel.Username, opt.Sentinel.Password = opt.Username, opt.Password
		if cfg.SentinelUsername != "" || cfg.SentinelPassword != "" {
			opt.Sentinel.Username, opt.Sentinel.Password = cfg.SentinelUsername, cfg.SentinelPassword
		}
		opt.Sentinel.TLSConfig = opt.TLSConfig
	}
	opt.DisableCache = true // no client-side caching: no CLIENT TRACKING
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	opt.Dialer.Timeout = cfg.DialTimeout
	if opt.Dialer.Timeout <= 0 {
		opt.Dialer.Timeout = min(timeout, DefaultDialTimeout)
	}
	// Silence, not slowness, fails a call. rueidis watches each
	// connection: when it has had no reply for Dialer.KeepAlive, it sends
	// a PING, and closes the connection (failing its calls) when that has
	// no answer within ConnWriteTimeout. Calls carry no deadline of their
	// own (see Store.ctx), so a busy Redis, or a busy node, only makes
	// them slower.
	opt.Dialer.KeepAlive = max(timeout/2, time.Millisecond)
	opt.ConnWriteTimeout = timeout
	return opt, nil
}

// checkURL refuses a URL that url.Parse refuses, or whose password
// would not end where its writer meant: an '@' after the host (in the
// path, the query or the fragment) is the end of a password that holds
// a '/', '?' or '#' not percent-encoded, which would otherwise be taken
// for a host, a database or a query, dialled, and named in errors.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		msg := redact.URLError(err)
		if msg == "invalid userinfo" {
			// A password straight from a password manager: a quote, a
			// space, a backslash...
			msg += `: percent-encode the password's characters other than letters, digits and -._~!$&'()*+,;= (a " is %22, a space %20), or give the password alone (--redis-password, SLUICE_REDIS_PASSWORD)`
		}
		return fmt.Errorf("redisstore: bad URL %q: %s", redact.Value(raw), msg)
	}
	if strings.Contains(u.Opaque+u.EscapedPath()+u.RawQuery+u.EscapedFragment(), "@") {
		return fmt.Errorf("redisstore: bad URL %q: an @ after its host: percent-encode a password's /, ?, # and @ (%%2F, %%3F, %%23, %%40)", redact.Value(raw))
	}
	// Two '@' before the path: url.Parse ends the password at the last,
	// so that redis://u:pw@host:1@other dials other with "pw@host:1".
	if _, rest, ok := strings.Cut(raw, "://"); ok {
		if i := strings.IndexAny(rest, "/?#"); i >= 0 {
			rest = rest[:i]
		}
		if strings.Count(rest, "@") > 1 {
			return fmt.Errorf("redisstore: bad URL %q: an @ in its password: percent-encode a password's /, ?, # and @ (%%2F, %%3F, %%23, %%40)", redact.Value(raw))
		}
	}
	return nil
}

func (s *Store) connect() error {
	c, err := rueidis.NewClient(s.opt)
	if err != nil {
		return err
	}
	cn := &conn{c: c, cluster: c.Mode() == rueidis.ClientModeCluster, owned: true}
	// Load the library now, so that the first request does not wait for
	// it; if this fails, the first call loads it.
	ctx, cancel := context.WithTimeout(context.Background(), s.opt.Dialer.Timeout)
	if err := s.load(ctx, cn); err != nil {
		s.log.Warn("redis: could not load the function library; the first request will try again", "err", err)
	}
	cancel()
	s.client.Store(cn)
	s.lastErr.Store(nil)
	s.log.Info("connected to redis", "mode", string(c.Mode()), "addrs", s.opt.InitAddress)
	return nil
}

// reconnect retries connect with backoff until it succeeds or Close.
func (s *Store) reconnect() {
	defer close(s.done)
	wait := 100 * time.Millisecond
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(wait):
		}
		err := s.connect()
		if err == nil {
			return
		}
		s.setErr(err)
		if wait >= 5*time.Second {
			// Every 5s at most: a configuration that can never work
			// (a wrong password, a bad TLS setting) stays visible.
			s.log.Warn("redis still not reachable; retrying", "err", err)
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func (s *Store) setErr(err error) {
	s.lastErr.Store(&err)
}

// Health says whether the store can decide (see sluice.Store): nil while Redis answers, the
// reason otherwise. It does no I/O.
func (s *Store) Health() error {
	if s.client.Load() == nil {
		return s.notConnected()
	}
	if st := s.br.State(); st != breaker.Closed {
		return fmt.Errorf("%w: circuit breaker %s", ErrUnavailable, st)
	}
	return nil
}

// notConnected is the error of a call made before the store connected.
// It wraps fault.ErrNeverConnected: once connected, the store keeps its
// client, and a lost connection fails calls in other ways.
func (s *Store) notConnected() error {
	if p := s.lastErr.Load(); p != nil {
		return fmt.Errorf("%w: not connected: %w: %v", ErrUnavailable, fault.ErrNeverConnected, *p)
	}
	return fmt.Errorf("%w: not connected: %w", ErrUnavailable, fault.ErrNeverConnected)
}
