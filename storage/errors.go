package storage

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/url"
	"strings"
	"syscall"
)

// The classes of a failed call, as the Store contract defines them (see
// the doc comment of Store). A backend marks an error whose class its
// chain does not show otherwise by wrapping it with one of these
// sentinels, e.g. fmt.Errorf("get %s: %w: %w", key, storage.ErrThrottled, err).
var (
	// ErrTransient marks a failure worth retrying: the same call may
	// succeed later (a server error, a lost connection).
	ErrTransient = errors.New("transient storage failure")
	// ErrThrottled marks a store's request to slow down (HTTP 429, S3
	// SlowDown). A throttled error is transient too.
	ErrThrottled = errors.New("storage asks to slow down")
	// ErrPermissionDenied marks a refusal of the caller's credentials or
	// permissions (HTTP 401 or 403, EACCES): retrying does not help, an
	// operator must grant the permission.
	ErrPermissionDenied = errors.New("permission denied")
)

// IsTransient reports whether err is worth retrying. In order:
//
//   - nil, context.Canceled, context.DeadlineExceeded, ErrNotFound and
//     ErrExists are not transient;
//   - an error marked with ErrTransient or ErrThrottled is transient;
//   - an error in the chain with HTTPStatusCode() int (the AWS SDK's
//     response errors; backends wrap others in HTTPError) decides by
//     status: 408, 429 and 5xx are transient, everything else is not;
//   - an error with ErrorCode() string naming a throttling or server-side
//     condition (SlowDown, RequestTimeout, InternalError, ...) is transient;
//   - an error with Temporary() bool or Timeout() bool returning true is
//     transient;
//   - connection refused, reset or aborted, broken pipes, unexpected EOF,
//     a connection closed before the answer (an HTTP request's io.EOF) and
//     other *net.OpError values are transient.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, ErrNotFound) || errors.Is(err, ErrExists) {
		return false
	}
	if errors.Is(err, ErrTransient) || errors.Is(err, ErrThrottled) {
		return true
	}
	if c := HTTPStatus(err); c != 0 {
		return c == 408 || c == 429 || c >= 500
	}
	if transientCodes[ErrorCode(err)] {
		return true
	}
	var tmp interface{ Temporary() bool }
	if errors.As(err, &tmp) && tmp.Temporary() {
		return true
	}
	var to interface{ Timeout() bool }
	if errors.As(err, &to) && to.Timeout() {
		return true
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var ue *url.Error
	if errors.As(err, &ue) && errors.Is(ue.Err, io.EOF) {
		return true // the connection closed before an answer came
	}
	var op *net.OpError
	return errors.As(err, &op)
}

var transientCodes = map[string]bool{
	"SlowDown": true, "Throttling": true, "ThrottlingException": true, "TooManyRequests": true,
	"RequestLimitExceeded": true, "RequestTimeout": true, "RequestTimeoutException": true,
	"InternalError": true, "ServiceUnavailable": true, "ServerBusy": true, "OperationTimedOut": true,
}

var throttleCodes = map[string]bool{
	"SlowDown": true, "Throttling": true, "ThrottlingException": true, "TooManyRequests": true,
	"RequestLimitExceeded": true, "ServerBusy": true,
}

// IsThrottled reports whether err asks the client to slow down: marked
// with ErrThrottled, HTTP 429, an error code such as SlowDown, or an error
// with Throttled() bool returning true. Throttled errors are also
// transient.
func IsThrottled(err error) bool {
	if errors.Is(err, ErrThrottled) {
		return true
	}
	var th interface{ Throttled() bool }
	if errors.As(err, &th) && th.Throttled() {
		return true
	}
	if throttleCodes[ErrorCode(err)] {
		return true
	}
	var st interface{ HTTPStatusCode() int }
	return errors.As(err, &st) && st.HTTPStatusCode() == 429
}

// deniedCodes are service error codes that refuse the caller's credentials.
var deniedCodes = map[string]bool{
	"AccessDenied": true, "InvalidAccessKeyId": true, "SignatureDoesNotMatch": true,
	"ExpiredToken": true, "InvalidToken": true, "AllAccessDisabled": true,
}

// IsPermissionDenied reports whether err refuses the caller's credentials
// or permissions: marked with ErrPermissionDenied, an error with
// PermissionDenied() bool returning true, HTTP 401 or 403, an error code
// such as AccessDenied, or fs.ErrPermission. It is never transient unless
// also marked so.
func IsPermissionDenied(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrPermissionDenied) || errors.Is(err, fs.ErrPermission) {
		return true
	}
	var pd interface{ PermissionDenied() bool }
	if errors.As(err, &pd) && pd.PermissionDenied() {
		return true
	}
	if c := HTTPStatus(err); c == 401 || c == 403 {
		return true
	}
	return deniedCodes[ErrorCode(err)]
}

// HTTPStatus returns the HTTP status of the first error in err's chain
// that has HTTPStatusCode() int, or 0.
func HTTPStatus(err error) int {
	var st interface{ HTTPStatusCode() int }
	if errors.As(err, &st) {
		return st.HTTPStatusCode()
	}
	return 0
}

// ErrorCode returns the service error code of the first error in err's
// chain that has ErrorCode() string (S3's "SlowDown", Azure's
// "ServerBusy"), or "".
func ErrorCode(err error) string {
	var ec interface{ ErrorCode() string }
	if errors.As(err, &ec) {
		return ec.ErrorCode()
	}
	return ""
}

// HTTPError gives an SDK's error the HTTP status and service error code
// of its response, for SDKs whose errors do not say them by method (so
// that IsTransient, IsThrottled and IsPermissionDenied classify it).
type HTTPError struct {
	Status int    // the response's HTTP status
	Code   string // the service's error code ("" if none)
	Err    error
}

func (e *HTTPError) Error() string       { return e.Err.Error() }
func (e *HTTPError) Unwrap() error       { return e.Err }
func (e *HTTPError) HTTPStatusCode() int { return e.Status }
func (e *HTTPError) ErrorCode() string   { return e.Code }

// RootCause returns the text of the innermost error of err's chain (the
// cause without an SDK's layers of context), on one line.
func RootCause(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return strings.Join(strings.Fields(err.Error()), " ")
		}
		err = next
	}
}

// DeniedError is a refusal of the caller's permissions that says what the
// caller lacks, so that an operator fixes the role without guessing.
// IsPermissionDenied reports it; its chain keeps the SDK's error.
type DeniedError struct {
	Msg string // "access denied: the agent's role lacks s3:PutObject on ..."
	Err error
}

func (e *DeniedError) Error() string { return e.Msg + ": " + e.Err.Error() }
func (e *DeniedError) Unwrap() error { return e.Err }

// PermissionDenied marks the error as a refusal of the caller's
// permissions (the agent shows the task blocked).
func (e *DeniedError) PermissionDenied() bool { return true }

// Needs names the permission (IAM action, role permission) each operation
// of a backend needs: the list docs/iam.md gives.
type Needs struct {
	Ops  map[string]string // by op: "put", "get", "list", ...
	Copy string            // for "copy from ..." ops
	What string            // what any other op needs: What + " of " + op
}

// Of returns what op needs.
func (n Needs) Of(op string) string {
	if p, ok := n.Ops[op]; ok {
		return p
	}
	if strings.HasPrefix(op, "copy from") {
		return n.Copy
	}
	return n.What + " of " + op
}
