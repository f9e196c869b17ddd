package protocol

import (
	"path/filepath"
	"strings"

	"github.com/ckpt-io/ckpt/internal/names"
)

// Op names a request: the op field of a request line.
type Op string

// The ops of protocol version 1. Each has one row in the table of ops
// (see Ops); adding an op is a row there and a handler in the agent.
const (
	OpHello      Op = "hello"
	OpStatus     Op = "status"
	OpCheckpoint Op = "checkpoint"
	OpAbort      Op = "abort"
	OpRestore    Op = "restore"
	OpFollow     Op = "follow"
)

// OpSpec is one row of the table of ops: what a request of the op may
// carry, how it is answered and who may send it. The handler is the
// agent's.
type OpSpec struct {
	Op Op
	// Fields are the JSON names of the request fields the op reads,
	// besides op and id. A field the op does not read is ignored.
	Fields []string
	// Interim is the event that answers the request before its last one
	// ("synced" for checkpoint), or "" when the first answer is the last.
	Interim string
	// Final is the event of a successful last answer.
	Final string
	// Refusal is the event that carries the error of a refused request:
	// "failed" for the ops that report an outcome of their own (checkpoint,
	// restore), "error" for the others.
	Refusal string
	// Scoped is true for the ops that act on a job's tasks: a peer's
	// credentials (the agent's --allow-uid/--allow-gid, or its tenant in
	// node-agent mode) decide which job and tasks it may name. Ops that are
	// not scoped (hello) may be sent by any peer that may connect.
	Scoped bool

	check func(r *Request) *Error
}

// ops is the table of ops, in the order the protocol's documentation
// lists them.
var ops = []OpSpec{
	{Op: OpHello, Final: "hello", Refusal: "error"},
	{Op: OpCheckpoint, Fields: []string{"task", "checkpoint", "dir", "engine", "handoff", "traceparent", "tasks", "job", "timeout_ms", "wal_dir"},
		Interim: "synced", Final: "completed", Refusal: "failed", Scoped: true, check: checkCheckpoint},
	{Op: OpAbort, Fields: []string{"task", "checkpoint", "job"}, Final: "aborted", Refusal: "error", Scoped: true,
		check: func(r *Request) *Error {
			if err := needTask(r); err != nil {
				return err
			}
			return needCheckpoint(r)
		}},
	{Op: OpStatus, Fields: []string{"task", "job"}, Final: "status", Refusal: "error", Scoped: true,
		check: func(r *Request) *Error {
			if r.Task != "" {
				return needTask(r)
			}
			return nil
		}},
	{Op: OpRestore, Fields: []string{"task", "target", "checkpoint", "job_consistent", "job", "to"}, Final: "restored", Refusal: "failed",
		Scoped: true, check: checkRestore},
	{Op: OpFollow, Fields: []string{"task", "job"}, Final: "following", Refusal: "error", Scoped: true, check: needTask},
}

// Ops returns the table of ops.
func Ops() []OpSpec { return append([]OpSpec(nil), ops...) }

// LookupOp returns op's row of the table; ok is false for an op that
// protocol version 1 does not have.
func LookupOp(op Op) (spec OpSpec, ok bool) {
	for _, s := range ops {
		if s.Op == op {
			return s, true
		}
	}
	return OpSpec{}, false
}

// Known reports whether op is an op of protocol version 1.
func (op Op) Known() bool {
	_, ok := LookupOp(op)
	return ok
}

// opNames lists the ops for an error message.
func opNames() string {
	var b strings.Builder
	for i, s := range ops {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(string(s.Op))
	}
	return b.String()
}

func needTask(r *Request) *Error {
	if err := names.Valid("task", r.Task); err != nil {
		return Errorf(CodeBadRequest, "%v", err)
	}
	return nil
}

func needCheckpoint(r *Request) *Error {
	if r.Checkpoint == 0 {
		return Errorf(CodeBadRequest, "checkpoint must be a positive integer")
	}
	if r.Checkpoint > 1<<62 {
		return Errorf(CodeBadRequest, "checkpoint %d is too large", r.Checkpoint)
	}
	return nil
}

func checkCheckpoint(r *Request) *Error {
	if err := needTask(r); err != nil {
		return err
	}
	if err := needCheckpoint(r); err != nil {
		return err
	}
	if !filepath.IsAbs(r.Dir) {
		return Errorf(CodeBadRequest, "dir must be an absolute path, got %q", r.Dir)
	}
	if r.WALDir != "" && !filepath.IsAbs(r.WALDir) {
		return Errorf(CodeBadRequest, "wal_dir must be an absolute path, got %q", r.WALDir)
	}
	if len(r.Engine) > 64 {
		return Errorf(CodeBadRequest, "engine name too long")
	}
	if r.Tasks != nil {
		if err := names.CheckTasks(r.Task, r.Tasks); err != nil {
			return Errorf(CodeBadRequest, "%v", err)
		}
	}
	if r.TimeoutMS > MaxTimeoutMS {
		return Errorf(CodeBadRequest, "timeout_ms %d is too large (at most %d, a week)", r.TimeoutMS, uint64(MaxTimeoutMS))
	}
	return nil
}

func checkRestore(r *Request) *Error {
	if err := needTask(r); err != nil {
		return err
	}
	if !filepath.IsAbs(r.Target) {
		return Errorf(CodeBadRequest, "target must be an absolute path, got %q", r.Target)
	}
	if r.JobConsistent && r.Checkpoint != 0 {
		return Errorf(CodeBadRequest, "job_consistent picks the checkpoint: do not give checkpoint too")
	}
	if r.To != "" && r.To != "latest" && r.To != "checkpoint" {
		return Errorf(CodeBadRequest, "to must be latest or checkpoint, got %q", r.To)
	}
	if r.To == "latest" && r.JobConsistent {
		return Errorf(CodeBadRequest, "job_consistent restores the job-wide checkpoint: to latest would extend one task past it")
	}
	return nil
}
