package wal

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

func TestParseLogName(t *testing.T) {
	for name, want := range map[string]uint64{"000123.log": 123, "000007-001.log": 7, "1.log": 1} {
		if got, ok := ParseLogName(name); !ok || got != want {
			t.Errorf("%s: %d %v, want %d", name, got, ok, want)
		}
	}
	for _, name := range []string{".log", "abc.log", "000123.sst", "000123-.log", "-1.log", "000123.log.tmp", "12a.log", "000001-x.log"} {
		if n, ok := ParseLogName(name); ok {
			t.Errorf("%s parsed as log %d", name, n)
		}
	}
}

// shipped accumulates what a tailer shipped of each log file (by name and
// number), checking that each segment continues the last one.
type shipped struct {
	t      *testing.T
	logs   map[string]*bytes.Buffer
	nums   map[string]uint64
	count  map[string]int
	sealed map[string]bool
	gaps   []Gap
}

func (s *shipped) poll(tl *Tailer) {
	s.t.Helper()
	// A segment cut at the size limit (More) has more behind it: poll on
	// until none is, as a shipping round does.
	for s.pollOnce(tl) {
	}
}

func (s *shipped) pollOnce(tl *Tailer) (more bool) {
	s.t.Helper()
	segs, gaps, err := tl.Next()
	if err != nil {
		s.t.Fatal(err)
	}
	s.gaps = append(s.gaps, gaps...)
	for _, g := range gaps {
		delete(s.logs, g.Name) // a new file may come under the name
	}
	for _, seg := range segs {
		key := fmt.Sprintf("%s@%d", seg.Name, seg.Log)
		b := s.logs[key]
		if b == nil {
			b = &bytes.Buffer{}
			s.logs[key], s.nums[key] = b, seg.Log
		}
		if int64(b.Len()) != seg.Start || int64(len(seg.Data)) != seg.End-seg.Start {
			s.t.Fatalf("%s: a segment [%d, %d) of %d bytes after %d shipped bytes", key, seg.Start, seg.End, len(seg.Data), b.Len())
		}
		b.Write(seg.Data)
		s.count[key] += seg.Records
		if s.sealed[key] {
			s.t.Fatalf("%s: a segment after the log was sealed", key)
		}
		s.sealed[key] = seg.Sealed
		tl.Ack(seg)
		more = more || seg.More
	}
	return more
}

// A tailer following a store that writes, rotates and removes its logs
// ships, per log, a prefix that Pebble's reader reads to a clean end with
// exactly the records the segments counted; with no gap, every write of
// the store is in a shipped record.
func TestTailerShipsEveryRecordOfALiveStore(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a store writing 3,000 synced batches")
	}
	dir := t.TempDir()
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietLogger{}, MemTableSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	tl := NewTailer(d, 100<<10)
	s := &shipped{t: t, logs: map[string]*bytes.Buffer{}, nums: map[string]uint64{}, count: map[string]int{}, sealed: map[string]bool{}}

	const writes = 3000
	var wg sync.WaitGroup
	wg.Add(1)
	werr := make(chan error, 1)
	go func() {
		defer wg.Done()
		for i := range writes {
			v := bytes.Repeat([]byte{byte(i)}, 100+(i*7919)%9000)
			if err := db.Set([]byte(fmt.Sprintf("k%06d", i)), v, pebble.Sync); err != nil {
				werr <- err
				return
			}
		}
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for polling := true; polling; {
		select {
		case <-done:
			polling = false
		case <-time.After(2 * time.Millisecond):
		}
		s.poll(tl)
	}
	select {
	case err := <-werr:
		t.Fatal(err)
	default:
	}
	// Closing the store closes its log with the trailer: one more poll
	// sees every log sealed.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s.poll(tl)
	total := 0
	for key, b := range s.logs {
		n, stop := pebbleRecords(b.Bytes(), s.nums[key])
		if n != s.count[key] || !errors.Is(stop, io.EOF) {
			t.Errorf("%s: pebble's reader read %d records then %v from the %d shipped bytes; the segments counted %d", key, n, stop, b.Len(), s.count[key])
		}
		total += s.count[key]
	}
	sealed := 0
	for _, v := range s.sealed {
		if v {
			sealed++
		}
	}
	t.Logf("%d writes, %d logs shipped (%d sealed by the engine's trailer), %d records, %d gaps", writes, len(s.logs), sealed, total, len(s.gaps))
	if sealed != len(s.logs) {
		t.Errorf("%d of %d logs were seen sealed: the store closed every one", sealed, len(s.logs))
	}
	if len(s.logs) < 2 {
		t.Errorf("the store wrote %d logs: the test wants rotations", len(s.logs))
	}
	if len(s.gaps) == 0 && total != writes {
		for key := range s.logs {
			t.Logf("%s: %d records, sealed %v", key, s.count[key], s.sealed[key])
		}
		t.Errorf("no gap, yet %d records were shipped for %d writes", total, writes)
	}
}

// A log that goes away before it was read to its end is a gap; one read
// to its trailer is not.
func TestTailerReportsALogThatWentAwayUnread(t *testing.T) {
	logs := writePebbleLogs(t, []int{200, 300, 20_000, 5})
	l := logs[len(logs)-1]
	dir := t.TempDir()
	name := fmt.Sprintf("%06d.log", l.num)
	whole := ScanRecords(l.b, 0, uint32(l.num), 0)
	cut := whole.End - 1 // the last record torn: not complete yet
	if err := os.WriteFile(filepath.Join(dir, name), l.b[:cut], 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	tl := NewTailer(d, 1<<20)
	segs, gaps, err := tl.Next()
	if err != nil || len(segs) != 1 || len(gaps) != 0 || segs[0].Records != whole.Records-1 {
		t.Fatalf("segments %+v, gaps %v, err %v; want one segment of %d records", segs, gaps, err, whole.Records-1)
	}
	tl.Ack(segs[0])
	if err := os.Remove(filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
	_, gaps, err = tl.Next()
	if err != nil || len(gaps) != 1 || gaps[0].Log != l.num || gaps[0].Shipped != segs[0].End {
		t.Fatalf("after the log went away: gaps %v, err %v; want one at %d", gaps, err, segs[0].End)
	}
	// The same name, a new file (a recycled one): a new log, read from 0.
	if err := os.WriteFile(filepath.Join(dir, name), l.b, 0o644); err != nil {
		t.Fatal(err)
	}
	segs, gaps, err = tl.Next()
	if err != nil || len(gaps) != 0 || len(segs) != 1 || segs[0].Start != 0 || segs[0].Records != whole.Records {
		t.Fatalf("a new file under the name: segments %+v, gaps %v, err %v", segs, gaps, err)
	}
	tl.Ack(segs[0])
	// A symlink in its place is refused, not followed.
	os.Remove(filepath.Join(dir, name))
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "000999.log")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tl.Next(); err == nil {
		t.Fatal("a symlinked log was read")
	}
}
