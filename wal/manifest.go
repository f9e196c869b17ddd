package wal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// The WAL of a checkpoint, in storage. Between checkpoints the agent ships
// the store's write-ahead log in segments; each commit of shipped segments
// is a WAL manifest, named after the checkpoint it extends and the epoch of
// the owner that wrote it, beside that checkpoint's own objects:
//
//	<checkpoint prefix>/wal.e<epoch:020>/m/<seq:020>              WAL manifest seq (1, 2, ...), created conditionally
//	<checkpoint prefix>/wal.e<epoch:020>/seg/<sha256>-<size>      a segment's bytes, content-addressed
//
// (wal/ in place of wal.e<epoch:020>/ for epoch 0). The WAL of checkpoint N
// continues N's snapshot: for a log file the snapshot holds, the first
// segment starts where the snapshot's copy ends on a record boundary; a log
// newer than the snapshot starts at 0. Manifest seq k+1 continues seq k:
// the segments of one log are contiguous across the chain, and a sealed log
// gets no segment after its seal. A chain ends at its first missing seq.
//
// Like checkpoints, WAL manifests are written last (after every segment
// they name is durable) and conditionally (a second writer of the same seq
// fails), and only by the task's owner: a reader uses the WAL of epoch E
// only up to where the next owner resumed (see the restore side).

// Format1 is the only WAL manifest format this ckpt writes and reads.
const Format1 = 1

// MaxManifestBytes bounds a stored WAL manifest a reader accepts.
const MaxManifestBytes = 4 << 20

// maxSegmentsPerManifest bounds the segments one WAL manifest names.
const maxSegmentsPerManifest = 10000

// Prefix is where the WAL of checkpoint n written by the owner of epoch
// lives.
func Prefix(job, task string, n, epoch uint64) string {
	if epoch == 0 {
		return manifests.CheckpointPrefix(job, task, n) + "wal/"
	}
	return fmt.Sprintf("%swal.e%020d/", manifests.CheckpointPrefix(job, task, n), epoch)
}

// ManifestKey is where WAL manifest seq of checkpoint n by epoch lives.
func ManifestKey(job, task string, n, epoch, seq uint64) string {
	return fmt.Sprintf("%sm/%020d", Prefix(job, task, n, epoch), seq)
}

// SegmentKey is where a segment of the given SHA-256 and size of checkpoint
// n's WAL by epoch lives.
func SegmentKey(job, task string, n, epoch uint64, sha string, size int64) string {
	return fmt.Sprintf("%sseg/%s-%d", Prefix(job, task, n, epoch), sha, size)
}

// SegmentRef names one shipped segment: the bytes [Start, End) of log file
// Name (number Log), whose SHA-256 is SHA256. Its object is
// SegmentKey(..., SHA256, End-Start).
type SegmentRef struct {
	Name    string `json:"name"`
	Log     uint64 `json:"log"`
	Start   int64  `json:"start"`
	End     int64  `json:"end"`
	Records int    `json:"records"`
	Sealed  bool   `json:"sealed,omitempty"`
	SHA256  string `json:"sha256"`
}

// Size is the segment's bytes.
func (r SegmentRef) Size() int64 { return r.End - r.Start }

// Manifest is one commit of a checkpoint's WAL.
type Manifest struct {
	Format     int    `json:"format"`
	Job        string `json:"job"`
	Task       string `json:"task"`
	Checkpoint uint64 `json:"checkpoint"`
	Epoch      uint64 `json:"epoch"`
	Seq        uint64 `json:"seq"`
	Agent      string `json:"agent,omitempty"`
	Node       string `json:"node,omitempty"`
	// ThroughUnixMs: every write the store had synced before this instant
	// (Unix milliseconds, the agent's clock, taken before the logs were
	// read) is in the segments of this manifest or of those before it.
	ThroughUnixMs int64        `json:"through_unix_ms"`
	Segments      []SegmentRef `json:"segments"`
}

// Key is where m is stored.
func (m *Manifest) Key() string {
	return ManifestKey(m.Job, m.Task, m.Checkpoint, m.Epoch, m.Seq)
}

// SegmentKey is where segment r of m is stored.
func (m *Manifest) SegmentKey(r SegmentRef) string {
	return SegmentKey(m.Job, m.Task, m.Checkpoint, m.Epoch, r.SHA256, r.Size())
}

type envelope struct {
	Format int             `json:"format"`
	SHA256 string          `json:"sha256"`
	Body   json.RawMessage `json:"body"`
}

// Encode returns the stored form of m (Format1), after checking it.
func (m *Manifest) Encode() ([]byte, error) {
	m.Format = Format1
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("encode wal manifest: %w", err)
	}
	body, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode wal manifest: %w", err)
	}
	sum := sha256.Sum256(body)
	return json.Marshal(envelope{Format: Format1, SHA256: hex.EncodeToString(sum[:]), Body: body})
}

// Decode parses and checks a stored WAL manifest: format, checksum and
// every field a restore trusts. Storage is not trusted.
func Decode(data []byte) (*Manifest, error) {
	if len(data) > MaxManifestBytes {
		return nil, fmt.Errorf("wal manifest of %d bytes exceeds the %d byte limit", len(data), MaxManifestBytes)
	}
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, fmt.Errorf("wal manifest is not valid JSON: %w", err)
	}
	if env.Format != Format1 {
		return nil, fmt.Errorf("wal manifest format %d is not one this ckpt reads (1): upgrade ckpt", env.Format)
	}
	sum := sha256.Sum256(env.Body)
	if hex.EncodeToString(sum[:]) != env.SHA256 {
		return nil, errors.New("wal manifest checksum mismatch: the object is corrupt")
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(env.Body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("wal manifest body: %w", err)
	}
	if m.Format != env.Format {
		return nil, fmt.Errorf("wal manifest body says format %d, its envelope %d", m.Format, env.Format)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Validate checks the fields a restore trusts: names, numbers, and that
// the segments of one log are contiguous and end at most at its seal.
func (m *Manifest) Validate() error {
	if err := manifests.ValidName("job", m.Job); err != nil {
		return fmt.Errorf("wal manifest: %w", err)
	}
	if err := manifests.ValidName("task", m.Task); err != nil {
		return fmt.Errorf("wal manifest: %w", err)
	}
	if m.Checkpoint == 0 {
		return errors.New("wal manifest: checkpoint 0 is not a checkpoint")
	}
	if m.Seq == 0 {
		return errors.New("wal manifest: seq starts at 1")
	}
	if m.ThroughUnixMs <= 0 {
		return fmt.Errorf("wal manifest %d: through time %d is not a time", m.Seq, m.ThroughUnixMs)
	}
	if len(m.Segments) > maxSegmentsPerManifest {
		return fmt.Errorf("wal manifest %d names %d segments, more than %d", m.Seq, len(m.Segments), maxSegmentsPerManifest)
	}
	type end struct {
		at     int64
		sealed bool
	}
	ends := map[uint64]end{}
	for i, r := range m.Segments {
		n, ok := ParseLogName(r.Name)
		if !ok || n != r.Log {
			return fmt.Errorf("wal manifest %d, segment %d: %q is not the name of log %d", m.Seq, i, r.Name, r.Log)
		}
		if r.Start < 0 || r.End < r.Start || r.Records < 0 {
			return fmt.Errorf("wal manifest %d, segment %d of %s: bad range [%d, %d) or record count %d", m.Seq, i, r.Name, r.Start, r.End, r.Records)
		}
		if len(r.SHA256) != 64 || strings.ToLower(r.SHA256) != r.SHA256 {
			return fmt.Errorf("wal manifest %d, segment %d of %s: bad sha256 %q", m.Seq, i, r.Name, r.SHA256)
		}
		if _, err := hex.DecodeString(r.SHA256); err != nil {
			return fmt.Errorf("wal manifest %d, segment %d of %s: bad sha256 %q", m.Seq, i, r.Name, r.SHA256)
		}
		if e, seen := ends[r.Log]; seen {
			if e.sealed {
				return fmt.Errorf("wal manifest %d, segment %d: log %s has a segment after its seal", m.Seq, i, r.Name)
			}
			if r.Start != e.at {
				return fmt.Errorf("wal manifest %d, segment %d: log %s continues at %d, not at %d where its last segment ended", m.Seq, i, r.Name, r.Start, e.at)
			}
		}
		ends[r.Log] = end{at: r.End, sealed: r.Sealed}
	}
	return nil
}

// Commit writes m conditionally, last: every segment it names must be
// durable already. A second writer of the same seq gets an error wrapping
// storage.ErrExists.
func Commit(ctx context.Context, s storage.Store, m *Manifest) error {
	data, err := m.Encode()
	if err != nil {
		return err
	}
	if err := s.Create(ctx, m.Key(), bytes.NewReader(data), int64(len(data))); err != nil {
		return fmt.Errorf("commit wal manifest %d of %s/%s checkpoint %d: %w", m.Seq, m.Job, m.Task, m.Checkpoint, err)
	}
	return nil
}

// Load reads and checks WAL manifest seq of checkpoint n by epoch. A
// missing one returns an error wrapping storage.ErrNotFound.
func Load(ctx context.Context, s storage.Store, job, task string, n, epoch, seq uint64) (*Manifest, error) {
	key := ManifestKey(job, task, n, epoch, seq)
	rc, err := s.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, MaxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	m, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	if m.Job != job || m.Task != task || m.Checkpoint != n || m.Epoch != epoch || m.Seq != seq {
		return nil, fmt.Errorf("%s: it says it is wal manifest %d of %s/%s checkpoint %d epoch %d: the object was moved or tampered with", key, m.Seq, m.Job, m.Task, m.Checkpoint, m.Epoch)
	}
	return m, nil
}

// Seqs lists the seqs of the WAL manifests of checkpoint n by epoch
// present in storage, in order.
func Seqs(ctx context.Context, s storage.Store, job, task string, n, epoch uint64) ([]uint64, error) {
	prefix := Prefix(job, task, n, epoch) + "m/"
	var out []uint64
	err := s.List(ctx, prefix, func(o storage.ObjectInfo) error {
		rest := strings.TrimPrefix(o.Key, prefix)
		if len(rest) != 20 {
			return nil
		}
		seq, err := strconv.ParseUint(rest, 10, 64)
		if err == nil && seq > 0 {
			out = append(out, seq)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list wal manifests of %s/%s checkpoint %d: %w", job, task, n, err)
	}
	return out, nil
}

// Chain reads the WAL manifests of checkpoint n by epoch from seq 1 up to
// the first missing one, or up to upTo when upTo > 0, and checks that each
// continues the ones before it (per log: contiguous, nothing after a
// seal). A manifest that fails its checks fails the chain: storage is not
// trusted, and a restore does not guess.
func Chain(ctx context.Context, s storage.Store, job, task string, n, epoch, upTo uint64) ([]*Manifest, error) {
	seqs, err := Seqs(ctx, s, job, task, n, epoch)
	if err != nil {
		return nil, err
	}
	var out []*Manifest
	type end struct {
		at     int64
		sealed bool
	}
	ends := map[uint64]end{}
	for i, seq := range seqs {
		if seq != uint64(i+1) || (upTo > 0 && seq > upTo) {
			break
		}
		m, err := Load(ctx, s, job, task, n, epoch, seq)
		if err != nil {
			return nil, err
		}
		for _, r := range m.Segments {
			if e, seen := ends[r.Log]; seen {
				if e.sealed || r.Start != e.at {
					return nil, fmt.Errorf("wal manifest %d of %s/%s checkpoint %d: log %s does not continue where manifest %d left it", seq, job, task, n, r.Name, seq-1)
				}
			}
			ends[r.Log] = end{at: r.End, sealed: r.Sealed}
		}
		out = append(out, m)
	}
	return out, nil
}
