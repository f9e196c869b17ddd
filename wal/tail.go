package wal

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Segment is a piece of one log file that ends on a record boundary: the
// bytes [Start, End) of the log numbered Log, exactly as they were scanned.
type Segment struct {
	Name       string // the log file's name in the store dir
	Log        uint64 // its number
	Start, End int64
	Records    int
	// Sealed is true when the log ends at End: the engine closed it with
	// its trailer, and no record will ever follow in this file. A sealed
	// segment may be empty (Start == End): the trailer alone was new.
	Sealed bool
	// More is true when the segment was cut short at MaxSegment: complete
	// records may follow End in what the file held when it was read.
	More bool
	Data []byte
}

// Gap is a log file that went away (deleted, or recycled under another
// number) before everything it held was read: the records between
// Shipped and its end were never seen. Segments of later logs do not
// continue the ones before the gap: a restore must stop before it.
type Gap struct {
	Name    string
	Log     uint64
	Shipped int64
}

func (g Gap) Error() string {
	return fmt.Sprintf("log %s went away after %d bytes were read and before its end: the writes after that point reach storage only with the next checkpoint", g.Name, g.Shipped)
}

// Tailer follows the log files of one store directory. It is not safe for
// concurrent use.
type Tailer struct {
	dir *os.File
	// MaxSegment bounds a segment's bytes; a single record larger than it
	// is a segment of its own.
	MaxSegment int64
	logs       map[string]*logState
	// owner, when ownerSet, is the uid every log file must be owned by
	// (RequireOwner).
	owner    uint32
	ownerSet bool
	// maxSeen is the highest log number the tailer has followed.
	maxSeen uint64
	// retired are logs read to their seal and gone from the dir, still
	// open (the newest first to stay, at most retiredBytes of them): a
	// checkpoint's snapshot taken before they were sealed is continued
	// from them (Shipper.Rebase).
	retired map[string]*logState
}

// retiredBytes bounds the bytes of the gone logs a tailer keeps open.
const retiredBytes = 256 << 20

// retire keeps ls, gone and read to its seal, open while the newest
// retired logs stay within retiredBytes.
func (t *Tailer) retire(name string, ls *logState) {
	if t.retired == nil {
		t.retired = map[string]*logState{}
	}
	if old := t.retired[name]; old != nil && old.f != ls.f {
		old.f.Close()
	}
	t.retired[name] = ls
	names := make([]string, 0, len(t.retired))
	for n := range t.retired {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return cmpU(t.retired[b].log, t.retired[a].log) })
	var total int64
	for _, n := range names {
		total += t.retired[n].shipped
		if total > retiredBytes {
			t.retired[n].f.Close()
			delete(t.retired, n)
		}
	}
}

// RequireOwner makes the tailer refuse, with an error, a log file not
// owned by uid: in node-agent mode a peer's store dir may hold only the
// peer's files (a hard link to another user's file is not read).
func (t *Tailer) RequireOwner(uid uint32) { t.owner, t.ownerSet = uid, true }

type logState struct {
	log      uint64
	dev, ino uint64
	shipped  int64 // acknowledged: everything before it is in storage
	sealed   bool
	// f is the log file, open from when it was first seen: a log the
	// engine deletes (or renames, to recycle it) right after it sealed it
	// is still read to its end through it.
	f *os.File
}

// ParseLogName returns the number of a write-ahead log file name
// (NNNNNN.log, or NNNNNN-III.log for the logs of one WAL on several
// devices), and false for any other name.
func ParseLogName(name string) (uint64, bool) {
	stem, ok := strings.CutSuffix(name, ".log")
	if !ok || stem == "" {
		return 0, false
	}
	num, idx, hasIdx := strings.Cut(stem, "-")
	if !allDigits(num) || (hasIdx && !allDigits(idx)) {
		return 0, false
	}
	n, err := strconv.ParseUint(num, 10, 64)
	return n, err == nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// NewTailer follows the logs of dir, an open directory; the caller keeps
// it open while the Tailer is used. Logs are read from their start.
func NewTailer(dir *os.File, maxSegment int64) *Tailer {
	if maxSegment <= 0 {
		maxSegment = 16 << 20
	}
	return &Tailer{dir: dir, MaxSegment: maxSegment, logs: map[string]*logState{}}
}

// Next returns the log files' new complete records since the last
// acknowledged segment of each, one segment a log at most (oldest log
// first), and the gaps found: logs that went away before they were read
// to their end. A segment becomes the log's new start once Ack is called
// with it; until then Next returns it again (grown, if more was written).
// Every file is opened through the directory's handle without following a
// symlink, and a segment's Data are the bytes that were scanned.
func (t *Tailer) Next() ([]Segment, []Gap, error) {
	names, err := t.listLogs()
	if err != nil {
		return nil, nil, err
	}
	present := map[string]bool{}
	var segs []Segment
	var gaps []Gap
	for _, name := range names {
		present[name] = true
		seg, gap, err := t.read(name)
		if err != nil {
			return nil, nil, err
		}
		if gap != nil {
			gaps = append(gaps, *gap)
		}
		if seg != nil {
			segs = append(segs, *seg)
		}
	}
	for name, st := range t.logs {
		if present[name] {
			continue
		}
		if !st.sealed && st.f != nil {
			// Gone from the dir: what the file held is read through the
			// handle kept open. A log read to its seal is no gap.
			var fst unix.Stat_t
			if err := unix.Fstat(int(st.f.Fd()), &fst); err == nil {
				seg, err := t.scan(name, st, st.f, fst.Size)
				if err == nil && seg != nil && (seg.Sealed || seg.More) {
					segs = append(segs, *seg)
					continue // dropped once its seal is acknowledged
				}
			}
		}
		if !st.sealed {
			gaps = append(gaps, Gap{Name: name, Log: st.log, Shipped: st.shipped})
		}
		if st.f != nil {
			if st.sealed {
				t.retire(name, st)
			} else {
				st.f.Close()
			}
		}
		delete(t.logs, name)
	}
	slices.SortFunc(segs, func(a, b Segment) int { return cmpU(a.Log, b.Log) })
	slices.SortFunc(gaps, func(a, b Gap) int { return cmpU(a.Log, b.Log) })
	return segs, gaps, nil
}

// Close releases the log files the tailer holds open.
func (t *Tailer) Close() {
	for _, m := range []map[string]*logState{t.logs, t.retired} {
		for _, st := range m {
			if st.f != nil {
				st.f.Close()
			}
		}
	}
}

// Ack records that seg is in storage: the log's next segment starts at
// seg.End.
func (t *Tailer) Ack(seg Segment) {
	st := t.logs[seg.Name]
	if st == nil || st.log != seg.Log || seg.Start != st.shipped || seg.End < st.shipped {
		return // the file was replaced meanwhile, or an old segment
	}
	st.shipped = seg.End
	st.sealed = seg.Sealed
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// listLogs returns the log file names of the dir, oldest log first.
func (t *Tailer) listLogs() ([]string, error) {
	if _, err := t.dir.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("read the store dir: %w", err)
	}
	all, err := t.dir.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("read the store dir: %w", err)
	}
	var names []string
	for _, n := range all {
		if _, ok := ParseLogName(n); ok {
			names = append(names, n)
		}
	}
	slices.SortFunc(names, func(a, b string) int {
		x, _ := ParseLogName(a)
		y, _ := ParseLogName(b)
		if c := cmpU(x, y); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return names, nil
}

// read returns the next segment of one log, if it has one.
func (t *Tailer) read(name string) (*Segment, *Gap, error) {
	num, _ := ParseLogName(name)
	var st unix.Stat_t
	ls := t.logs[name]
	if ls != nil && ls.f != nil {
		// The file already open, if the name still leads to it.
		err := unix.Fstatat(int(t.dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			return nil, nil, nil // gone since the listing: the next Next sees it
		}
		if err != nil {
			return nil, nil, fmt.Errorf("stat log %s: %w", name, err)
		}
		if ls.dev == uint64(st.Dev) && ls.ino == st.Ino && st.Mode&unix.S_IFMT == unix.S_IFREG {
			if ls.sealed || st.Size <= ls.shipped {
				return nil, nil, nil
			}
			seg, err := t.scan(name, ls, ls.f, st.Size)
			if !errors.Is(err, os.ErrClosed) {
				return seg, nil, err
			}
			ls.f = nil // let go of (a state restored after a failed round): opened again below
		}
	}
	fd, err := unix.Openat(int(t.dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil, nil // gone since the listing: the next Next sees it
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open log %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	keep := false
	defer func() {
		if !keep {
			f.Close()
		}
	}()
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, nil, fmt.Errorf("stat log %s: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, nil, fmt.Errorf("log %s is not a regular file", name)
	}
	if t.ownerSet && st.Uid != t.owner {
		return nil, nil, fmt.Errorf("log %s is owned by uid %d, not by uid %d that owns the store: it is not read (a hard link to another user's file?)", name, st.Uid, t.owner)
	}
	var gap *Gap
	if ls != nil && (ls.dev != uint64(st.Dev) || ls.ino != st.Ino) {
		// Another file under the same name: the old one went away.
		if !ls.sealed {
			gap = &Gap{Name: name, Log: ls.log, Shipped: ls.shipped}
		}
		if ls.f != nil {
			ls.f.Close()
		}
		ls = nil
	}
	if ls == nil {
		ls = &logState{log: num, dev: uint64(st.Dev), ino: st.Ino}
		t.logs[name] = ls
		t.maxSeen = max(t.maxSeen, num)
	}
	if ls.f == nil {
		ls.f, keep = f, true
	}
	if ls.sealed || st.Size <= ls.shipped {
		// Nothing new (a log's trailer is past shipped, so it is new).
		return nil, gap, nil
	}
	seg, err := t.scan(name, ls, f, st.Size)
	return seg, gap, err
}

// scan returns the next segment of log name (state ls) from f, which
// holds size bytes, if it has one.
func (t *Tailer) scan(name string, ls *logState, f *os.File, size int64) (*Segment, error) {
	if ls.sealed || size <= ls.shipped {
		return nil, nil
	}
	// Read what the next segment may hold, and more while one record
	// alone is larger than that.
	want := min(size-ls.shipped, t.MaxSegment+BlockSize)
	for {
		buf := make([]byte, want)
		n, err := f.ReadAt(buf, ls.shipped)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("read log %s: %w", name, err)
		}
		buf = buf[:n]
		s := ScanRecords(buf, ls.shipped, uint32(ls.log), t.MaxSegment)
		if s.Records == 0 && s.Stop == "end" && int64(n) == want && ls.shipped+want < size {
			want = min(size-ls.shipped, 2*want)
			continue
		}
		if s.Records == 0 && s.Stop != "sealed" {
			return nil, nil
		}
		// A segment, or, when the log's trailer follows what was shipped,
		// an empty one that says so (Ack seals the log).
		more := s.Stop == "limit" || (s.Stop == "end" && int64(n) == want && ls.shipped+want < size)
		return &Segment{Name: name, Log: ls.log, Start: ls.shipped, End: s.End, Records: s.Records,
			Sealed: s.Stop == "sealed", More: more, Data: buf[:s.End-ls.shipped]}, nil
	}
}
