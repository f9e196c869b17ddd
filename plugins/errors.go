package plugins

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ckpt-io/ckpt/plugins/internal/wire"
	"github.com/ckpt-io/ckpt/storage"
)

// Error is a failed call to a plugin. It names the plugin, and keeps what
// callers (the retry decorator among them) test for: errors.Is with
// storage.ErrNotFound, storage.ErrExists and the context's errors, the
// classes of storage.Store (storage.IsTransient, IsThrottled,
// IsPermissionDenied report on the host what they did in the plugin), and
// HTTPStatusCode, ErrorCode, Temporary and Throttled.
type Error struct {
	Plugin string // ckpt-plugin-<name>
	Msg    string
	// Crashed is true when the plugin's process exited during the call.
	Crashed bool

	sentinel   error
	httpStatus int
	code       string
	transient  bool
	throttled  bool
	denied     bool
}

func (e *Error) Error() string {
	if e.Crashed {
		return e.Msg
	}
	return fmt.Sprintf("%s [plugin %s]", e.Msg, e.Plugin)
}

func (e *Error) Unwrap() error { return e.sentinel }

// Is reports the classes the plugin saw as the marks of storage
// (storage.ErrTransient, ErrThrottled, ErrPermissionDenied), so that they
// decide on the host before the HTTP status does, as they did in the
// plugin.
func (e *Error) Is(target error) bool {
	switch target {
	case storage.ErrTransient:
		return e.transient || e.Crashed
	case storage.ErrThrottled:
		return e.throttled
	case storage.ErrPermissionDenied:
		return e.denied
	}
	return false
}

// PermissionDenied is true when the plugin's backend refused the
// credentials or permissions.
func (e *Error) PermissionDenied() bool { return e.denied }

// HTTPStatusCode is the HTTP status the plugin's backend saw (0: none).
func (e *Error) HTTPStatusCode() int { return e.httpStatus }

// ErrorCode is the service error code the plugin's backend saw.
func (e *Error) ErrorCode() string { return e.code }

// Temporary is true for errors worth retrying; a plugin that crashed is
// restarted by the next call.
func (e *Error) Temporary() bool { return e.transient || e.Crashed }

// Throttled is true when the backend asked to slow down.
func (e *Error) Throttled() bool { return e.throttled }

// fail turns the error of a call into an *Error. what names the call
// ("put job/x").
func (p *Plugin) fail(ctx context.Context, s *session, what string, err error) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	if ctx.Err() != nil && (st.Code() == codes.Canceled || st.Code() == codes.DeadlineExceeded || st.Code() == codes.Unavailable) {
		return &Error{Plugin: p.label(), Msg: fmt.Sprintf("%s: %v", what, ctx.Err()), sentinel: ctx.Err()}
	}
	switch st.Code() {
	case codes.Unavailable, codes.Canceled, codes.Internal, codes.Unknown:
		if wire.Detail(st) == nil && s.exited(2*time.Second) {
			msg := fmt.Sprintf("plugin %s (%s) exited during %s", p.label(), p.info.Path, what)
			if last := s.stderr.settledLastLine(500 * time.Millisecond); last != "" {
				msg += ": " + last
			}
			return &Error{Plugin: p.label(), Msg: msg + "; it is restarted on next use", Crashed: true}
		}
	}
	e := &Error{Plugin: p.label(), Msg: st.Message()}
	if d := wire.Detail(st); d != nil {
		e.Msg, e.httpStatus, e.code, e.transient, e.throttled = d.Message, int(d.HttpStatus), d.ErrorCode, d.Transient, d.Throttled
	} else {
		e.Msg = fmt.Sprintf("%s: %s", what, st.Message())
		e.transient = st.Code() == codes.Unavailable || st.Code() == codes.ResourceExhausted
	}
	switch st.Code() {
	case codes.NotFound:
		e.sentinel = storage.ErrNotFound
	case codes.AlreadyExists:
		e.sentinel = storage.ErrExists
	case codes.Canceled:
		e.sentinel = context.Canceled
	case codes.DeadlineExceeded:
		e.sentinel = context.DeadlineExceeded
	case codes.PermissionDenied:
		e.denied = true
	}
	return e
}
