package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/edges/loadgen"
)

func init() {
	commands["nullserver"] = command{
		summary: "a rate limit service that answers OK at once",
		run: func(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
			return cmdNullServer(ctx, args, stderr)
		},
		help: func(lookupEnv) *help { h, _, _ := nullServerHelp(); return h },
	}
}

// nullServerHelp builds the flags of sluice nullserver.
func nullServerHelp() (h *help, grpcAddr, httpAddr *string) {
	h = newHelp("nullserver", "nullserver [--grpc-addr ADDR] [--http-addr ADDR]", `Serves envoy.service.ratelimit.v3.RateLimitService over gRPC and POST /json
over HTTP, answering every request OK at once, with one status per descriptor
shaped like a real answer. It decides nothing and keeps no state: run
"sluice bench" against it and against sluice serve, with the same flags, and
the difference is the work of sluice serve. Runs until interrupted.`)
	grpcAddr = h.fs.String("grpc-addr", "127.0.0.1:18081", "gRPC listen `address` (empty: no gRPC)")
	httpAddr = h.fs.String("http-addr", "127.0.0.1:18080", "HTTP listen `address` for POST /json (empty: no HTTP)")
	return h, grpcAddr, httpAddr
}

func cmdNullServer(ctx context.Context, args []string, stderr io.Writer) error {
	h, grpcAddr, httpAddr := nullServerHelp()
	if err := h.parse(args, false, stderr); err != nil {
		return err
	}
	if *grpcAddr == "" && *httpAddr == "" {
		fmt.Fprintln(stderr, "sluice nullserver: nothing to serve: both addresses are empty")
		return errUsage
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	if *grpcAddr != "" {
		lis, err := net.Listen("tcp", *grpcAddr)
		if err != nil {
			return err
		}
		s := grpc.NewServer()
		loadgen.RegisterNullServer(s)
		go func() { errc <- s.Serve(lis) }()
		defer s.GracefulStop()
		fmt.Fprintf(stderr, "nullserver: gRPC on %s\n", lis.Addr())
	}
	if *httpAddr != "" {
		lis, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			return err
		}
		// The HTTP server settings of sluice serve, so that a comparison
		// measures the work of sluice alone.
		hs := newHTTPServer(&loadgen.NullServer{}, slog.New(slog.NewTextHandler(stderr, nil)), defaultBodyTimeout)
		go func() { errc <- hs.Serve(lis) }()
		defer func() {
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer scancel()
			hs.Shutdown(sctx)
		}()
		fmt.Fprintf(stderr, "nullserver: HTTP on %s\n", lis.Addr())
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}
