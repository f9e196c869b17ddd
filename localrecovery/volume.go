package localrecovery

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ckpt-io/ckpt/internal/fsutil"
	"github.com/ckpt-io/ckpt/manifests"
)

// volumeIDFile names the local dir's identity: a random id written once,
// the first time it is asked for, and kept for the dir's life.
const volumeIDFile = ".volume-id"

// VolumeID returns the identity of the volume this local dir lives on,
// creating it on first use. In sidecar mode the local dir lives on the
// pod's volume beside the store, so the id moves with the volume: an
// agent that finds the task's newest owner was an agent on this very
// volume is that owner's successor, whichever node the volume is attached
// to now (a StatefulSet pod rescheduled with its EBS or PD volume).
func (s *Store) VolumeID() (string, error) {
	p := filepath.Join(s.root, volumeIDFile)
	if id, err := readID(p); err == nil {
		return id, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	b := make([]byte, 12)
	rand.Read(b)
	id := "vol-" + hex.EncodeToString(b)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("local dir: write its volume id: %w", err)
	}
	// Link, not rename: of two processes that race here, one id wins and
	// both read it.
	err := os.Link(tmp, p)
	os.Remove(tmp)
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("local dir: write its volume id: %w", err)
	}
	if err := fsutil.SyncDir(s.root); err != nil {
		return "", fmt.Errorf("local dir: write its volume id: %w", err)
	}
	return readID(p)
}

// readID reads a volume id file.
func readID(p string) (string, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(data))
	if !strings.HasPrefix(id, "vol-") || len(id) < 8 {
		return "", fmt.Errorf("local dir: volume id file %s holds %q, not an id (remove it: a new one is made)", p, id)
	}
	return id, nil
}

// presentPath notes that a restore found task's store already on this
// volume (see RecordPresent).
func (s *Store) presentPath(task string) string {
	return filepath.Join(s.root, "."+task+".store-present")
}

// RecordPresent notes, without any storage call, that a restore at pod
// start found task's store already in place on the volume of this local
// dir (restore --if-not-exists skipped). The note holds the volume's id:
// an agent on this local dir may then take the task over from an owner
// whose record names no volume (written by a ckpt older than volume
// identities), as a restoring takeover does; an owner on this volume is
// taken over by its id alone.
func (s *Store) RecordPresent(task string) error {
	if err := manifests.ValidName("task", task); err != nil {
		return err
	}
	id, err := s.VolumeID()
	if err != nil {
		return err
	}
	p := s.presentPath(task)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o644); err != nil {
		return fmt.Errorf("local dir: record the store of task %s: %w", task, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("local dir: record the store of task %s: %w", task, err)
	}
	return nil
}

// PresentOn returns the volume id RecordPresent noted for task; ok is
// false when no skipped restore noted one.
func (s *Store) PresentOn(task string) (volume string, ok bool) {
	id, err := readID(s.presentPath(task))
	return id, err == nil
}
