package wal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// ErrChainEnded is wrapped by the error of a round that found the chain of
// the current checkpoint cannot go on (a gap, a log that does not continue
// the snapshot's copy, a seq another writer took). Nothing more is shipped
// until the next Rebase.
var ErrChainEnded = errors.New("the checkpoint's WAL chain ended")

// tailBytes is how many bytes before a snapshot copy's end Rebase compares
// with the live log, to know that the live file continues that copy.
const tailBytes = 4096

// maxRoundPasses bounds the reads of one round while logs hold more than
// a segment's worth of new records (each pass reads up to MaxSegment a
// log): a store that writes faster than the shipper ships does not make a
// round endless.
const maxRoundPasses = 256

// LogEnd is where a checkpoint's copy of a log file ends on a record
// boundary (ScanCopy finds it): the WAL of that checkpoint continues the
// live log from End.
type LogEnd struct {
	Name string
	Log  uint64
	End  int64
	// Tail is the copy's bytes just before End (at most 4 KiB): the live
	// file must hold the same ones there to be the file the copy was
	// taken of.
	Tail []byte
}

// ScanCopy finds where the copy of log file name (size bytes, read through
// r) ends on a record boundary: after its last complete record, before a
// torn record or a recycled file's stale tail. It reads the copy once, a
// MiB at a time.
func ScanCopy(r io.ReaderAt, name string, size int64) (LogEnd, error) {
	num, ok := ParseLogName(name)
	if !ok {
		return LogEnd{}, fmt.Errorf("%s is not the name of a write-ahead log", name)
	}
	chunk := int64(1 << 20)
	var pos int64
	for pos < size {
		want := min(chunk, size-pos)
		buf := make([]byte, want)
		n, err := r.ReadAt(buf, pos)
		if err != nil && !errors.Is(err, io.EOF) {
			return LogEnd{}, fmt.Errorf("read the checkpoint's copy of log %s: %w", name, err)
		}
		buf = buf[:n]
		s := ScanRecords(buf, pos, uint32(num), 0)
		if s.Stop != "end" || pos+int64(n) >= size || int64(n) < want {
			pos = s.End
			break
		}
		if s.End == pos {
			chunk *= 2 // one record larger than the chunk
			continue
		}
		pos = s.End
	}
	e := LogEnd{Name: name, Log: num, End: pos}
	k := min(pos, tailBytes)
	e.Tail = make([]byte, k)
	if _, err := r.ReadAt(e.Tail, pos-k); err != nil && !errors.Is(err, io.EOF) {
		return LogEnd{}, fmt.Errorf("read the checkpoint's copy of log %s: %w", name, err)
	}
	return e, nil
}

// ShipperConfig configures a Shipper.
type ShipperConfig struct {
	Store     storage.Store
	Job, Task string
	// Dir is the live store's directory, open; the caller keeps it open
	// while the Shipper is used. Logs are opened through it, without
	// following a symlink.
	Dir *os.File
	// MaxSegment bounds a segment's bytes (default 16 MiB).
	MaxSegment int64
	// Owner, when set, is the uid every log file must be owned by.
	Owner *uint32
	// Agent and Node name the writer in each WAL manifest.
	Agent, Node string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Shipper ships one task's write-ahead log between checkpoints: each
// round (Ship) uploads the complete records written since the last round,
// content-addressed, and commits a WAL manifest naming them, conditionally
// and last, in the chain of the newest checkpoint Rebase named (see the
// format in manifest.go). It is not safe for concurrent use.
//
// The rules it holds:
//
//   - Objects first, manifest last: every segment is Put (durable) before
//     the manifest naming it is created, and the tailer moves past a
//     segment only once that manifest exists. A round that fails ships
//     its records again next time.
//   - A segment ends on a record boundary (Tailer, ScanRecords).
//   - Fencing: before each commit the ownership records are listed; a
//     newer owner stops the shipper for good (ErrFenced), and it commits
//     nothing more. A takeover after that look and before the commit is
//     the residual window, as for checkpoints: the manifest committed then
//     has a through time before the takeover (through is taken before the
//     look), and the next round stops.
//   - A gap (a log gone before it was read to its end) ends the chain of
//     the checkpoint: records after it would not continue those before.
//     Nothing more is shipped until the next Rebase.
type Shipper struct {
	cfg ShipperConfig
	tl  *Tailer

	n, epoch, seq uint64 // the chain: checkpoint, owner's epoch, last seq committed
	ended         error  // why the chain ended (wraps ErrChainEnded), until Rebase
	fenced        error  // a *manifests.FencedError, for good
	through       time.Time

	// beforeCommit, when set (tests), runs between the owner check and
	// the commit.
	beforeCommit func()
}

// Round is what one Ship did.
type Round struct {
	Checkpoint uint64 // the chain's checkpoint (0: no chain)
	Seq        uint64 // the WAL manifest committed (0: none)
	Segments   int
	Bytes      int64
	Records    int
	// Through is the round's through time: every write synced before it
	// is shipped (zero when the round could not say so).
	Through time.Time
}

// NewShipper returns a shipper with no chain: it ships nothing until
// Rebase names a checkpoint.
func NewShipper(cfg ShipperConfig) *Shipper {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxSegment <= 0 {
		cfg.MaxSegment = 16 << 20
	}
	tl := NewTailer(cfg.Dir, cfg.MaxSegment)
	if cfg.Owner != nil {
		tl.RequireOwner(*cfg.Owner)
	}
	return &Shipper{cfg: cfg, tl: tl}
}

// Checkpoint returns the checkpoint whose chain the shipper extends (0:
// none), and the error that ended it, if one did.
func (s *Shipper) Checkpoint() (uint64, error) { return s.n, s.ended }

// Through is the newest through time shipped: every write the store
// synced before it is in storage (in the checkpoint or its WAL). It is
// the last committed manifest's, or a later round's that found nothing
// new; zero before the first round of a chain.
func (s *Shipper) Through() time.Time { return s.through }

// Rebase starts the chain of checkpoint n, just committed by the owner of
// epoch, whose snapshot held the logs given (ScanCopy of each copy). The
// newest of them continues from where its copy ends, if the live file of
// that name still holds the copy's last bytes there; the older ones were
// sealed before the snapshot was taken (an engine appends to its newest
// log only), and logs older than the newest copy that the snapshot does
// not hold are flushed: neither gets anything shipped. Logs newer than
// the snapshot's are shipped from their start. Seq restarts at 1.
//
// When the chain cannot start (the snapshot holds no log, or the newest
// one is gone or is another file), Rebase returns an error wrapping
// ErrChainEnded and the shipper ships nothing until the next Rebase.
func (s *Shipper) Rebase(n, epoch uint64, logs []LogEnd) error {
	if s.fenced != nil {
		return s.fenced
	}
	s.n, s.epoch, s.seq, s.ended, s.through = n, epoch, 0, nil, time.Time{}
	// Every log held for the last chain (those read to their seal and
	// gone included) may hold writes of this one.
	old := map[string]*logState{}
	for name, ls := range s.tl.retired {
		old[name] = ls
	}
	for name, ls := range s.tl.logs {
		if r := old[name]; r != nil && r.f != ls.f && r.f != nil {
			r.f.Close()
		}
		old[name] = ls
	}
	s.tl.logs, s.tl.retired = map[string]*logState{}, nil
	defer func() {
		// The files held for the last chain, and not for this one.
		held := map[*os.File]bool{}
		for _, ls := range s.tl.logs {
			held[ls.f] = true
			s.tl.maxSeen = max(s.tl.maxSeen, ls.log)
		}
		for _, ls := range old {
			if ls.f != nil && !held[ls.f] {
				ls.f.Close()
			}
		}
	}()
	fail := func(format string, args ...any) error {
		s.ended = fmt.Errorf("checkpoint %d: %s: %w", n, fmt.Sprintf(format, args...), ErrChainEnded)
		return s.ended
	}
	if len(logs) == 0 {
		return fail("its snapshot holds no write-ahead log, so the writes after it cannot be placed (the engine's checkpoint must include its logs)")
	}
	newest := logs[0]
	inSnap := map[string]LogEnd{}
	for _, l := range logs {
		inSnap[l.Name] = l
		if l.Log > newest.Log || (l.Log == newest.Log && l.Name > newest.Name) {
			newest = l
		}
	}
	names, err := s.tl.listLogs()
	if err != nil {
		return err
	}
	found := false
	for _, name := range names {
		num, _ := ParseLogName(name)
		l, held := inSnap[name]
		if !held && num > newest.Log {
			continue // newer than the snapshot: shipped from its start (below)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(int(s.cfg.Dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("stat log %s: %w", name, err)
		}
		ls := &logState{log: num, dev: uint64(st.Dev), ino: st.Ino}
		s.tl.logs[name] = ls
		if name != newest.Name {
			ls.shipped, ls.sealed = l.End, true // nothing more to ship of it
			continue
		}
		f, err := s.continues(name, l, ls)
		if err != nil {
			return err
		}
		if f == nil {
			delete(s.tl.logs, name)
			return fail("log %s in the store does not hold the checkpoint's copy of it (%d bytes): it is another file now", name, l.End)
		}
		ls.shipped, ls.f = l.End, f
		found = true
	}
	// Logs newer than the snapshot are shipped from their start; those
	// held open already (Track, Adopt) stay held, even if the engine
	// deleted them meanwhile: they hold writes made after the snapshot.
	for name, o := range old {
		if _, ok := s.tl.logs[name]; ok || o.f == nil || o.log <= newest.Log {
			continue
		}
		s.tl.logs[name] = &logState{log: o.log, dev: o.dev, ino: o.ino, f: o.f}
	}
	if !found {
		// Gone from the dir since the snapshot (the engine rotated and
		// deleted or recycled it), it may still be open from the last
		// chain: then it is read to its seal through that handle.
		if ls := old[newest.Name]; ls != nil && ls.f != nil && ls.log == newest.Log {
			if ok, err := holds(ls.f, newest); err != nil {
				return err
			} else if ok {
				s.tl.logs[newest.Name] = &logState{log: ls.log, dev: ls.dev, ino: ls.ino, shipped: newest.End, f: ls.f}
				found = true
			}
		}
	}
	if !found {
		return fail("log %s, the newest in its snapshot, is gone from the store: the writes after the checkpoint in it were not seen", newest.Name)
	}
	return nil
}

// holds reports whether f holds l.Tail just before l.End.
func holds(f *os.File, l LogEnd) (bool, error) {
	got := make([]byte, len(l.Tail))
	n, err := f.ReadAt(got, l.End-int64(len(l.Tail)))
	if errors.Is(err, os.ErrClosed) {
		return false, nil // let go of already
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("read log %s: %w", l.Name, err)
	}
	return n == len(got) && bytes.Equal(got, l.Tail), nil
}

// Adopt takes a log file Watch opened when it appeared: the shipper holds
// it from then on (or closes it, if it holds the file already), so that
// it is read to its end even if the engine deletes it before a round.
func (s *Shipper) Adopt(f *os.File) {
	name := f.Name()
	num, ok := ParseLogName(name)
	var st unix.Stat_t
	if !ok || unix.Fstat(int(f.Fd()), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || (s.tl.ownerSet && st.Uid != s.tl.owner) {
		f.Close()
		return
	}
	ls := s.tl.logs[name]
	switch {
	case ls == nil && num <= s.tl.maxSeen:
		// Seen already, and done with (shipped to its seal and dropped):
		// a late event must not make it new again.
		f.Close()
	case ls == nil:
		s.tl.maxSeen = max(s.tl.maxSeen, num)
		// A log the shipper has not seen: while a chain runs, it is read
		// from its start; else only held (see Track).
		idle := s.n == 0 || s.ended != nil
		s.tl.logs[name] = &logState{log: num, dev: uint64(st.Dev), ino: st.Ino, sealed: idle, f: f}
	case ls.f == nil && ls.dev == uint64(st.Dev) && ls.ino == st.Ino:
		ls.f = f
	default:
		f.Close()
	}
}

// Track opens and holds the logs of the dir that the shipper does not
// hold yet, and lets go of those gone, without reading or shipping
// anything: while no chain runs (before the first Rebase, or after a gap),
// it keeps the logs a coming checkpoint's snapshot may continue open, so
// that Rebase finds them even if the engine deleted them meanwhile.
func (s *Shipper) Track() error {
	if s.n != 0 && s.ended == nil {
		return nil // a running chain holds its logs
	}
	names, err := s.tl.listLogs()
	if err != nil {
		return err
	}
	present := map[string]bool{}
	for _, name := range names {
		present[name] = true
		if ls := s.tl.logs[name]; ls != nil && ls.f != nil {
			continue
		}
		fd, err := unix.Openat(int(s.cfg.Dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			continue // gone, or not a file: nothing to hold
		}
		f := os.NewFile(uintptr(fd), name)
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || (s.tl.ownerSet && st.Uid != s.tl.owner) {
			f.Close()
			continue
		}
		num, _ := ParseLogName(name)
		s.tl.logs[name] = &logState{log: num, dev: uint64(st.Dev), ino: st.Ino, sealed: true, f: f}
		s.tl.maxSeen = max(s.tl.maxSeen, num)
	}
	for name, ls := range s.tl.logs {
		if !present[name] {
			if ls.f != nil {
				ls.f.Close()
			}
			delete(s.tl.logs, name)
		}
	}
	return nil
}

// continues opens the live log name and returns it if it is the file of
// ls and holds l.Tail just before l.End; nil if not.
func (s *Shipper) continues(name string, l LogEnd, ls *logState) (*os.File, error) {
	fd, err := unix.Openat(int(s.cfg.Dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open log %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat log %s: %w", name, err)
	}
	if uint64(st.Dev) != ls.dev || st.Ino != ls.ino || st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, nil
	}
	if s.tl.ownerSet && st.Uid != s.tl.owner {
		f.Close()
		return nil, fmt.Errorf("log %s is owned by uid %d, not by uid %d that owns the store: it is not read", name, st.Uid, s.tl.owner)
	}
	ok, err := holds(f, l)
	if err != nil || !ok {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Close releases the log files the shipper holds open.
func (s *Shipper) Close() { s.tl.Close() }

// Ship runs one round: it takes the time, reads every log's complete
// records since the last commit, uploads them as segments, checks that
// this owner still owns the task, and commits the next WAL manifest. A
// round that finds nothing new commits nothing, and its time becomes the
// shipper's Through. A gap ends the chain (the error wraps ErrChainEnded
// and is a Gap); a newer owner stops the shipper (ErrFenced). With no
// chain (no Rebase yet, or it ended), Ship does nothing.
func (s *Shipper) Ship(ctx context.Context) (Round, error) {
	if s.fenced != nil {
		return Round{}, s.fenced
	}
	if s.n == 0 || s.ended != nil {
		return Round{Checkpoint: s.n}, nil
	}
	r := Round{Checkpoint: s.n}
	// Through is taken before any log is read: every write synced before
	// it is in what the reads below find.
	now := s.cfg.Now()
	saved := s.tl.save()
	undo := func() { s.tl.logs = saved }
	var refs []SegmentRef
	complete := false
	for pass := 0; pass < maxRoundPasses && !complete; pass++ {
		segs, gaps, err := s.tl.Next()
		if err != nil {
			undo()
			return r, err
		}
		if len(gaps) > 0 {
			undo()
			g := gaps[0]
			s.ended = fmt.Errorf("checkpoint %d: %w: %w", s.n, g, ErrChainEnded)
			return r, &chainGap{Gap: g, err: s.ended}
		}
		complete = true
		for _, seg := range segs {
			sum := sha256.Sum256(seg.Data)
			ref := SegmentRef{Name: seg.Name, Log: seg.Log, Start: seg.Start, End: seg.End,
				Records: seg.Records, Sealed: seg.Sealed, SHA256: hex.EncodeToString(sum[:])}
			key := SegmentKey(s.cfg.Job, s.cfg.Task, s.n, s.epoch, ref.SHA256, ref.Size())
			if err := s.cfg.Store.Put(ctx, key, bytes.NewReader(seg.Data), ref.Size()); err != nil {
				undo()
				return r, fmt.Errorf("upload wal segment %s [%d, %d): %w", seg.Name, seg.Start, seg.End, err)
			}
			refs = append(refs, ref)
			r.Segments++
			r.Bytes += ref.Size()
			r.Records += ref.Records
			s.tl.Ack(seg) // provisional: undone unless the manifest is committed
			if seg.More {
				complete = false
			}
		}
	}
	if len(refs) == 0 {
		s.through = now
		r.Through = now
		return r, nil
	}
	through := now
	if !complete {
		// More than the round could read: the writes before now are not
		// all shipped. The through time stays where it was.
		through = s.through
		if through.IsZero() {
			through = time.UnixMilli(1)
		}
	}
	// Still the owner? A newer owner fences this shipper: commit nothing.
	if err := manifests.CheckOwner(ctx, s.cfg.Store, s.cfg.Job, manifests.Owner{Task: s.cfg.Task, Epoch: s.epoch}); err != nil {
		undo()
		if errors.Is(err, manifests.ErrFenced) {
			s.fenced = err
		}
		return r, err
	}
	if s.beforeCommit != nil {
		s.beforeCommit()
	}
	m := &Manifest{Job: s.cfg.Job, Task: s.cfg.Task, Checkpoint: s.n, Epoch: s.epoch, Seq: s.seq + 1,
		Agent: s.cfg.Agent, Node: s.cfg.Node, ThroughUnixMs: max(through.UnixMilli(), 1), Segments: refs}
	// Segments first, manifest last: the WAL extends from this write on.
	if err := Commit(ctx, s.cfg.Store, m); err != nil {
		if ok := s.landed(ctx, m); !ok {
			undo()
			if errors.Is(err, storage.ErrExists) {
				s.ended = fmt.Errorf("checkpoint %d: wal manifest %d was written by another writer: %w", s.n, m.Seq, ErrChainEnded)
				return r, s.ended
			}
			return r, err
		}
	}
	s.seq = m.Seq
	if complete {
		s.through = now
	}
	r.Seq, r.Through = m.Seq, s.through
	return r, nil
}

// landed reports whether the WAL manifest m is in storage as written: a
// commit whose reply was lost may have landed.
func (s *Shipper) landed(ctx context.Context, m *Manifest) bool {
	got, err := Load(ctx, s.cfg.Store, m.Job, m.Task, m.Checkpoint, m.Epoch, m.Seq)
	return err == nil && reflect.DeepEqual(got, m)
}

// save returns a copy of the tailer's positions.
func (t *Tailer) save() map[string]*logState {
	out := make(map[string]*logState, len(t.logs))
	for name, ls := range maps.All(t.logs) {
		c := *ls
		out[name] = &c
	}
	return out
}

// chainGap is the error of a round that found a gap: it is a Gap (errors.As)
// and wraps ErrChainEnded.
type chainGap struct {
	Gap
	err error
}

func (e *chainGap) Error() string { return e.err.Error() }
func (e *chainGap) Unwrap() error { return e.err }
func (e *chainGap) As(target any) bool {
	if g, ok := target.(*Gap); ok {
		*g = e.Gap
		return true
	}
	return false
}
