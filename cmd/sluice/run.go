package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// endpoint is one listener of a command and the server on it.
type endpoint struct {
	name, addr string
	http       *http.Server // one of http and grpc
	grpc       *grpc.Server
}

// rulesSource keeps the rules in step with where they come from: a
// reload.Watcher (files) or an xdsrules.Client (an xDS server).
type rulesSource interface {
	Run(ctx context.Context) error
	Reload()
}

// runSettings are what sluice serve and sluice proxy share of a run:
// their listeners, their rules watcher, and how they drain and stop.
type runSettings struct {
	endpoints       []endpoint
	watcher         rulesSource
	ready           func()        // logs that the command is ready; called once serving
	drain           func()        // starts failing readiness (at SIGTERM, SIGINT or a failed listener)
	drainDelay      time.Duration // how long to keep serving, not ready, before stopping
	shutdownTimeout time.Duration // how long in-flight requests may take to finish
	log             *slog.Logger

	lns []net.Listener // by listen, one an endpoint
}

// checkConfig fails when --config names nothing that can be read, so
// that a command stops on it before it logs that it starts.
func checkConfig(path string) error {
	if _, err := os.Stat(path); err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("--config %s: %w", path, err)
	}
	return nil
}

// listen listens on every address before any is served, so that a taken
// port fails the start rather than half of the command. On error it has
// closed what it opened.
func (rs *runSettings) listen() error {
	for _, e := range rs.endpoints {
		ln, err := listenOn(e.addr)
		if err != nil {
			rs.closeListeners()
			return fmt.Errorf("%s listener: %w", e.name, err)
		}
		rs.lns = append(rs.lns, ln)
		rs.log.Info("listening", "listener", e.name, "addr", ln.Addr().String())
	}
	return nil
}

// listenOn listens on a TCP host:port, or on a Unix socket for
// unix:PATH (envoy-rl's GRPC_UDS). A socket file left by a process that
// is gone (nothing accepts on it) is replaced; one in use is not.
func listenOn(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		return net.Listen("tcp", addr)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen unix %s: a process is serving on it", path)
		}
		os.Remove(path)
	}
	return net.Listen("unix", path)
}

func (rs *runSettings) closeListeners() {
	for _, ln := range rs.lns {
		ln.Close()
	}
	rs.lns = nil
}

// serve serves the listeners of listen; runs the rules watcher; then, when
// ctx is done or a listener fails (SIGHUP reloads the rules meanwhile),
// drains: readiness fails, drainDelay passes, the watcher stops, and the
// servers finish their requests within shutdownTimeout before what is left
// is closed. It returns the error of a failed listener, or nil.
func (rs *runSettings) serve(ctx context.Context) error {
	defer rs.closeListeners()
	lns := rs.lns

	failed := make(chan error, len(rs.endpoints))
	var wg sync.WaitGroup
	for i, e := range rs.endpoints {
		wg.Go(func() {
			var err error
			if e.grpc != nil {
				err = e.grpc.Serve(lns[i])
			} else {
				err = e.http.Serve(lns[i])
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				failed <- fmt.Errorf("%s listener: %w", e.name, err)
			}
		})
	}
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	wg.Go(func() {
		if err := rs.watcher.Run(watchCtx); err != nil {
			rs.log.Error("rules watcher stopped; the rules are no longer reloaded", "err", err)
		}
	})
	rs.ready()

	runErr := waitForStop(ctx, failed, rs.watcher.Reload, rs.log)
	rs.drain()
	if rs.drainDelay > 0 {
		time.Sleep(rs.drainDelay)
	}
	stopWatch()
	rs.shutdown()
	wg.Wait()
	return runErr
}

// shutdown stops the listeners and waits for in-flight requests, at most
// shutdownTimeout; then it closes what is left.
func (rs *runSettings) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), rs.shutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, e := range rs.endpoints {
		if gs := e.grpc; gs != nil {
			wg.Go(func() {
				done := make(chan struct{})
				go func() { gs.GracefulStop(); close(done) }()
				select {
				case <-done:
				case <-ctx.Done():
					rs.log.Warn("gRPC requests still running at the shutdown timeout; closing them")
					gs.Stop()
					<-done
				}
			})
			continue
		}
		hs := e.http
		wg.Go(func() {
			if err := hs.Shutdown(ctx); err != nil {
				rs.log.Warn("HTTP requests still running at the shutdown timeout; closing them", "err", err)
				hs.Close()
			}
		})
	}
	wg.Wait()
}
