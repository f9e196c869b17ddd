package gc

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/wal"
)

// The WAL of a checkpoint lives while its manifest does and is collected,
// after the grace, once the checkpoint is retired, fenced or gone.
func TestGCKeepsTheWALOfLiveCheckpointsOnly(t *testing.T) {
	ctx := context.Background()
	s, _ := file.New(t.TempDir())
	commitCheckpoint := func(n uint64) {
		m := &manifests.Manifest{Job: "job", Task: "t", Checkpoint: n, Created: time.Now()}
		enc, err := m.Encode(0)
		if err == nil {
			err = manifests.Commit(ctx, s, m, enc)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	shipTo := func(n, epoch uint64) {
		data := []byte("segment of checkpoint")
		ref := wal.SegmentRef{Name: "000009.log", Log: 9, Start: 0, End: int64(len(data)), Records: 1, SHA256: strings.Repeat("a", 64)}
		m := &wal.Manifest{Job: "job", Task: "t", Checkpoint: n, Epoch: epoch, Seq: 1, ThroughUnixMs: time.Now().UnixMilli(), Segments: []wal.SegmentRef{ref}}
		if err := s.Put(ctx, m.SegmentKey(ref), bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
		if err := wal.Commit(ctx, s, m); err != nil {
			t.Fatal(err)
		}
	}
	commitCheckpoint(1)
	shipTo(1, 0)
	commitCheckpoint(2)
	shipTo(2, 0)
	shipTo(9, 0) // an orphan: no checkpoint 9
	// A takeover after checkpoint 2, then the old owner's late checkpoint 3
	// and its WAL: fenced.
	rec, _ := json.Marshal(manifests.Owner{Task: "t", Epoch: 1, Node: "b", AgentID: "b", Created: time.Now(), After: 2})
	if err := s.Put(ctx, manifests.OwnerKey("job", "t", 1), bytes.NewReader(rec), int64(len(rec))); err != nil {
		t.Fatal(err)
	}
	commitCheckpoint(3)
	shipTo(3, 0)

	walKeys := func() map[uint64]int {
		out := map[uint64]int{}
		s.List(ctx, manifests.TasksPrefix("job"), func(o storage.ObjectInfo) error {
			// t/chk/<n:020>/wal[.e<epoch>]/...
			parts := strings.Split(strings.TrimPrefix(o.Key, manifests.TasksPrefix("job")), "/")
			if len(parts) > 4 && strings.HasPrefix(parts[3], "wal") {
				n, _ := strconv.ParseUint(parts[2], 10, 64)
				out[n]++
			}
			return nil
		})
		return out
	}
	clock := time.Now()
	for range 4 { // retire 1, then mark and delete over several collections
		clock = clock.Add(2 * time.Hour)
		now := clock
		if _, err := Collect(ctx, s, "job", Options{Retain: 1, Grace: time.Hour, MarkDelay: time.Minute, Now: func() time.Time { return now }}); err != nil {
			t.Fatal(err)
		}
	}
	got := walKeys()
	if got[2] != 2 || got[1] != 0 || got[3] != 0 || got[9] != 0 {
		t.Fatalf("wal objects left per checkpoint: %v; want checkpoint 2's two only", got)
	}
}
