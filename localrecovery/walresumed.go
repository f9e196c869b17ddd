package localrecovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ckpt-io/ckpt/manifests"
)

// walResumedPath records, for task, the WAL position the last restore into
// this node reached (see RecordWALResumed).
func (s *Store) walResumedPath(task string) string {
	return filepath.Join(s.root, "."+task+".wal-resumed")
}

// RecordWALResumed notes that the last restore of task into this node went
// to WAL manifest r.Seq of checkpoint r.Checkpoint by the owner of r.Epoch;
// nil says it applied no WAL (the note is removed). An agent that takes the
// task over on the strength of that restore (TakeoverEpoch) puts the note
// in its ownership record (manifests.Owner.WALResumed): later restores then
// use the old owner's WAL up to there and no further.
func (s *Store) RecordWALResumed(task string, r *manifests.WALResumed) error {
	if err := manifests.ValidName("task", task); err != nil {
		return err
	}
	p := s.walResumedPath(task)
	if r == nil {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("local dir: record the restore of task %s: %w", task, err)
		}
		return nil
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("local dir: record the restore of task %s: %w", task, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("local dir: record the restore of task %s: %w", task, err)
	}
	return nil
}

// WALResumed returns the position RecordWALResumed noted for task; ok is
// false when the last restore applied no WAL (or noted nothing).
func (s *Store) WALResumed(task string) (r manifests.WALResumed, ok bool) {
	data, err := os.ReadFile(s.walResumedPath(task))
	if err != nil || json.Unmarshal(data, &r) != nil || r.Checkpoint == 0 || r.Seq == 0 {
		return manifests.WALResumed{}, false
	}
	return r, true
}
