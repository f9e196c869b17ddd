package storage_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"syscall"
	"testing"

	"github.com/ckpt-io/ckpt/storage"
)

type statusErr int

func (e statusErr) Error() string       { return fmt.Sprintf("HTTP %d", int(e)) }
func (e statusErr) HTTPStatusCode() int { return int(e) }

type codeErr string

func (e codeErr) Error() string     { return string(e) }
func (e codeErr) ErrorCode() string { return string(e) }

// TestErrorClasses is the table of the classes the Store contract
// defines: what is transient, throttled, a permission refusal.
func TestErrorClasses(t *testing.T) {
	cases := []struct {
		name                          string
		err                           error
		transient, throttled, refused bool
	}{
		{"nil", nil, false, false, false},
		{"not found", fmt.Errorf("get x: %w", storage.ErrNotFound), false, false, false},
		{"exists", fmt.Errorf("create x: %w", storage.ErrExists), false, false, false},
		{"not found with a 503 inside", fmt.Errorf("get x: %w: %w", storage.ErrNotFound, statusErr(503)), false, false, false},
		{"cancelled", fmt.Errorf("put: %w", context.Canceled), false, false, false},
		{"deadline", context.DeadlineExceeded, false, false, false},
		{"marked transient", fmt.Errorf("put x: %w: %w", storage.ErrTransient, errors.New("busy")), true, false, false},
		{"marked throttled", fmt.Errorf("put x: %w: %w", storage.ErrThrottled, errors.New("busy")), true, true, false},
		{"marked throttled over a 400", fmt.Errorf("put x: %w: %w", storage.ErrThrottled, statusErr(400)), true, true, false},
		{"marked denied", fmt.Errorf("put x: %w", storage.ErrPermissionDenied), false, false, true},
		{"503", statusErr(503), true, false, false},
		{"500", statusErr(500), true, false, false},
		{"429", statusErr(429), true, true, false},
		{"408", statusErr(408), true, false, false},
		{"403", statusErr(403), false, false, true},
		{"401", statusErr(401), false, false, true},
		{"404", statusErr(404), false, false, false},
		{"412", statusErr(412), false, false, false},
		{"HTTPError 503 ServerBusy", &storage.HTTPError{Status: 503, Code: "ServerBusy", Err: errors.New("busy")}, true, true, false},
		{"HTTPError 403", &storage.HTTPError{Status: 403, Code: "AuthorizationFailure", Err: errors.New("no")}, false, false, true},
		{"SlowDown code", codeErr("SlowDown"), true, true, false},
		{"InternalError code", codeErr("InternalError"), true, false, false},
		{"Azure ServerBusy code", codeErr("ServerBusy"), true, true, false},
		{"AccessDenied code", codeErr("AccessDenied"), false, false, true},
		{"EACCES", &fs.PathError{Op: "open", Path: "/x", Err: syscall.EACCES}, false, false, true},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true, false, false},
		{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true, false, false},
		{"unexpected EOF", io.ErrUnexpectedEOF, true, false, false},
		{"connection closed before the answer", fmt.Errorf("put x: %w", &url.Error{Op: "Put", URL: "http://127.0.0.1:1/b/x", Err: io.EOF}), true, false, false},
		{"plain EOF", io.EOF, false, false, false},
		{"plain error", errors.New("body has 3 bytes, want 10"), false, false, false},
	}
	for _, c := range cases {
		if got := storage.IsTransient(c.err); got != c.transient {
			t.Errorf("IsTransient(%s) = %v, want %v", c.name, got, c.transient)
		}
		if got := storage.IsThrottled(c.err); got != c.throttled {
			t.Errorf("IsThrottled(%s) = %v, want %v", c.name, got, c.throttled)
		}
		if got := storage.IsPermissionDenied(c.err); got != c.refused {
			t.Errorf("IsPermissionDenied(%s) = %v, want %v", c.name, got, c.refused)
		}
	}
}

func TestRootCauseIsTheInnermostErrorOnOneLine(t *testing.T) {
	err := fmt.Errorf("open: %w", fmt.Errorf("dial:  %w", errors.New("connection\n  refused ")))
	if got := storage.RootCause(err); got != "connection refused" {
		t.Fatalf("RootCause = %q", got)
	}
}
