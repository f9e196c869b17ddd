package protocol

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// legacyEvent is the event type the agent encoded before Event had its own
// MarshalJSON: an event must encode to the same bytes.
type legacyEvent struct {
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
	Restored       any           `json:"restored,omitempty"`
	Error          *Error        `json:"error,omitempty"`
}

func ptr[T any](v T) *T { return &v }

// encode encodes v as the agent does (no HTML escaping), without the newline.
func encode(t *testing.T, v any) string {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return string(bytes.TrimSuffix(b.Bytes(), []byte("\n")))
}

func TestEventsEncodeAsTheAgentAlwaysSentThem(t *testing.T) {
	tasks := []TaskStatus{{Task: "a", LastCompleted: 2, LastCheckpointSize: 10, LastFullSize: 20, InFlight: 1}}
	bad := Errorf(CodeInternal, "a <b> & \"c\"")
	for _, c := range []struct {
		ev  Event
		old legacyEvent
	}{
		{Event{Event: "hello", ID: "h", Protocol: ProtocolVersion, Version: "v0.1"},
			legacyEvent{Event: "hello", ID: "h", Protocol: ProtocolVersion, Version: "v0.1"}},
		{Event{Event: "hello", Protocol: ProtocolVersion}, legacyEvent{Event: "hello", Protocol: ProtocolVersion}},
		{Event{Event: "status", ID: json.Number("4"), Tasks: []TaskStatus{}},
			legacyEvent{Event: "status", ID: json.Number("4"), Tasks: ptr([]TaskStatus{})}},
		{Event{Event: "status"}, legacyEvent{Event: "status", Tasks: ptr([]TaskStatus{})}},
		{Event{Event: "status", Tasks: tasks}, legacyEvent{Event: "status", Tasks: &tasks}},
		{Event{Event: "synced", ID: "c1", Task: "t", Checkpoint: 3},
			legacyEvent{Event: "synced", ID: "c1", Task: "t", Checkpoint: 3, SyncMS: ptr(int64(0))}},
		{Event{Event: "synced", Task: "t", Checkpoint: 3, SyncMS: 12},
			legacyEvent{Event: "synced", Task: "t", Checkpoint: 3, SyncMS: ptr(int64(12))}},
		{Event{Event: "completed", ID: "c1", Task: "t", Checkpoint: 3},
			legacyEvent{Event: "completed", ID: "c1", Task: "t", Checkpoint: 3, CheckpointSize: ptr(int64(0)), FullSize: ptr(int64(0)),
				FilesUploaded: ptr(0), FilesReused: ptr(0), DurationMS: ptr(int64(0))}},
		{Event{Event: "completed", Task: "t", Checkpoint: 3, CheckpointSize: 1, FullSize: 2, FilesUploaded: 3, FilesReused: 4, DurationMS: 5},
			legacyEvent{Event: "completed", Task: "t", Checkpoint: 3, CheckpointSize: ptr(int64(1)), FullSize: ptr(int64(2)),
				FilesUploaded: ptr(3), FilesReused: ptr(4), DurationMS: ptr(int64(5))}},
		{Event{Event: "failed", ID: "c2", Task: "t", Checkpoint: 3, Error: bad},
			legacyEvent{Event: "failed", ID: "c2", Task: "t", Checkpoint: 3, Error: bad}},
		{Event{Event: "aborted", Task: "t", Checkpoint: 3}, legacyEvent{Event: "aborted", Task: "t", Checkpoint: 3}},
		{Event{Event: "error", Error: Errorf(CodeBadRequest, "line exceeds the %d byte limit", MaxLine)},
			legacyEvent{Event: "error", Error: Errorf(CodeBadRequest, "line exceeds the %d byte limit", MaxLine)}},
		{Event{Event: "error", ID: "x", Task: "t", Error: Errorf(CodeUnavailable, "no")},
			legacyEvent{Event: "error", ID: "x", Task: "t", Error: Errorf(CodeUnavailable, "no")}},
		{Event{Event: "restored", ID: "r"}, legacyEvent{Event: "restored", ID: "r"}},
	} {
		got, want := encode(t, c.ev), encode(t, c.old)
		if got != want {
			t.Errorf("agent encoding:\n got %s\nwant %s", got, want)
		}
		b, err := json.Marshal(c.ev)
		if err != nil {
			t.Fatal(err)
		}
		wantEscaped, _ := json.Marshal(c.old)
		if string(b) != string(wantEscaped) {
			t.Errorf("json.Marshal:\n got %s\nwant %s", b, wantEscaped)
		}
	}
}

// legacyRestored is how the agent built the restored event before it was
// typed: the restore result re-marshalled through a map.
func legacyRestored(id any, res any) map[string]any {
	out := map[string]any{}
	if b, err := json.Marshal(res); err == nil {
		json.Unmarshal(b, &out)
	}
	out["event"] = "restored"
	if id != nil {
		out["id"] = id
	}
	return out
}

func TestTheRestoredEventIsRestoreJSONWithEventAndID(t *testing.T) {
	for _, r := range []*Restored{
		{Restored: true, Task: "t", Checkpoint: 7, Files: 3, Bytes: 300, BytesLocal: 100, BytesRemote: 200,
			FilesLocal: 1, FilesRemote: 2, LocalFallbacks: 1, LocalVerification: "sha256", Moved: true, DurationMS: 9, Target: "/data/t"},
		{Restored: true, Task: "t", Checkpoint: 1, Target: "/data/t"},
		{Restored: false, Reason: "the target already holds a store"},
	} {
		for _, id := range []any{nil, "r1", json.Number("12")} {
			ev := Event{Event: "restored", ID: id, Restored: r}
			var got, want map[string]any
			if err := json.Unmarshal([]byte(encode(t, ev)), &got); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(encode(t, legacyRestored(id, r))), &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("restored event\n got %v\nwant %v", got, want)
			}
			var back Event
			if err := json.Unmarshal([]byte(encode(t, ev)), &back); err != nil {
				t.Fatal(err)
			}
			if back.Event != "restored" || back.Restored == nil || *back.Restored != *r || back.Task != r.Task || back.Checkpoint != r.Checkpoint {
				t.Errorf("decoded %+v (restored %+v), want %+v", back, back.Restored, r)
			}
		}
	}
}

func TestEventsDecode(t *testing.T) {
	line := `{"event":"completed","id":"c1","task":"t","checkpoint":3,"checkpoint_size":0,"full_size":2,"files_uploaded":3,"files_reused":4,"duration_ms":5}`
	var ev Event
	if err := json.Unmarshal([]byte(line), &ev); err != nil {
		t.Fatal(err)
	}
	want := Event{Event: "completed", ID: "c1", Task: "t", Checkpoint: 3, FullSize: 2, FilesUploaded: 3, FilesReused: 4, DurationMS: 5, Raw: json.RawMessage(line)}
	if !reflect.DeepEqual(ev, want) {
		t.Fatalf("decoded %+v", ev)
	}
	if encode(t, ev) != line {
		t.Fatalf("re-encoded %s", encode(t, ev))
	}
	line = `{"event":"status","id":7,"tasks":[{"task":"a","last_completed":2,"last_checkpoint_size":10,"last_full_size":20,"in_flight":1}]}`
	if err := json.Unmarshal([]byte(line), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.ID != json.Number("7") || len(ev.Tasks) != 1 || ev.Tasks[0].LastCompleted != 2 || ev.Restored != nil || ev.FullSize != 0 {
		t.Fatalf("decoded %+v", ev)
	}
	if encode(t, ev) != line {
		t.Fatalf("re-encoded %s", encode(t, ev))
	}
	line = `{"event":"failed","task":"t","checkpoint":3,"error":{"code":"conflict","message":"m"}}`
	if err := json.Unmarshal([]byte(line), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Error == nil || ev.Error.Code != CodeConflict || ev.Error.Error() != "conflict: m" {
		t.Fatalf("decoded %+v", ev)
	}
	if err := json.Unmarshal([]byte(`[1]`), &ev); err == nil {
		t.Fatal("decoded an array as an event")
	}
}
