package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/ckpt-io/ckpt/manifests"
)

// ProtocolVersion is the socket protocol this agent speaks.
const ProtocolVersion = 1

// MaxLine is the longest request line the agent reads (1 MiB).
const MaxLine = 1 << 20

// Error codes of the protocol.
const (
	CodeBadRequest  = "bad_request"
	CodeNotFound    = "not_found"
	CodeConflict    = "conflict"
	CodeUnavailable = "unavailable"
	CodeInternal    = "internal"
)

// Request is one line from a client.
type Request struct {
	Op         string `json:"op"`
	ID         any    `json:"id,omitempty"`
	Task       string `json:"task,omitempty"`
	Checkpoint uint64 `json:"checkpoint,omitempty"`
	Dir        string `json:"dir,omitempty"`
	Engine     string `json:"engine,omitempty"`
	// Handoff gives dir to the agent: it may move the directory itself into
	// its local store (one rename, whatever the number of files) instead of
	// hard-linking each file. The app must not use dir after sending it.
	Handoff bool   `json:"handoff,omitempty"`
	Target  string `json:"target,omitempty"`
	// Traceparent is the app's W3C trace context, when it sends one.
	Traceparent string `json:"traceparent,omitempty"`
}

// Error is the error object of failed and error events.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

func errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Event is one line to a client. Fields not used by an event are omitted.
type Event struct {
	Event string `json:"event"`
	ID    any    `json:"id,omitempty"`

	// hello
	Protocol int    `json:"protocol,omitempty"`
	Version  string `json:"version,omitempty"`

	Task       string `json:"task,omitempty"`
	Checkpoint uint64 `json:"checkpoint,omitempty"`

	// synced
	SyncMS *int64 `json:"sync_ms,omitempty"`

	// completed
	CheckpointSize *int64 `json:"checkpoint_size,omitempty"`
	FullSize       *int64 `json:"full_size,omitempty"`
	FilesUploaded  *int   `json:"files_uploaded,omitempty"`
	FilesReused    *int   `json:"files_reused,omitempty"`
	DurationMS     *int64 `json:"duration_ms,omitempty"`

	// status
	Tasks *[]TaskStatus `json:"tasks,omitempty"`

	// restored: the fields of `ckpt restore --json`
	Restored any `json:"restored,omitempty"`

	Error *Error `json:"error,omitempty"`
}

// TaskStatus is one task in a status event.
type TaskStatus struct {
	Task               string `json:"task"`
	LastCompleted      uint64 `json:"last_completed"`
	LastCheckpointSize int64  `json:"last_checkpoint_size"`
	LastFullSize       int64  `json:"last_full_size"`
	InFlight           int    `json:"in_flight"`
}

// DecodeRequest parses and validates one request line. The error is always
// a *Error with code bad_request. It never panics, whatever the input.
func DecodeRequest(line []byte) (Request, *Error) {
	var r Request
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return r, errorf(CodeBadRequest, "empty line: send one JSON object per line")
	}
	if len(line) > MaxLine {
		return r, errorf(CodeBadRequest, "line of %d bytes exceeds the %d byte limit", len(line), MaxLine)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if err := dec.Decode(&r); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			if te.Field == "" {
				return r, errorf(CodeBadRequest, "a request is a JSON object, not a JSON %s", te.Value)
			}
			return r, errorf(CodeBadRequest, "field %q: a JSON %s is not valid there", te.Field, te.Value)
		}
		return r, errorf(CodeBadRequest, "not a JSON object: %v", err)
	}
	if dec.More() {
		return r, errorf(CodeBadRequest, "more than one JSON value on the line")
	}
	switch r.ID.(type) {
	case nil, string, json.Number:
	default:
		return r, errorf(CodeBadRequest, "id must be a string or a number")
	}
	needTask := func() *Error {
		if err := manifests.ValidName("task", r.Task); err != nil {
			return errorf(CodeBadRequest, "%v", err)
		}
		return nil
	}
	needCheckpoint := func() *Error {
		if r.Checkpoint == 0 {
			return errorf(CodeBadRequest, "checkpoint must be a positive integer")
		}
		if r.Checkpoint > 1<<62 {
			return errorf(CodeBadRequest, "checkpoint %d is too large", r.Checkpoint)
		}
		return nil
	}
	switch r.Op {
	case "hello":
	case "status":
		if r.Task != "" {
			return r, needTask()
		}
	case "checkpoint":
		if err := needTask(); err != nil {
			return r, err
		}
		if err := needCheckpoint(); err != nil {
			return r, err
		}
		if !filepath.IsAbs(r.Dir) {
			return r, errorf(CodeBadRequest, "dir must be an absolute path, got %q", r.Dir)
		}
		if len(r.Engine) > 64 {
			return r, errorf(CodeBadRequest, "engine name too long")
		}
	case "abort":
		if err := needTask(); err != nil {
			return r, err
		}
		return r, needCheckpoint()
	case "restore":
		if err := needTask(); err != nil {
			return r, err
		}
		if !filepath.IsAbs(r.Target) {
			return r, errorf(CodeBadRequest, "target must be an absolute path, got %q", r.Target)
		}
	case "":
		return r, errorf(CodeBadRequest, `missing "op" (one of hello, checkpoint, abort, status, restore)`)
	default:
		return r, errorf(CodeBadRequest, "unknown op %q (one of hello, checkpoint, abort, status, restore)", r.Op)
	}
	return r, nil
}

func ptr[T any](v T) *T { return &v }
