package main

import (
	"fmt"
	"time"

	"github.com/ckpt-io/ckpt/protocol"
)

// scenario is one scripted conversation: play drives the client and plays
// the agent's side, and returns why the client did not conform.
type scenario struct {
	name string
	play func(r *run) error
}

// The agent's answers the scenarios play. conformance_test.go checks that
// the real agent answers the same requests with the same events (names,
// order and fields), so that the script does not drift from the agent.
var (
	evHello     = protocol.Event{Event: "hello", Protocol: protocol.ProtocolVersion, Version: "v1.0.0-fake"}
	evSynced    = protocol.Event{Event: "synced", Task: "t1", Checkpoint: 7, SyncMS: 3}
	evCompleted = protocol.Event{Event: "completed", Task: "t1", Checkpoint: 7, CheckpointSize: 1234, FullSize: 99999,
		FilesUploaded: 2, FilesReused: 5, DurationMS: 41}
	evAborted = protocol.Event{Event: "aborted", Task: "t1", Checkpoint: 7}
	evStatus  = protocol.Event{Event: "status", Tasks: []protocol.TaskStatus{
		{Task: "t1", LastCompleted: 6, LastCheckpointSize: 10, LastFullSize: 20, InFlight: 1},
		{Task: "t2", LastCompleted: 0}}}
	evRestored = protocol.Event{Event: "restored", Restored: &protocol.Restored{Restored: true, Task: "t1", Checkpoint: 6,
		Files: 3, Bytes: 300, BytesLocal: 200, BytesRemote: 100, FilesLocal: 2, FilesRemote: 1,
		LocalVerification: "sha256", DurationMS: 12, Target: "/data/restored",
		To: "latest", WALPosition: &protocol.WALPosition{Checkpoint: 6, Log: "000012.log", Offset: 4096}, RecoveredWriteAgeMS: 1500}}
	evRestoreFailed = protocol.Event{Event: "failed", Task: "t1", Checkpoint: 5, Error: protocol.Errorf(protocol.CodeNotFound, "no checkpoint 5")}
	evFollowing     = protocol.Event{Event: "following", Task: "t9"}
	// evInvalid answers a request the agent cannot decode or that is
	// invalid: an error event with no task or checkpoint.
	evInvalid = protocol.Event{Event: "error", Error: protocol.Errorf(protocol.CodeBadRequest, "checkpoint must be a positive integer")}
	// evRefused is the agent refusing a connection: no id, then it closes.
	evRefused = protocol.Event{Event: "error", ID: noID, Error: protocol.Errorf(protocol.CodeForbidden, "uid 1000 gid 1000 may not use this agent")}
)

// failedEv is a failed event for checkpoint 7 of t1 with code.
func failedEv(code string) protocol.Event {
	return protocol.Event{Event: "failed", Task: "t1", Checkpoint: 7, Error: protocol.Errorf(code, "scripted %s failure", code)}
}

// errorEv is an error event with code.
func errorEv(task string, n uint64, code string) protocol.Event {
	return protocol.Event{Event: "error", Task: task, Checkpoint: n, Error: protocol.Errorf(code, "scripted %s error", code)}
}

var (
	// ckptCall is the client call for checkpoint 7 of t1 with every
	// option, and ckptReq the request it must send.
	ckptCall = map[string]any{"call": "checkpoint", "task": "t1", "checkpoint": 7, "dir": "/data/snap-7",
		"engine": "rocksdb", "handoff": true, "timeout_ms": 1500}
	ckptReq = map[string]any{"op": "checkpoint", "task": "t1", "checkpoint": 7, "dir": "/data/snap-7",
		"engine": "rocksdb", "handoff": true, "timeout_ms": 1500}
	// A call with no options sends none of their fields.
	ckptMinCall = map[string]any{"call": "checkpoint", "task": "t1", "checkpoint": 7, "dir": "/data/snap-7"}
	ckptMinReq  = map[string]any{"op": "checkpoint", "task": "t1", "checkpoint": 7, "dir": "/data/snap-7"}
)

// completedFields are the fields of evCompleted a client must return.
var completedFields = map[string]any{"task": "t1", "checkpoint": 7, "checkpoint_size": 1234, "full_size": 99999,
	"files_uploaded": 2, "files_reused": 5, "duration_ms": 41}

// seq runs steps in order and stops at the first error.
func seq(steps ...func() error) error {
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// connected is a scenario that starts with the agent up and the client
// connected.
func connected(name string, play func(r *run) error) scenario {
	return scenario{name, func(r *run) error {
		if err := r.listen(); err != nil {
			return err
		}
		if err := r.connect(); err != nil {
			return err
		}
		return play(r)
	}}
}

// checkpointFails: the agent answers a checkpoint with failed, before or
// after synced; the client raises an agent error with the code.
func checkpointFails(code string, afterSynced bool) scenario {
	when := "before"
	if afterSynced {
		when = "after"
	}
	return connected(fmt.Sprintf("checkpoint-failed-%s-synced-%s", when, code), func(r *run) error {
		evs := []protocol.Event{failedEv(code)}
		if afterSynced {
			evs = append([]protocol.Event{evSynced}, evs...)
		}
		return seq(
			func() error { return r.call(ckptMinCall) },
			func() error { return r.expect(ckptMinReq) },
			func() error { return r.reply(evs...) },
			func() error { return r.wantError("agent", code) },
		)
	})
}

var codes = []string{protocol.CodeBadRequest, protocol.CodeNotFound, protocol.CodeConflict,
	protocol.CodeUnavailable, protocol.CodeForbidden, protocol.CodeInternal}

var scenarios = func() []scenario {
	s := []scenario{
		connected("hello", func(r *run) error {
			return seq(
				func() error { return r.call(map[string]any{"call": "hello"}) },
				func() error { return r.expect(map[string]any{"op": "hello"}) },
				func() error { return r.reply(evHello) },
				func() error { return r.wantEvent("hello", map[string]any{"protocol": 1, "version": "v1.0.0-fake"}) },
			)
		}),
		connected("checkpoint-completed-with-every-option", func(r *run) error {
			return seq(
				func() error { return r.call(ckptCall) },
				func() error { return r.expect(ckptReq) },
				func() error { return r.reply(evSynced) },
				func() error { time.Sleep(50 * time.Millisecond); return r.reply(evCompleted) },
				func() error { return r.wantEvent("completed", completedFields) },
			)
		}),
		connected("checkpoint-completed-sends-no-unset-option", func(r *run) error {
			return seq(
				func() error { return r.call(ckptMinCall) },
				func() error { return r.expect(ckptMinReq) },
				func() error { return r.reply(evSynced, evCompleted) },
				func() error { return r.wantEvent("completed", completedFields) },
			)
		}),
		// A client that returns at synced returns before the checkpoint is
		// in storage: it must wait for completed.
		connected("checkpoint-synced-is-not-done", func(r *run) error {
			return seq(
				func() error { return r.call(ckptMinCall) },
				func() error { return r.expect(ckptMinReq) },
				func() error { return r.reply(evSynced) },
				func() error { time.Sleep(300 * time.Millisecond); return r.reply(failedEv(protocol.CodeUnavailable)) },
				func() error { return r.wantError("agent", protocol.CodeUnavailable) },
			)
		}),
		connected("checkpoint-error-event", func(r *run) error {
			// An invalid request is answered with an error event, not failed.
			return seq(
				func() error { return r.call(ckptMinCall) },
				func() error { return r.expect(ckptMinReq) },
				func() error { return r.reply(evInvalid) },
				func() error { return r.wantError("agent", protocol.CodeBadRequest) },
			)
		}),
		connected("checkpoint-aborted", func(r *run) error {
			return seq(
				func() error { return r.call(ckptMinCall) },
				func() error { return r.expect(ckptMinReq) },
				func() error { return r.reply(evSynced, evAborted) },
				func() error { return r.wantError("aborted", "") },
			)
		}),
		connected("abort", func(r *run) error {
			return seq(
				func() error { return r.call(map[string]any{"call": "abort", "task": "t1", "checkpoint": 7}) },
				func() error { return r.expect(map[string]any{"op": "abort", "task": "t1", "checkpoint": 7}) },
				func() error { return r.reply(evAborted) },
				func() error { return r.wantEvent("aborted", map[string]any{"task": "t1", "checkpoint": 7}) },
			)
		}),
		connected("abort-not-in-flight", func(r *run) error {
			return seq(
				func() error { return r.call(map[string]any{"call": "abort", "task": "t1", "checkpoint": 7}) },
				func() error { return r.expect(map[string]any{"op": "abort", "task": "t1", "checkpoint": 7}) },
				func() error { return r.reply(errorEv("t1", 7, protocol.CodeNotFound)) },
				func() error { return r.wantError("agent", protocol.CodeNotFound) },
			)
		}),
		connected("status", func(r *run) error {
			return seq(
				func() error { return r.call(map[string]any{"call": "status"}) },
				func() error { return r.expect(map[string]any{"op": "status"}) },
				func() error { return r.reply(evStatus) },
				func() error { return r.wantEvent("status", map[string]any{"tasks": norm(evStatus.Tasks)}) },
				func() error { return r.call(map[string]any{"call": "status", "task": "t2"}) },
				func() error { return r.expect(map[string]any{"op": "status", "task": "t2"}) },
				func() error { return r.reply(protocol.Event{Event: "status", Tasks: []protocol.TaskStatus{}}) },
				func() error { return r.wantEvent("status", map[string]any{"tasks": []any{}}) },
			)
		}),
		connected("restore", func(r *run) error {
			return seq(
				func() error {
					return r.call(map[string]any{"call": "restore", "task": "t1", "target": "/data/restored"})
				},
				func() error {
					return r.expect(map[string]any{"op": "restore", "task": "t1", "target": "/data/restored"})
				},
				func() error { return r.reply(evRestored) },
				func() error {
					return r.wantEvent("restored", map[string]any{"restored": true, "checkpoint": 6, "files": 3, "bytes": 300, "target": "/data/restored"})
				},
				func() error {
					return r.call(map[string]any{"call": "restore", "task": "t1", "target": "/data/r2", "checkpoint": 5})
				},
				func() error {
					return r.expect(map[string]any{"op": "restore", "task": "t1", "target": "/data/r2", "checkpoint": 5})
				},
				func() error {
					return r.reply(evRestoreFailed)
				},
				func() error { return r.wantError("agent", protocol.CodeNotFound) },
			)
		}),
		connected("follow", func(r *run) error {
			return seq(
				func() error { return r.call(map[string]any{"call": "follow", "task": "t9"}) },
				func() error { return r.expect(map[string]any{"op": "follow", "task": "t9"}) },
				func() error { return r.reply(evFollowing) },
				func() error { return r.wantEvent("following", map[string]any{"task": "t9"}) },
				func() error { return r.call(map[string]any{"call": "follow", "task": "t9"}) },
				func() error { return r.expect(map[string]any{"op": "follow", "task": "t9"}) },
				func() error { return r.reply(errorEv("t9", 0, protocol.CodeUnavailable)) },
				func() error { return r.wantError("agent", protocol.CodeUnavailable) },
			)
		}),
		// Events for other requests (other ids, a number among them) come
		// first: the client must skip them and return its own.
		connected("ids-echoed-and-matched", func(r *run) error {
			other := func(ev protocol.Event, id any) protocol.Event { ev.ID = id; ev.Checkpoint = 99; return ev }
			return seq(
				func() error { return r.call(ckptMinCall) },
				func() error { return r.expect(ckptMinReq) },
				func() error {
					return r.reply(other(evSynced, "someone-else"), other(failedEv(protocol.CodeInternal), 424242),
						other(evCompleted, "someone-else"), evSynced, other(evAborted, 17))
				},
				func() error { time.Sleep(50 * time.Millisecond); return r.reply(other(evCompleted, 5), evCompleted) },
				func() error { return r.wantEvent("completed", completedFields) },
				func() error { return r.call(map[string]any{"call": "hello"}) },
				func() error { return r.expect(map[string]any{"op": "hello"}) },
				func() error { return r.reply(other(errorEv("t1", 1, protocol.CodeConflict), "x"), evHello) },
				func() error { return r.wantEvent("hello", map[string]any{"protocol": 1}) },
			)
		}),
		connected("partial-lines", func(r *run) error {
			return seq(
				func() error { return r.call(ckptMinCall) },
				func() error { return r.expect(ckptMinReq) },
				func() error { return r.dribble(evSynced, evCompleted) },
				func() error { return r.wantEvent("completed", completedFields) },
			)
		}),
		// Fields the client does not know (a newer agent) are ignored.
		connected("unknown-fields-ignored", func(r *run) error {
			return seq(
				func() error { return r.call(map[string]any{"call": "hello"}) },
				func() error { return r.expect(map[string]any{"op": "hello"}) },
				func() error {
					return r.write([]byte(fmt.Sprintf(`{"event":"hello","id":%s,"protocol":1,"version":"v9","a_new_field":{"x":[1,2]}}`+"\n", show(r.last))))
				},
				func() error { return r.wantEvent("hello", map[string]any{"protocol": 1, "version": "v9"}) },
			)
		}),
		// The caller's wait runs out; the late answer to that request must
		// not be taken for the answer to the next one.
		connected("wait-runs-out-and-late-events-are-skipped", func(r *run) error {
			call := map[string]any{"wait_ms": 300}
			for k, v := range ckptMinCall {
				call[k] = v
			}
			return seq(
				func() error { return r.call(call) },
				func() error { return r.expect(ckptMinReq) },
				func() error { return r.reply(evSynced) },
				func() error { return r.wantError("timeout", "") },
				func() error { return r.reply(evCompleted) },
				func() error { return r.call(map[string]any{"call": "hello"}) },
				func() error { return r.expect(map[string]any{"op": "hello"}) },
				func() error { return r.reply(evHello) },
				func() error { return r.wantEvent("hello", map[string]any{"protocol": 1}) },
			)
		}),
		// An agent refusing the connection (forbidden peer, too many
		// connections) sends one error event without an id and closes.
		scenario{"connection-refused-by-the-agent", func(r *run) error {
			return seq(
				r.listen,
				r.connect,
				func() error {
					err := r.reply(evRefused)
					r.hangup()
					return err
				},
				func() error { time.Sleep(50 * time.Millisecond); return r.call(map[string]any{"call": "hello"}) },
				func() error { return r.wantError("agent", protocol.CodeForbidden) },
			)
		}},
		// The agent restarts between two calls: the next call dials again
		// (with backoff while the socket is missing) and is served.
		scenario{"reconnect-after-the-agent-restarts", func(r *run) error {
			return seq(
				r.listen,
				r.connect,
				func() error { return r.call(map[string]any{"call": "hello"}) },
				func() error { return r.expect(map[string]any{"op": "hello"}) },
				func() error { return r.reply(evHello) },
				func() error { return r.wantEvent("hello", nil) },
				func() error { r.hangup(); r.unlisten(); return nil },
				func() error { time.Sleep(50 * time.Millisecond); return r.call(map[string]any{"call": "status"}) },
				func() error { time.Sleep(400 * time.Millisecond); return r.listen() },
				r.accept,
				func() error { return r.expect(map[string]any{"op": "status"}) },
				func() error { return r.reply(evStatus) },
				func() error { return r.wantEvent("status", nil) },
			)
		}},
		// The agent dies mid-checkpoint: the call fails with a connection
		// error (never hangs, never reports success), and the next call is
		// served by the restarted agent.
		scenario{"connection-lost-mid-checkpoint", func(r *run) error {
			return seq(
				r.listen,
				r.connect,
				func() error { return r.call(ckptMinCall) },
				func() error { return r.expect(ckptMinReq) },
				func() error { return r.reply(evSynced) },
				func() error { r.hangup(); r.unlisten(); return nil },
				func() error { return r.wantError("connection", "") },
				r.listen,
				func() error { return r.call(map[string]any{"call": "status", "task": "t1"}) },
				r.accept,
				func() error { return r.expect(map[string]any{"op": "status", "task": "t1"}) },
				func() error { return r.reply(evStatus) },
				func() error { return r.wantEvent("status", nil) },
			)
		}},
		// The app starts before its agent: the socket is missing, then
		// stale (refusing connections), then served; connect waits.
		scenario{"missing-socket-at-start", func(r *run) error {
			start := time.Now()
			return seq(
				func() error {
					return r.call(map[string]any{"call": "connect", "socket": r.socket, "dial_wait_ms": 10000})
				},
				func() error { time.Sleep(300 * time.Millisecond); return r.stale() },
				func() error { time.Sleep(300 * time.Millisecond); return r.listen() },
				r.accept,
				r.wantOK,
				func() error {
					if took := time.Since(start); took > 5*time.Second {
						return fmt.Errorf("connect took %v after the socket appeared at 600ms: backoff too long", took)
					}
					return nil
				},
				func() error { return r.call(map[string]any{"call": "hello"}) },
				func() error { return r.expect(map[string]any{"op": "hello"}) },
				func() error { return r.reply(evHello) },
				func() error { return r.wantEvent("hello", nil) },
			)
		}},
		scenario{"missing-socket-deadline", func(r *run) error {
			start := time.Now()
			return seq(
				func() error {
					return r.call(map[string]any{"call": "connect", "socket": r.socket, "dial_wait_ms": 700})
				},
				func() error { return r.wantError("connect", "") },
				func() error {
					if took := time.Since(start); took < 600*time.Millisecond || took > 6*time.Second {
						return fmt.Errorf("connect gave up after %v, want about the 700ms dial wait", took)
					}
					return nil
				},
			)
		}},
	}
	for _, c := range codes {
		s = append(s, checkpointFails(c, false), checkpointFails(c, true))
	}
	return s
}()
