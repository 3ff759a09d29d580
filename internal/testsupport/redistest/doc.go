// Package redistest starts real Redis servers for tests: a standalone
// server, a Redis Cluster of several local processes, and a Sentinel setup,
// each on free 127.0.0.1 ports, torn down when the test ends. Tests of the
// Redis store talk to these, never to a mock.
//
//	srv := redistest.Standalone(t)             // redis-server, no persistence
//	client := newClient(srv.Addr())            // or srv.URL()
//	srv.Kill()                                 // an outage ...
//	srv.Restart()                              // ... and the same port back
//
//	c := redistest.Cluster(t, 3, 0)            // 3 masters, all slots covered
//	s := redistest.Sentinel(t)                 // master, replica, 3 sentinels
//	s.Failover()
//
// It needs redis-server, redis-cli and redis-sentinel (Redis 7.0 or later)
// on PATH; scripts/test installs them from Debian packages. Without them a
// test fails when the environment variable CI is true and skips otherwise
// ([Require]).
//
// Every wait has a deadline; servers run in their own process groups, are
// killed on cleanup even when the test failed or panicked, and are killed
// by the kernel if the test binary dies first (Linux). Each server logs
// into its temporary directory; when a test fails, the end of every log is
// written to the test's output.
//
// For talking to the servers without a client library, [Conn] is a minimal
// RESP2 client. The package uses the standard library only; it must not
// import sluice's packages, so that any of them can use it in tests.
package redistest
