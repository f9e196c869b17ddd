// Package protocol is the ckpt agent's socket protocol, version 1: the
// requests an app sends, the events the agent answers with, their error
// codes, and the decoder the agent runs on every request line.
//
// The protocol is one JSON object per line over a Unix stream socket; a
// line is at most MaxLine bytes. Every request has an op; an id, when
// given, is echoed on every event that answers it. The wire names and
// fields are part of ckpt's public interface and do not change.
//
// The package depends on the standard library and internal/names (the
// task and job name rules) only, so that apps can speak the protocol
// (through package client or on their own) without pulling in storage,
// engines or telemetry.
package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ckpt-io/ckpt/internal/names"
)

// ProtocolVersion is the protocol version this package speaks; the agent
// sends it in its hello event.
const ProtocolVersion = 1

// MaxLine is the longest request line the agent reads (1 MiB), not
// counting the newline. A longer line is answered with a bad_request
// error event and skipped; the connection stays usable.
const MaxLine = 1 << 20

// Error codes, the code field of an Error.
const (
	// CodeBadRequest: the request could not be parsed or is invalid.
	CodeBadRequest = "bad_request"
	// CodeNotFound: the task, checkpoint or restore source does not exist.
	CodeNotFound = "not_found"
	// CodeConflict: the request clashes with the agent's state (an older
	// checkpoint number, a non-empty restore target, a fenced agent).
	CodeConflict = "conflict"
	// CodeUnavailable: the agent cannot serve the request now (queue full,
	// storage outage, shutdown, an op it does not serve, a full local dir
	// or restore target: ENOSPC, EDQUOT); retry later.
	CodeUnavailable = "unavailable"
	// CodeForbidden: the peer's credentials do not allow this job, task or
	// directory.
	CodeForbidden = "forbidden"
	// CodeInternal: anything else, EIO and EROFS on the local dir or a
	// restore target included (the message names the directory).
	CodeInternal = "internal"
)

// Error is the error object of failed and error events: a machine-readable
// Code (one of the Code constants) and a human-readable Message.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error returns "code: message".
func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Request is one request line from a client. Op says which request it is
// (a row of the table of ops, see Ops); the other fields are the op's
// arguments and are omitted from the line when empty.
type Request struct {
	// Op is the request: one of the ops of the table (see Ops).
	Op Op `json:"op"`
	// ID, when set, is echoed on every event answering the request. On
	// the wire it is a string or a number; DecodeRequest keeps a number
	// as a json.Number, so that it is echoed exactly as sent.
	ID any `json:"id,omitempty"`
	// Task names the task (checkpoint, abort, restore; optional for status).
	Task string `json:"task,omitempty"`
	// Checkpoint is the checkpoint number (checkpoint, abort; optional for
	// restore, where 0 means the newest complete one).
	Checkpoint uint64 `json:"checkpoint,omitempty"`
	// Dir is the absolute path of the snapshot to checkpoint.
	Dir string `json:"dir,omitempty"`
	// Engine names the store's engine (for example "pebble"), when known.
	Engine string `json:"engine,omitempty"`
	// Handoff gives dir to the agent: it may move the directory itself into
	// its local store (one rename, whatever the number of files) instead of
	// hard-linking each file. The app must not use dir after sending it.
	Handoff bool `json:"handoff,omitempty"`
	// Target is the absolute path of the directory to restore into.
	Target string `json:"target,omitempty"`
	// Traceparent is the app's W3C trace context, when it sends one.
	Traceparent string `json:"traceparent,omitempty"`
	// Tasks (checkpoint), when given, makes the checkpoint job-wide: every
	// task of the job at this checkpoint, the requesting one included, at
	// most MaxTasks, each once. Checkpoint N of the job is complete when
	// every listed task has a complete checkpoint N listing the same tasks.
	Tasks []string `json:"tasks,omitempty"`
	// JobConsistent (restore) restores the newest job-complete checkpoint
	// of the task instead of its newest complete one.
	JobConsistent bool `json:"job_consistent,omitempty"`
	// To (restore) is "latest" (the checkpoint and the write-ahead log
	// shipped after it; the default, except with job_consistent) or
	// "checkpoint" (the checkpoint alone).
	To string `json:"to,omitempty"`
	// Job (checkpoint, abort, status, restore), when given, names the job
	// the request is for. An agent in node-agent mode serves several jobs
	// and picks the peer's tenant's job when it is empty; a job other than
	// the one the peer may use is refused as forbidden, by either mode.
	Job string `json:"job,omitempty"`
	// TimeoutMS (checkpoint), when positive, bounds the checkpoint's async
	// phase in milliseconds; it may lower the agent's --checkpoint-timeout,
	// never raise it.
	TimeoutMS uint64 `json:"timeout_ms,omitempty"`
	// WALDir (checkpoint), when given, is the absolute path of the live
	// store's directory: between this checkpoint and the next, the agent
	// ships the new records of the write-ahead logs there (see
	// docs/protocol.md). It is confined like dir.
	WALDir string `json:"wal_dir,omitempty"`
}

// MaxTimeoutMS bounds a checkpoint request's timeout_ms: a week.
const MaxTimeoutMS = 7 * 24 * 3600 * 1000

// MaxTasks bounds a checkpoint request's tasks list.
const MaxTasks = names.MaxTasks

// DecodeRequest parses and validates one request line. The error is always
// a *Error with code bad_request; the request it returns with an error
// carries the id, when one could be read, so that the error event can
// echo it. It never panics, whatever the input.
func DecodeRequest(line []byte) (Request, *Error) {
	var r Request
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return r, Errorf(CodeBadRequest, "empty line: send one JSON object per line")
	}
	if len(line) > MaxLine {
		return r, Errorf(CodeBadRequest, "line of %d bytes exceeds the %d byte limit", len(line), MaxLine)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if err := dec.Decode(&r); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			if te.Field == "" {
				return r, Errorf(CodeBadRequest, "a request is a JSON object, not a JSON %s", te.Value)
			}
			return r, Errorf(CodeBadRequest, "field %q: a JSON %s is not valid there", te.Field, te.Value)
		}
		return r, Errorf(CodeBadRequest, "not a JSON object: %v", err)
	}
	if dec.More() {
		return r, Errorf(CodeBadRequest, "more than one JSON value on the line")
	}
	switch r.ID.(type) {
	case nil, string, json.Number:
	default:
		return r, Errorf(CodeBadRequest, "id must be a string or a number")
	}
	if r.Job != "" && r.Op != OpHello {
		if err := names.Valid("job", r.Job); err != nil {
			return r, Errorf(CodeBadRequest, "%v", err)
		}
	}
	if r.Op == "" {
		return r, Errorf(CodeBadRequest, `missing "op" (one of %s)`, opNames())
	}
	spec, ok := LookupOp(r.Op)
	if !ok {
		return r, Errorf(CodeBadRequest, "unknown op %q (one of %s)", r.Op, opNames())
	}
	if spec.check != nil {
		return r, spec.check(&r)
	}
	return r, nil
}
