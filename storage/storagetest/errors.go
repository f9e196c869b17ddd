package storagetest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/ckpt-io/ckpt/storage"
)

// Fault is what a Relay does with the requests it gets.
type Fault int

// Faults a Relay injects. They are the network's and the service's
// failures that a real server cannot be made to produce on demand.
const (
	Pass        Fault = iota // forward to the server
	Unavailable              // answer 503 Service Unavailable
	Throttle                 // answer 429 Too Many Requests
	Forbid                   // answer 403 Forbidden
	Reset                    // reset the connection (RST), no answer
	Hangup                   // close the connection (FIN), no answer
)

func (f Fault) String() string {
	return [...]string{"pass", "503", "429", "403", "reset", "hang-up"}[f]
}

// Relay is an HTTP relay on 127.0.0.1 in front of a real object-store
// server: it forwards requests as they are (the Host header the client
// signed included) until told to fail them.
type Relay struct {
	URL string // http://127.0.0.1:port, the endpoint to give the backend

	ln     net.Listener
	srv    *http.Server
	failed atomic.Int64
	once   sync.Once

	mu    sync.Mutex
	fault Fault
	left  int // requests still to fail; -1: until told otherwise
}

// next returns what to do with a request.
func (r *Relay) next() Fault {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.fault
	if r.left > 0 {
		if r.left--; r.left == 0 {
			r.fault = Pass
		}
	}
	return f
}

// NewRelay starts a relay to the server at target (http://host:port); it
// stops at the end of the test.
func NewRelay(t testing.TB, target string) *Relay {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatalf("relay target %q: %v", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{URL: "http://" + ln.Addr().String(), ln: ln}
	rp := httputil.NewSingleHostReverseProxy(u)
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		f := r.next()
		if f == Pass {
			rp.ServeHTTP(w, req)
			return
		}
		r.failed.Add(1)
		switch f {
		case Reset, Hangup:
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			if tc, ok := conn.(*net.TCPConn); ok && f == Reset {
				tc.SetLinger(0)
			}
			conn.Close()
		default:
			io.Copy(io.Discard, req.Body)
			status := map[Fault]int{Unavailable: 503, Throttle: 429, Forbid: 403}[f]
			w.WriteHeader(status)
		}
	})}
	go r.srv.Serve(ln)
	t.Cleanup(func() { r.srv.Close() })
	return r
}

// Set makes the relay treat the following requests so.
func (r *Relay) Set(f Fault) { r.FailNext(f, -1) }

// FailNext makes the relay treat the next n requests so, and pass the
// following ones (n < 0: all following ones).
func (r *Relay) FailNext(f Fault, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fault, r.left = f, n
	if n == 0 {
		r.fault = Pass
	}
}

// Failed returns how many requests the relay failed.
func (r *Relay) Failed() int64 { return r.failed.Load() }

// Stop closes the relay's port: connections to it are refused from then
// on, as by a server that is down.
func (r *Relay) Stop() { r.once.Do(func() { r.srv.Close() }) }

// Errors checks the error classes of the storage.Store contract on a
// backend reached through relay: open returns a store (an empty prefix)
// that sends its requests to relay.URL. A missing key and a refused
// conditional create are not transient; a 503, a reset or closed
// connection and a closed port are transient; a 429 is throttled and
// transient; a 403 is a permission refusal and not transient. The faults
// are injected on Create, which backends send without retries of their
// own (a retried conditional write cannot tell its own success from
// another writer's) or with few, so each check takes moments. It stops
// the relay at the end.
func Errors(t *testing.T, relay *Relay, open func(t *testing.T) storage.Store) {
	body := []byte("ckpt error classes")
	create := func(s storage.Store, key string) error {
		return s.Create(ctx(t), key, bytes.NewReader(body), int64(len(body)))
	}
	t.Run("a missing key is not found and not transient", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		_, err := s.Stat(ctx(t), "errors/missing")
		if !errors.Is(err, storage.ErrNotFound) || storage.IsTransient(err) || storage.IsPermissionDenied(err) {
			t.Fatalf("stat of a missing key: %v (transient %v); want ErrNotFound, not transient", err, storage.IsTransient(err))
		}
		_, err = s.Get(ctx(t), "errors/missing")
		if !errors.Is(err, storage.ErrNotFound) || storage.IsTransient(err) {
			t.Fatalf("get of a missing key: %v (transient %v); want ErrNotFound, not transient", err, storage.IsTransient(err))
		}
	})
	t.Run("a refused conditional create is exists and not transient", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		if err := create(s, "errors/taken"); err != nil {
			t.Fatal(err)
		}
		err := create(s, "errors/taken")
		if !errors.Is(err, storage.ErrExists) || storage.IsTransient(err) || storage.IsPermissionDenied(err) {
			t.Fatalf("second create: %v (transient %v); want ErrExists, not transient", err, storage.IsTransient(err))
		}
	})
	for _, c := range []struct {
		fault                         Fault
		transient, throttled, refused bool
	}{
		{Unavailable, true, false, false},
		{Throttle, true, true, false},
		{Forbid, false, false, true},
		{Reset, true, false, false},
		{Hangup, true, false, false},
	} {
		t.Run(fmt.Sprintf("a %s answer is classified", c.fault), func(t *testing.T) {
			s := open(t)
			defer s.Close()
			relay.Set(c.fault)
			defer relay.Set(Pass)
			before := relay.Failed()
			err := create(s, "errors/"+c.fault.String())
			relay.Set(Pass)
			if relay.Failed() == before {
				t.Fatalf("the relay failed no request (create: %v)", err)
			}
			switch {
			case err == nil:
				t.Fatalf("create through a %s answer succeeded", c.fault)
			case errors.Is(err, storage.ErrExists) || errors.Is(err, storage.ErrNotFound):
				t.Fatalf("create through a %s answer: %v; a failed request is neither exists nor not found", c.fault, err)
			case storage.IsTransient(err) != c.transient:
				t.Errorf("create through a %s answer: %v: transient %v, want %v", c.fault, err, !c.transient, c.transient)
			}
			if storage.IsThrottled(err) != c.throttled {
				t.Errorf("create through a %s answer: %v: throttled %v, want %v", c.fault, err, !c.throttled, c.throttled)
			}
			if storage.IsPermissionDenied(err) != c.refused {
				t.Errorf("create through a %s answer: %v: permission denied %v, want %v", c.fault, err, !c.refused, c.refused)
			}
		})
	}
	t.Run("a closed port is transient", func(t *testing.T) {
		s := open(t)
		defer s.Close()
		relay.Stop()
		err := create(s, "errors/down")
		if err == nil || !storage.IsTransient(err) || storage.IsPermissionDenied(err) {
			t.Fatalf("create with the server's port closed: %v (transient %v); want a transient error", err, storage.IsTransient(err))
		}
	})
}

// ClassErrors are errors of each class of the storage.Store contract that
// carry no HTTP status: a boundary that passes errors on (the plugin
// boundary) must keep their class by itself. A store under test fails
// Stat("class/<name>") with ClassErrors[name]; see Crossed.
var ClassErrors = map[string]error{
	"transient":       fmt.Errorf("%w: busy", storage.ErrTransient),
	"throttled":       fmt.Errorf("%w: slow down", storage.ErrThrottled),
	"throttled-400":   fmt.Errorf("%w: %w", storage.ErrThrottled, &storage.HTTPError{Status: 400, Err: errors.New("bad request")}),
	"denied":          fmt.Errorf("%w: no role", storage.ErrPermissionDenied),
	"eacces":          &fs.PathError{Op: "open", Path: "/var/ckpt/x", Err: syscall.EACCES},
	"reset":           &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET},
	"permanent":       errors.New("body has 3 bytes, want 10"),
	"forbidden":       &storage.HTTPError{Status: 403, Code: "AuthorizationFailure", Err: errors.New("forbidden")},
	"server-busy":     &storage.HTTPError{Status: 503, Code: "ServerBusy", Err: errors.New("busy")},
	"denied-but-busy": fmt.Errorf("%w: %w", storage.ErrPermissionDenied, storage.ErrTransient),
	"not-found":       fmt.Errorf("%w: %w", storage.ErrNotFound, &storage.HTTPError{Status: 404, Err: errors.New("no such key")}),
}

// Crossed checks that s, a store whose Stat("class/<name>") fails with
// ClassErrors[name] on the far side of a boundary, returns errors of the
// same classes (transient, throttled, permission denied, not found).
func Crossed(t *testing.T, s storage.Store) {
	for name, want := range ClassErrors {
		_, err := s.Stat(ctx(t), "class/"+name)
		if err == nil {
			t.Errorf("stat class/%s succeeded", name)
			continue
		}
		for _, c := range []struct {
			class string
			is    func(error) bool
		}{
			{"transient", storage.IsTransient},
			{"throttled", storage.IsThrottled},
			{"permission denied", storage.IsPermissionDenied},
			{"not found", func(err error) bool { return errors.Is(err, storage.ErrNotFound) }},
		} {
			if got, w := c.is(err), c.is(want); got != w {
				t.Errorf("%s: %v: %s is %v, on the other side %v", name, err, c.class, got, w)
			}
		}
	}
}
