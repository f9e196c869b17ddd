package protocol

import (
	"bytes"
	"encoding/json"
)

// Event is one line from the agent. Event names it; the other fields are
// those of that event, zero when the event does not carry them:
//
//	hello      protocol, version
//	synced     task, checkpoint, sync_ms
//	completed  task, checkpoint, checkpoint_size, full_size, files_uploaded, files_reused, duration_ms
//	failed     task, checkpoint, error
//	aborted    task, checkpoint
//	status     tasks
//	restored   the fields of Restored
//	error      error (and task, checkpoint when the request named them)
//
// An event encodes (MarshalJSON) with its own fields always present, even
// when zero (a synced event always has sync_ms, a status event always has
// tasks), and any other field only when it is not zero. A restored event
// with Restored set encodes as event, id and Restored's fields on one
// level, exactly the object `ckpt restore --json` prints plus event and id.
//
// Decoding (UnmarshalJSON) fills the fields an event carries, Restored for
// a restored event, and Raw with the line as received.
type Event struct {
	// Event names the event: hello, synced, completed, failed, aborted,
	// status, restored or error.
	Event string `json:"event"`
	// ID is the id of the request the event answers, as the request sent
	// it (a string, or a number: a json.Number when decoded); nil when
	// the request had none.
	ID any `json:"id,omitempty"`

	// Protocol is the agent's protocol version (hello).
	Protocol int `json:"protocol,omitempty"`
	// Version is the agent's version string (hello).
	Version string `json:"version,omitempty"`

	// Task and Checkpoint name the checkpoint the event is about.
	Task       string `json:"task,omitempty"`
	Checkpoint uint64 `json:"checkpoint,omitempty"`

	// SyncMS is the length of the sync phase, the app's pause (synced).
	SyncMS int64 `json:"sync_ms"`

	// CheckpointSize is the bytes this checkpoint added to storage, FullSize
	// the size of the whole snapshot, FilesUploaded and FilesReused its
	// files sent and found in storage already, DurationMS the time from
	// request to commit (completed).
	CheckpointSize int64 `json:"checkpoint_size"`
	FullSize       int64 `json:"full_size"`
	FilesUploaded  int   `json:"files_uploaded"`
	FilesReused    int   `json:"files_reused"`
	DurationMS     int64 `json:"duration_ms"`

	// Tasks is the state of every task the agent knows, or of the one
	// asked for, sorted by name (status).
	Tasks []TaskStatus `json:"tasks"`

	// Restored is what a restore did (restored).
	Restored *Restored `json:"-"`

	// Error is why a request failed (failed, error).
	Error *Error `json:"error,omitempty"`

	// Raw is the event as received, set by UnmarshalJSON; it is never
	// encoded.
	Raw json.RawMessage `json:"-"`
}

// TaskStatus is one task in a status event.
type TaskStatus struct {
	// Task is the task's name.
	Task string `json:"task"`
	// LastCompleted is the newest checkpoint of the task that completed
	// since the agent started (or was found in its local dir), 0 if none.
	LastCompleted uint64 `json:"last_completed"`
	// LastCheckpointSize and LastFullSize are that checkpoint's sizes.
	LastCheckpointSize int64 `json:"last_checkpoint_size"`
	LastFullSize       int64 `json:"last_full_size"`
	// InFlight counts the task's checkpoints past sync and not yet ended.
	InFlight int `json:"in_flight"`
	// Problems names the task's manifests in storage that the agent could
	// not read (each with its key and error): their objects are not reused,
	// and GC stops until they are fixed or removed.
	Problems []string `json:"problems,omitempty"`
}

// Restored is the outcome of a restore: the object `ckpt restore --json`
// prints, and the fields of the restored event. When the restore was
// skipped (its options said to do nothing), Restored is false and Reason
// says why.
type Restored struct {
	// Restored is true when files were restored into Target.
	Restored bool `json:"restored"`
	// Reason says why nothing was restored, when Restored is false.
	Reason string `json:"reason,omitempty"`
	// Task and Checkpoint name the checkpoint restored.
	Task       string `json:"task,omitempty"`
	Checkpoint uint64 `json:"checkpoint,omitempty"`
	// Files and Bytes count what was restored; BytesLocal and FilesLocal
	// the part taken from the agent's local copy, BytesRemote and
	// FilesRemote the part fetched from storage.
	Files       int   `json:"files"`
	Bytes       int64 `json:"bytes"`
	BytesLocal  int64 `json:"bytes_local"`
	BytesRemote int64 `json:"bytes_remote"`
	FilesLocal  int   `json:"files_local"`
	FilesRemote int   `json:"files_remote"`
	// LocalFallbacks counts local files that were missing or corrupt and
	// came from storage instead.
	LocalFallbacks int `json:"local_fallbacks"`
	// LocalVerification says how local files were checked: "sha256" (every
	// byte hashed) or "identity" (unchanged inodes trusted, the others
	// hashed).
	LocalVerification string `json:"local_verification,omitempty"`
	// Moved is set when the local copy, whole and unchanged, was moved
	// into place in one rename.
	Moved bool `json:"moved,omitempty"`
	// DurationMS is the restore's wall time.
	DurationMS int64 `json:"duration_ms"`
	// Target is the directory restored into.
	Target string `json:"target,omitempty"`
	// LocalRecordError says why the restore could not be recorded in the
	// agent's local dir; the restore itself succeeded.
	LocalRecordError string `json:"local_record_error,omitempty"`
	// To is what the restore went to: "latest" (the checkpoint extended
	// with its shipped write-ahead log) or "checkpoint".
	To string `json:"to,omitempty"`
	// WALPosition is where the restored store's write-ahead log ends;
	// WALSegments and WALBytes count the WAL segments applied over the
	// checkpoint (0 for a restore to the checkpoint). WALStopped says why
	// the WAL was not applied to its end, or not at all.
	WALPosition *WALPosition `json:"wal_position,omitempty"`
	WALSegments int          `json:"wal_segments"`
	WALBytes    int64        `json:"wal_bytes"`
	WALStopped  string       `json:"wal_stopped,omitempty"`
	// RecoveredWriteAgeMS is the age, when the restore ended, of the
	// newest write it recovered: now minus the last applied WAL
	// manifest's through time, or minus the checkpoint's creation when no
	// WAL was applied. It is the restore's recovery point.
	RecoveredWriteAgeMS int64 `json:"recovered_write_age_ms"`
}

// WALPosition names the end of a restored store's write-ahead log: WAL
// manifest Seq (0: none) of checkpoint Checkpoint by the owner of Epoch,
// and the newest log file Log, which ends at Offset.
type WALPosition struct {
	Checkpoint uint64 `json:"checkpoint"`
	Epoch      uint64 `json:"epoch"`
	Seq        uint64 `json:"seq"`
	Log        string `json:"log"`
	Offset     int64  `json:"offset"`
}

// wireEvent is an Event as encoded: a pointer field is present, even
// when zero, when set.
type wireEvent struct {
	Event          string        `json:"event"`
	ID             any           `json:"id,omitempty"`
	Protocol       int           `json:"protocol,omitempty"`
	Version        string        `json:"version,omitempty"`
	Task           string        `json:"task,omitempty"`
	Checkpoint     uint64        `json:"checkpoint,omitempty"`
	SyncMS         *int64        `json:"sync_ms,omitempty"`
	CheckpointSize *int64        `json:"checkpoint_size,omitempty"`
	FullSize       *int64        `json:"full_size,omitempty"`
	FilesUploaded  *int          `json:"files_uploaded,omitempty"`
	FilesReused    *int          `json:"files_reused,omitempty"`
	DurationMS     *int64        `json:"duration_ms,omitempty"`
	Tasks          *[]TaskStatus `json:"tasks,omitempty"`
	Error          *Error        `json:"error,omitempty"`
}

// wireRestored is a restored event as encoded.
type wireRestored struct {
	Event string `json:"event"`
	ID    any    `json:"id,omitempty"`
	*Restored
}

// field returns a pointer to v when the event always carries the field
// (own) or v is not zero, nil otherwise.
func field[T comparable](own bool, v T) *T {
	var zero T
	if !own && v == zero {
		return nil
	}
	return &v
}

// MarshalJSON encodes the event as described on Event.
func (e Event) MarshalJSON() ([]byte, error) {
	var v any
	if e.Event == "restored" && e.Restored != nil {
		v = wireRestored{Event: e.Event, ID: e.ID, Restored: e.Restored}
	} else {
		synced, completed := e.Event == "synced", e.Event == "completed"
		w := wireEvent{
			Event: e.Event, ID: e.ID, Protocol: e.Protocol, Version: e.Version,
			Task: e.Task, Checkpoint: e.Checkpoint,
			SyncMS:         field(synced, e.SyncMS),
			CheckpointSize: field(completed, e.CheckpointSize),
			FullSize:       field(completed, e.FullSize),
			FilesUploaded:  field(completed, e.FilesUploaded),
			FilesReused:    field(completed, e.FilesReused),
			DurationMS:     field(completed, e.DurationMS),
			Error:          e.Error,
		}
		if e.Event == "status" || e.Tasks != nil {
			tasks := e.Tasks
			if tasks == nil {
				tasks = []TaskStatus{}
			}
			w.Tasks = &tasks
		}
		v = w
	}
	// Encode without HTML escaping: an encoder that escapes (json.Marshal)
	// still escapes the result; one that does not gets the text as is.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// UnmarshalJSON decodes an event as described on Event. A numeric id
// decodes as a json.Number.
func (e *Event) UnmarshalJSON(data []byte) error {
	if string(bytes.TrimSpace(data)) == "null" {
		return nil // as json.Unmarshal does for other types
	}
	var w wireEvent
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&w); err != nil {
		return err
	}
	ev := Event{
		Event: w.Event, ID: w.ID, Protocol: w.Protocol, Version: w.Version,
		Task: w.Task, Checkpoint: w.Checkpoint, Error: w.Error,
		Raw: append(json.RawMessage(nil), data...),
	}
	if w.SyncMS != nil {
		ev.SyncMS = *w.SyncMS
	}
	if w.CheckpointSize != nil {
		ev.CheckpointSize = *w.CheckpointSize
	}
	if w.FullSize != nil {
		ev.FullSize = *w.FullSize
	}
	if w.FilesUploaded != nil {
		ev.FilesUploaded = *w.FilesUploaded
	}
	if w.FilesReused != nil {
		ev.FilesReused = *w.FilesReused
	}
	if w.DurationMS != nil {
		ev.DurationMS = *w.DurationMS
	}
	if w.Tasks != nil {
		ev.Tasks = *w.Tasks
	}
	if w.Event == "restored" {
		ev.Restored = new(Restored)
		if err := json.Unmarshal(data, ev.Restored); err != nil {
			return err
		}
	}
	*e = ev
	return nil
}
