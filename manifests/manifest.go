// Package manifests owns the checkpoint manifest: its format, the storage
// layout of a job, the conditional commit that makes a checkpoint complete,
// and retention (garbage collection is package gc).
//
// The rule everything else leans on: objects first, manifest last. A
// checkpoint is complete if and only if its manifest exists, and a manifest
// is written only after every object it names is durable.
package manifests

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/internal/names"
)

// FormatVersion is the manifest format this build writes by default: 2, a
// compact encoding whose new content ids are BLAKE3 (see codec.go). This
// build reads formats 1 and 2; Manifest.Format chooses the one written, and
// format 1 (JSON, SHA-256 only) is what a ckpt older than format 2 reads.
const FormatVersion = 2

// Formats this build reads and writes.
const (
	Format1 = 1 // JSON body, SHA-256 content ids
	Format2 = 2 // compressed binary file table, BLAKE3 and SHA-256 ids side by side
)

// MaxManifestBytes bounds the size of a manifest this build will read.
const MaxManifestBytes = 256 << 20

// Kind says how a file of a snapshot is stored. It is the engines'
// type: the engine that classifies a file and the manifest that records
// it speak of one kind, and package engines (which plugins link) does not
// link manifests.
type Kind = engines.Kind

const (
	// Shared files (*.sst, *.blob) are immutable: content-addressed objects
	// under <job>/shared/, uploaded once and referenced by many checkpoints.
	Shared = engines.Shared
	// Private files (MANIFEST-*, CURRENT, OPTIONS-*, WAL, ...) are stored with
	// each checkpoint, inline in the manifest when small.
	Private = engines.Private
)

// File is one file of a checkpoint.
type File struct {
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
	Size int64  `json:"size"`
	// SHA256 or BLAKE3 holds the file's hash (hex), exactly one of them:
	// the algorithm is recorded per file (see digest.go).
	SHA256 string `json:"sha256"`
	BLAKE3 string `json:"blake3,omitempty"`
	// Key is the object holding the bytes; empty when Inline holds them.
	Key    string `json:"key,omitempty"`
	Inline []byte `json:"inline,omitempty"`
	// Uploaded is true when this checkpoint wrote the object itself, false
	// when it reused an object of an earlier retained checkpoint.
	Uploaded bool `json:"uploaded"`
}

// ContentID names a shared file's content: its digest and its size.
func (f File) ContentID() string { return ContentID(f.Digest(), f.Size) }

// ContentID joins a digest (see digest.go) and a size into a content id.
func ContentID(digest string, size int64) string {
	return digest + "-" + strconv.FormatInt(size, 10)
}

// Manifest describes one complete checkpoint of one task.
type Manifest struct {
	// Format is the encoding Encode writes (0: FormatVersion) and Decode
	// read. It is not part of the body.
	Format int `json:"-"`

	Job        string    `json:"job"`
	Task       string    `json:"task"`
	Checkpoint uint64    `json:"checkpoint"`
	Parent     uint64    `json:"parent,omitempty"` // newest complete checkpoint when this one started
	Created    time.Time `json:"created"`
	Engine     string    `json:"engine,omitempty"`
	AgentID    string    `json:"agent_id,omitempty"`
	// Tasks, when set, makes this a job-wide checkpoint: every task of the
	// job at this checkpoint, sorted, this task included (see JobStatus).
	// Manifests without it are valid and are not job-wide checkpoints.
	Tasks []string `json:"tasks,omitempty"`
	// Epoch is the ownership epoch of the agent that wrote the manifest
	// (0: written before ownership existed); Node is that agent's node.
	// A manifest of epoch >= 1 is stored at ManifestKeyOf(..., Epoch) and
	// is used only while no newer owner fences it (see owner.go).
	Epoch uint64 `json:"epoch,omitempty"`
	Node  string `json:"node,omitempty"`
	Files []File `json:"files"`

	// FullSize is the bytes of every file the checkpoint references: what a
	// restore fetches (Flink's lastCheckpointFullSize).
	FullSize int64 `json:"full_size"`
	// CheckpointSize is the bytes this checkpoint wrote to storage: new
	// objects plus the manifest itself (Flink's lastCheckpointSize).
	CheckpointSize int64 `json:"checkpoint_size"`
	FilesUploaded  int   `json:"files_uploaded"`
	FilesReused    int   `json:"files_reused"`
}

// envelope is the stored form: the body's raw bytes and their checksum, so
// the checksum covers exactly the bytes written, whatever a decoder keeps.
type envelope struct {
	Format int             `json:"format"`
	SHA256 string          `json:"sha256"`
	Body   json.RawMessage `json:"body"`
}

// Encode returns the stored form of m in m.Format (0: FormatVersion, which
// it then records in m.Format). It sets m.CheckpointSize to objectBytes
// plus the length of the encoding itself. Format 1 holds SHA-256 ids only:
// a file with a BLAKE3 hash is an error there.
func (m *Manifest) Encode(objectBytes int64) ([]byte, error) {
	format := m.Format
	if format == 0 {
		format = FormatVersion
	}
	var table []byte
	switch format {
	case Format1:
		for _, f := range m.Files {
			if f.BLAKE3 != "" {
				return nil, fmt.Errorf("encode manifest: format 1 cannot name the blake3 content of %q: write format 2 (or hash the file with sha256)", f.Name)
			}
		}
	case Format2:
		var err error
		if table, err = m.encodeTable(); err != nil {
			return nil, fmt.Errorf("encode manifest: %w", err)
		}
	default:
		return nil, fmt.Errorf("encode manifest: unknown format %d (this ckpt writes formats 1 and 2)", format)
	}
	m.Format = format
	if format == Format2 {
		return m.encode2(objectBytes, table)
	}
	var out []byte
	size := objectBytes
	// The manifest counts its own bytes; the length of the number can change
	// the length of the encoding, so iterate to the fixed point (2-3 rounds).
	for range 8 {
		m.CheckpointSize = size
		body, err := json.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("encode manifest: %w", err)
		}
		sum := sha256.Sum256(body)
		out, err = json.Marshal(envelope{Format: format, SHA256: hex.EncodeToString(sum[:]), Body: body})
		if err != nil {
			return nil, fmt.Errorf("encode manifest: %w", err)
		}
		if objectBytes+int64(len(out)) == size {
			return out, nil
		}
		size = objectBytes + int64(len(out))
	}
	return out, nil
}

// encode2 is Encode's format 2, the file table compressed already. The
// fixed point of a manifest that counts its own bytes is found on the
// small header alone (the length of the rest is known without building
// it), then the stored form is built once.
func (m *Manifest) encode2(objectBytes int64, table []byte) ([]byte, error) {
	size := objectBytes
	var header []byte
	for range 8 {
		m.CheckpointSize = size
		var err error
		if header, err = m.encodeHeader(); err != nil {
			return nil, fmt.Errorf("encode manifest: %w", err)
		}
		n := int64(envelope2Len(len(header), len(table)))
		if objectBytes+n == size {
			break
		}
		size = objectBytes + n
	}
	return appendEnvelope2(header, table), nil
}

// Decode parses and checks a stored manifest of format 1 or 2: format
// version, checksum, and every field a restore or GC trusts (see
// Validate). Storage is not trusted.
func Decode(data []byte) (*Manifest, error) {
	if len(data) > MaxManifestBytes {
		return nil, fmt.Errorf("manifest of %d bytes exceeds the %d byte limit", len(data), MaxManifestBytes)
	}
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, fmt.Errorf("manifest is not valid JSON: %w", err)
	}
	if env.Format != Format1 && env.Format != Format2 {
		return nil, fmt.Errorf("manifest format %d is not supported by this ckpt (it reads formats 1 and 2); upgrade ckpt", env.Format)
	}
	sum := sha256.Sum256(env.Body)
	if hex.EncodeToString(sum[:]) != env.SHA256 {
		return nil, errors.New("manifest checksum mismatch: the manifest is corrupt or was tampered with")
	}
	var m *Manifest
	var err error
	if env.Format == Format1 {
		m, err = decodeBody1(env.Body)
	} else {
		m, err = decodeBody2(env.Body)
	}
	if err != nil {
		return nil, err
	}
	m.Format = env.Format
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeBody1 parses format 1's JSON body.
func decodeBody1(body []byte) (*Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("manifest body: %w", err)
	}
	// JSON drops empty inline bytes (omitempty): an empty private file
	// without a key is inline and empty (Pebble's marker files).
	for i := range m.Files {
		f := &m.Files[i]
		if f.Kind == Private && f.Key == "" && f.Inline == nil && f.Size == 0 {
			f.Inline = []byte{}
		}
	}
	return &m, nil
}

// ValidName checks a job or task name: [A-Za-z0-9][A-Za-z0-9._-]{0,127}.
func ValidName(what, name string) error { return names.Valid(what, name) }

// ValidFileName checks that a snapshot file name is one plain path element:
// not empty, not "." or "..", no separator, no NUL, at most 255 bytes.
func ValidFileName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 255 || strings.ContainsAny(name, "/\\\x00") {
		return fmt.Errorf("unsafe file name %q", name)
	}
	return nil
}

func validSHA(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// Validate checks everything a reader relies on: names, that every file
// name is a plain path element, that shared keys are the content address of
// their hash and size, that private keys belong to this checkpoint, that
// inline bytes match their size and hash, and that the totals add up.
// A key may carry a FreshKey suffix: the writer stored those bytes under a
// new key because the usual one was marked for deletion (see GC).
func (m *Manifest) Validate() error {
	if err := m.validateHeader(); err != nil {
		return err
	}
	seen := make(map[string]bool, len(m.Files))
	privateKeys := map[string]bool{}
	var full int64
	for _, f := range m.Files {
		if err := ValidFileName(f.Name); err != nil {
			return fmt.Errorf("manifest of %s checkpoint %d: %w", m.Task, m.Checkpoint, err)
		}
		if seen[f.Name] {
			return fmt.Errorf("manifest of %s checkpoint %d: file %q listed twice", m.Task, m.Checkpoint, f.Name)
		}
		seen[f.Name] = true
		if err := m.checkFile(f, privateKeys); err != nil {
			return err
		}
		full += f.Size
	}
	if full != m.FullSize {
		return fmt.Errorf("manifest: full size %d does not equal the sum of its files %d", m.FullSize, full)
	}
	return nil
}

// checkFile is Validate's check of one file of m, but for its name (a
// plain path element, not listed twice), which the caller checks.
// privateKeys holds the keys of the private objects seen so far.
func (m *Manifest) checkFile(f File, privateKeys map[string]bool) error {
	if f.Size < 0 || (f.SHA256 != "" && f.BLAKE3 != "") || !ValidDigest(f.Digest()) {
		return fmt.Errorf("manifest: file %q: bad size or hash", f.Name)
	}
	if f.BLAKE3 != "" && m.Format == Format1 {
		return fmt.Errorf("manifest: file %q: a format 1 manifest holds sha256 ids only", f.Name)
	}
	switch f.Kind {
	case Shared:
		if !isKeyOrFresh(f.Key, SharedKey(m.Job, f.Digest(), f.Size)) || f.Inline != nil {
			return fmt.Errorf("manifest: shared file %q: key %q is not its content address", f.Name, f.Key)
		}
	case Private:
		if f.Inline != nil {
			if f.Key != "" || int64(len(f.Inline)) != f.Size {
				return fmt.Errorf("manifest: private file %q: inline bytes do not match its size", f.Name)
			}
			if err := f.Check(SumBytes(f.Alg(), f.Inline)); err != nil {
				return fmt.Errorf("manifest: private file %q: inline bytes: %w", f.Name, err)
			}
		} else if !isKeyOrFresh(f.Key, PrivateKeyOf(m.Job, m.Task, m.Checkpoint, m.Epoch, f.Name)) {
			return fmt.Errorf("manifest: private file %q: key %q is outside its checkpoint", f.Name, f.Key)
		} else if privateKeys[f.Key] {
			return fmt.Errorf("manifest: private file %q: key %q names another file's object too", f.Name, f.Key)
		} else {
			privateKeys[f.Key] = true
		}
	default:
		return fmt.Errorf("manifest: file %q: unknown kind %q", f.Name, f.Kind)
	}
	return nil
}
