package wal

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/storage"
)

// Applying a checkpoint's WAL to its restored snapshot.
//
// The snapshot's logs end somewhere: the newest one at the record boundary
// where its copy ends (ScanRecords over it, as the ship side computed it),
// the older ones complete (a Pebble checkpoint is consistent: a log older
// than its newest was closed before the newer one was written). Apply
// extends that state manifest by manifest and keeps it a prefix of what the
// store wrote, which a replay then applies batch by batch:
//
//   - A segment of a log the state holds starts where that log ends; a new
//     log (numbered above every log held) starts at 0; and a new log is
//     placed only when every log before it is complete (sealed, by the
//     engine's trailer or by the snapshot). Anything else is a hole: the
//     writes between are not in storage. Apply stops before the manifest
//     that holds it, and places none of its segments nor any later one, so
//     the engine never replays a later log after a missing piece.
//   - Every segment object is read whole and checked against its size and
//     SHA-256 before any byte of it is written. A bad or missing segment
//     fails the apply (invariant 6: a bad remote object fails the restore
//     loudly). Its manifest says the segment was durable before the
//     manifest was committed, so a bad one is damaged storage, not a
//     normal end of the WAL; stopping there silently would restore less
//     than the operator was promised with no word of it, while failing
//     leaves the choice to them (`ckpt restore --to checkpoint` restores
//     the checkpoint alone).
//
// Apply works only relative to dir, the restore's temporary directory,
// opening files without following links; the caller places dir after it.

// Position is where an applied WAL ends.
type Position struct {
	Checkpoint uint64 `json:"checkpoint"`
	Epoch      uint64 `json:"epoch"`
	// Seq is the last WAL manifest applied (0: none).
	Seq uint64 `json:"seq"`
	// Log and Offset: the newest log file the store holds, and where it
	// ends.
	Log    string `json:"log"`
	Offset int64  `json:"offset"`
}

// Applied is what Apply did.
type Applied struct {
	Position Position
	// ThroughUnixMs is the last applied manifest's through time (0 when
	// none was applied): every write the store synced before it is in the
	// restored store.
	ThroughUnixMs int64
	Segments      int   // segments written
	Bytes         int64 // their bytes
	// Stopped says why Apply stopped before the end of the chain ("" when
	// it applied every manifest of it).
	Stopped string
	// Changed names the log files Apply changed or created: they are no
	// longer the snapshot's files.
	Changed []string
}

// MaxSegmentBytes bounds a segment Apply reads (it holds one in memory
// per parallel fetch).
const MaxSegmentBytes = 256 << 20

// applyParallel is how many segments Apply fetches at once.
const applyParallel = 8

// placedLog is one log file of the state Apply builds.
type placedLog struct {
	name     string
	num      uint64
	end      int64 // where its complete records end
	size     int64 // its size on disk
	complete bool  // nothing follows end: sealed, or an older snapshot log
	snapshot bool
	changed  bool
}

// Apply extends the restored snapshot in dir (every file already placed
// and verified) with chain, the WAL manifests of its checkpoint from seq 1
// (UsableChain), reading segments from s. See the comment above for the rules.
func Apply(ctx context.Context, s storage.Store, dir *os.File, chain []*Manifest) (*Applied, error) {
	logs, err := snapshotLogs(dir)
	if err != nil {
		return nil, err
	}
	out := &Applied{}
	if len(chain) > 0 {
		out.Position.Checkpoint, out.Position.Epoch = chain[0].Checkpoint, chain[0].Epoch
	}
	for i, m := range chain {
		if m.Seq != uint64(i+1) || m.Checkpoint != out.Position.Checkpoint || m.Epoch != out.Position.Epoch {
			return nil, fmt.Errorf("apply wal: manifest %d of checkpoint %d epoch %d is not manifest %d of this chain", m.Seq, m.Checkpoint, m.Epoch, i+1)
		}
		next, why := plan(logs, m)
		if why != "" {
			out.Stopped = fmt.Sprintf("wal manifest %d: %s", m.Seq, why)
			break
		}
		if err := writeManifest(ctx, s, dir, m, next, out); err != nil {
			return nil, err
		}
		logs = next
		out.Position.Seq, out.ThroughUnixMs = m.Seq, m.ThroughUnixMs
	}
	if out.Segments > 0 {
		for _, l := range logs {
			if l.changed {
				if err := syncAt(dir, l.name); err != nil {
					return nil, err
				}
				out.Changed = append(out.Changed, l.name)
			}
		}
	}
	if len(logs) > 0 {
		last := logs[len(logs)-1]
		out.Position.Log, out.Position.Offset = last.name, last.end
	}
	return out, nil
}

// snapshotLogs scans the log files of dir: where each one's records end.
// The newest may continue; the older ones are complete.
func snapshotLogs(dir *os.File) ([]*placedLog, error) {
	if _, err := dir.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("apply wal: read the store dir: %w", err)
	}
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("apply wal: read the store dir: %w", err)
	}
	var logs []*placedLog
	for _, name := range names {
		num, ok := ParseLogName(name)
		if !ok {
			continue
		}
		end, size, sealed, err := scanFile(dir, name, num)
		if err != nil {
			return nil, err
		}
		logs = append(logs, &placedLog{name: name, num: num, end: end, size: size, complete: sealed, snapshot: true})
	}
	sortLogs(logs)
	for i, l := range logs {
		if i < len(logs)-1 {
			l.complete = true
		}
	}
	return logs, nil
}

func sortLogs(logs []*placedLog) {
	slices.SortFunc(logs, func(a, b *placedLog) int {
		if c := cmpU(a.num, b.num); c != 0 {
			return c
		}
		if a.name < b.name {
			return -1
		}
		if a.name > b.name {
			return 1
		}
		return 0
	})
}

// scanFile finds where the complete records of log file name end, reading
// it in pieces.
func scanFile(dir *os.File, name string, num uint64) (end, size int64, sealed bool, err error) {
	f, err := openAt(dir, name, unix.O_RDONLY)
	if err != nil {
		return 0, 0, false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, false, fmt.Errorf("apply wal: stat %s: %w", name, err)
	}
	size = fi.Size()
	want := int64(4 << 20)
	for end < size {
		buf := make([]byte, min(want, size-end))
		n, rerr := f.ReadAt(buf, end)
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return 0, 0, false, fmt.Errorf("apply wal: read %s: %w", name, rerr)
		}
		sc := ScanRecords(buf[:n], end, uint32(num), 0)
		switch {
		case sc.Stop != "end" || end+int64(n) >= size:
			return sc.End, size, sc.Stop == "sealed", nil
		case sc.End == end:
			want *= 2 // one record larger than the piece
		default:
			end = sc.End
		}
	}
	return end, size, false, nil
}

// plan checks m's segments against logs and returns the state after m,
// or why m cannot be applied (a hole).
func plan(logs []*placedLog, m *Manifest) ([]*placedLog, string) {
	next := make([]*placedLog, len(logs))
	for i, l := range logs {
		c := *l
		next[i] = &c
	}
	byName := map[string]*placedLog{}
	for _, l := range next {
		byName[l.name] = l
	}
	for _, r := range m.Segments {
		l := byName[r.Name]
		if l == nil {
			// A new log: above every log held, from 0, after complete logs.
			if r.Start != 0 {
				return nil, fmt.Sprintf("log %s is new to the store but its first segment starts at %d, not 0", r.Name, r.Start)
			}
			for _, o := range next {
				if o.num >= r.Log {
					return nil, fmt.Sprintf("log %s is not newer than log %s the store holds", r.Name, o.name)
				}
				if !o.complete {
					return nil, fmt.Sprintf("log %s follows log %s, which is not known to be complete (not sealed at %d)", r.Name, o.name, o.end)
				}
			}
			l = &placedLog{name: r.Name, num: r.Log}
			next = append(next, l)
			byName[r.Name] = l
		}
		if r.Start != l.end {
			return nil, fmt.Sprintf("log %s ends at %d, its segment starts at %d", r.Name, l.end, r.Start)
		}
		if l.complete && r.End > r.Start {
			return nil, fmt.Sprintf("log %s is complete at %d, yet a segment adds [%d, %d)", r.Name, l.end, r.Start, r.End)
		}
		if r.End > r.Start {
			for _, o := range next {
				if o.num > l.num && o.end > 0 {
					return nil, fmt.Sprintf("log %s grows after the newer log %s was placed", r.Name, o.name)
				}
			}
		}
		if r.Size() > MaxSegmentBytes {
			return nil, fmt.Sprintf("segment [%d, %d) of log %s is larger than %d bytes", r.Start, r.End, r.Name, MaxSegmentBytes)
		}
		l.end = r.End
		l.complete = l.complete || r.Sealed
	}
	return next, ""
}

// fetched is one segment read and checked.
type fetched struct {
	ref  SegmentRef
	data []byte
}

// writeManifest fetches m's segments (applyParallel at once, each checked
// before it is kept) and writes them in order: a log the snapshot holds is
// cut at its record boundary first, a new log is created.
func writeManifest(ctx context.Context, s storage.Store, dir *os.File, m *Manifest, next []*placedLog, out *Applied) error {
	state := map[string]*placedLog{}
	for _, l := range next {
		state[l.name] = l
	}
	refs := m.Segments
	for len(refs) > 0 {
		batch := refs[:min(len(refs), applyParallel)]
		refs = refs[len(batch):]
		got := make([]fetched, len(batch))
		g, gctx := errgroup.WithContext(ctx)
		for i, r := range batch {
			g.Go(func() error {
				data, err := fetchSegment(gctx, s, m, r)
				got[i] = fetched{ref: r, data: data}
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		for _, f := range got {
			if err := ctx.Err(); err != nil {
				return err
			}
			l := state[f.ref.Name]
			if !l.snapshot && !l.changed {
				if err := cutSnapshotTails(dir, next); err != nil {
					return err
				}
			}
			if err := writeSegment(dir, l, f); err != nil {
				return err
			}
			out.Segments++
			out.Bytes += int64(len(f.data))
		}
	}
	return nil
}

// cutSnapshotTails cuts every snapshot log at the end of its complete
// records before a newer log is placed after it: the engine then reads each
// log to its clean end, then the next.
func cutSnapshotTails(dir *os.File, logs []*placedLog) error {
	for _, o := range logs {
		if !o.snapshot || o.changed || o.size <= o.end {
			continue
		}
		if err := ownCopy(dir, o.name); err != nil {
			return err
		}
		w, err := openAt(dir, o.name, unix.O_WRONLY)
		if err != nil {
			return err
		}
		err = w.Truncate(o.end)
		w.Close()
		if err != nil {
			return fmt.Errorf("apply wal: cut %s at %d: %w", o.name, o.end, err)
		}
		o.changed = true
	}
	return nil
}

// fetchSegment reads segment r of m from s and checks its size and
// SHA-256.
func fetchSegment(ctx context.Context, s storage.Store, m *Manifest, r SegmentRef) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	key := m.SegmentKey(r)
	rc, err := s.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("wal segment %s (manifest %d of checkpoint %d): %w (restore with --to checkpoint to leave the WAL out)", key, m.Seq, m.Checkpoint, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, r.Size()+1))
	if err != nil {
		return nil, fmt.Errorf("read wal segment %s: %w", key, err)
	}
	sum := sha256.Sum256(data)
	if int64(len(data)) != r.Size() || hex.EncodeToString(sum[:]) != r.SHA256 {
		return nil, fmt.Errorf("wal segment %s (manifest %d of checkpoint %d): got %d bytes of SHA-256 %x, the manifest says %d bytes of %s: the stored object is corrupt (restore with --to checkpoint to leave the WAL out)",
			key, m.Seq, m.Checkpoint, len(data), sum, r.Size(), r.SHA256)
	}
	return data, nil
}

// writeSegment writes a checked segment at its offset of l's file.
func writeSegment(dir *os.File, l *placedLog, f fetched) error {
	if len(f.data) == 0 && !l.changed && l.snapshot {
		return nil // an empty segment (a seal) of a snapshot log: nothing to write
	}
	flags := unix.O_WRONLY
	if !l.snapshot && !l.changed {
		flags |= unix.O_CREAT | unix.O_EXCL
	}
	if l.snapshot && !l.changed {
		if err := ownCopy(dir, l.name); err != nil {
			return err
		}
	}
	w, err := openAt(dir, l.name, flags)
	if err != nil {
		return err
	}
	defer w.Close()
	if l.snapshot && !l.changed {
		// The snapshot's copy, cut where its complete records end (what
		// follows is a torn record or a recycled file's old bytes).
		if err := w.Truncate(f.ref.Start); err != nil {
			return fmt.Errorf("apply wal: cut %s at %d: %w", l.name, f.ref.Start, err)
		}
	}
	l.changed = true
	if _, err := w.WriteAt(f.data, f.ref.Start); err != nil {
		return fmt.Errorf("apply wal: write %s: %w", l.name, err)
	}
	return w.Close()
}

// ownCopy makes the snapshot log name an inode of dir's own before Apply
// changes it: a file with other hard links (a local copy's, say) is copied
// to a new file that replaces it, so that no other copy of the checkpoint
// ever sees the WAL's bytes.
func ownCopy(dir *os.File, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("apply wal: stat %s: %w", name, err)
	}
	if st.Nlink <= 1 {
		return nil
	}
	in, err := openAt(dir, name, unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := name + ".wal-copy"
	unix.Unlinkat(int(dir.Fd()), tmp, 0)
	out, err := openAt(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(int(dir.Fd()), tmp, int(dir.Fd()), name)
	}
	if err != nil {
		unix.Unlinkat(int(dir.Fd()), tmp, 0)
		return fmt.Errorf("apply wal: copy %s apart from its other links: %w", name, err)
	}
	return nil
}

func openAt(dir *os.File, name string, flags int) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("apply wal: open %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, fmt.Errorf("apply wal: %s is not a regular file", name)
	}
	return f, nil
}

func syncAt(dir *os.File, name string) error {
	f, err := openAt(dir, name, unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("apply wal: fsync %s: %w", name, err)
	}
	return nil
}
