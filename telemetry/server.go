package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ServerOptions configures the HTTP endpoints on the metrics address.
type ServerOptions struct {
	// Ready reports why the agent is not ready (nil: ready). /readyz calls it.
	Ready func(ctx context.Context) error
	// Storage checks that storage answers (nil: it does); /healthz/storage
	// calls it. It is never part of /readyz.
	Storage func(ctx context.Context) error
	// Pprof mounts net/http/pprof under /debug/pprof/.
	Pprof bool
	// Page renders the status page served at /; nil serves none.
	Page   func(w io.Writer, v View) error
	Logger *slog.Logger
}

// Handler serves /metrics (Prometheus), /healthz (the process is alive),
// /readyz (Ready says the socket serves), /healthz/storage (Storage says
// storage answers) and / (the status page, when o.Page is set).
func (t *Telemetry) Handler(o ServerOptions) http.Handler {
	mux := http.NewServeMux()
	if t != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(t.Registry, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if o.Ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
			defer cancel()
			if err := o.Ready(ctx); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("GET /healthz/storage", func(w http.ResponseWriter, r *http.Request) {
		if o.Storage != nil {
			ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
			defer cancel()
			if err := o.Storage(ctx); err != nil {
				http.Error(w, "storage down: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "storage ok")
	})
	if o.Page != nil {
		mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:")
			t.refreshJobForPage(r.Context())
			if err := o.Page(w, t.View()); err != nil && o.Logger != nil {
				o.Logger.Warn("status page", "err", err)
			}
		})
	}
	if o.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Serve listens on addr and serves Handler until ctx is done.
func (t *Telemetry) Serve(ctx context.Context, addr string, o ServerOptions) (net.Addr, <-chan error, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics address %s: %w", addr, err)
	}
	srv := &http.Server{Handler: t.Handler(o), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() {
		err := srv.Serve(l)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		done <- err
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	return l.Addr(), done, nil
}
