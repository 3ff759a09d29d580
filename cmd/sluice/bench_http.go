package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/edges/loadgen"
)

// The commands that measure sluice proxy: a plain reverse proxy, and an
// API that answers at once, for bench/proxy.sh.
func init() {
	commands["plainproxy"] = command{
		summary: "a reverse proxy that limits nothing, to compare with",
		run: func(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
			return cmdPlainProxy(ctx, args, stderr)
		},
		help: func(lookupEnv) *help { h, _, _ := plainProxyHelp(); return h },
	}
	commands["nullapi"] = command{
		summary: "an HTTP API that answers at once, to put behind proxies",
		run: func(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
			return cmdNullAPI(ctx, args, stderr)
		},
		help: func(lookupEnv) *help { h, _, _ := nullAPIHelp(); return h },
	}
}

// benchHTTPFlags adds sluice bench's flags of its HTTP mode.
func benchHTTPFlags(fs *flag.FlagSet, cfg *loadgen.Config) {
	fs.StringVar(&cfg.Path, "path", "/", "with --mode http: the `path` (and query) of each GET")
	fs.StringVar(&cfg.Header, "header", "", "with --mode http: the `header` that carries each request's key value (\"k0\" …, or \"hot\"); empty: no header, every request alike")
	fs.Func("body", "with --mode http: a JSON `body` to POST with each request instead of a GET", func(v string) error {
		cfg.Body = []byte(v)
		return nil
	})
}

// plainProxyHelp builds the flags of sluice plainproxy.
func plainProxyHelp() (h *help, listen, upstream *string) {
	h = newHelp("plainproxy", "plainproxy --upstream URL [--listen ADDR]", `Serves a plain httputil.ReverseProxy in front of --upstream: no limits, no
metrics, no forwarding headers (only SetURL), but the transport, flush
interval and HTTP server settings of sluice proxy. Run "sluice bench --mode
http" against it and against sluice proxy in front of the same upstream:
the difference is the work of sluice proxy. Runs until interrupted.`)
	listen = h.fs.String("listen", "127.0.0.1:18180", "`address` the proxy serves on")
	upstream = h.fs.String("upstream", "", "`URL` of the API behind the proxy; required")
	return h, listen, upstream
}

func cmdPlainProxy(ctx context.Context, args []string, stderr io.Writer) error {
	h, listen, upstream := plainProxyHelp()
	if err := h.parse(args, false, stderr); err != nil {
		return err
	}
	u, err := url.Parse(*upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		fmt.Fprintf(stderr, "sluice plainproxy: --upstream %q: want http:// or https:// and a host\n", *upstream)
		return errUsage
	}
	// proxy.Config's defaults: a clone of http.DefaultTransport keeping
	// 100 idle connections to the upstream, a flush after every write.
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 100
	log := slog.New(slog.NewTextHandler(stderr, nil))
	rp := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		Transport:     t,
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	// Its connections to the upstream are closed when it stops: one the
	// transport dialed but never used is, to the upstream, a new
	// connection, which its Shutdown waits 5 s for.
	defer t.CloseIdleConnections()
	return serveUntilDone(ctx, "plainproxy", *listen, newHTTPServer(rp, log, defaultBodyTimeout), stderr)
}

// nullBody is what sluice nullapi answers: a small JSON object.
var nullBody = []byte(`{"id":42,"name":"widget","price":"9.99","tags":["a","b"]}` + "\n")

// nullAPIHelp builds the flags of sluice nullapi.
func nullAPIHelp() (h *help, listen *string, oa *openAIFlags) {
	h = newHelp("nullapi", "nullapi [--listen ADDR] [--openai [--delay D]]", `Answers every request, whatever its method and path, 200 with the same small
JSON body (`+strconv.Itoa(len(nullBody))+` bytes, with its Content-Length) at once: the upstream
of bench/proxy.sh; with --openai, POST /v1/chat/completions and
/v1/completions answer as an OpenAI-compatible API. Runs until interrupted.`)
	h.more = `With --openai, POST /v1/chat/completions answers a chat.completion, or
with "stream": true a stream of chat.completion.chunk events, the last
with the usage when stream_options.include_usage is true; POST
/v1/completions answers a text_completion (not streamed); other paths
under /v1/ are 404. The usage is a stated function of the request:
prompt_tokens is, per message, 3 plus the bytes of its text divided by 4,
rounded up (per prompt of a completion, its bytes divided by 4, rounded
up, or its token IDs); completion_tokens is --completion-tokens, or the
request's max_completion_tokens or max_tokens if smaller (with
--lenient, the larger of the two), times n (a completion's: the larger
of n and best_of, times its prompts).`
	listen = h.fs.String("listen", "127.0.0.1:18280", "`address` to serve on")
	oa = &openAIFlags{}
	oa.add(h.fs)
	return h, listen, oa
}

func cmdNullAPI(ctx context.Context, args []string, stderr io.Writer) error {
	hp, listen, oa := nullAPIHelp()
	if err := hp.parse(args, false, stderr); err != nil {
		return err
	}
	if err := oa.check(hp.fs); err != nil {
		fmt.Fprintf(stderr, "sluice nullapi: %v\n", err)
		return errUsage
	}
	length := []string{strconv.Itoa(len(nullBody))}
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd["Content-Type"] = []string{"application/json"}
		hd["Content-Length"] = length
		w.Write(nullBody)
	})
	if oa.on {
		h = oa.api(h, stderr)
	}
	return serveUntilDone(ctx, "nullapi", *listen, newHTTPServer(withPid(h), slog.New(slog.NewTextHandler(stderr, nil)), defaultBodyTimeout), stderr)
}

// serveUntilDone serves hs on addr until ctx is done, then shuts it down.
func serveUntilDone(ctx context.Context, name, addr string, hs *http.Server, stderr io.Writer) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%s: HTTP on %s\n", name, lis.Addr())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(lis) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return hs.Shutdown(sctx)
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}
