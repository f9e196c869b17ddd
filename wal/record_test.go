package wal

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/record"
	pwal "github.com/cockroachdb/pebble/v2/wal"
	"pgregory.net/rapid"
)

// pebbleRecords reads b as a log with Pebble's own reader and returns the
// records it reads whole before it stops, and why it stopped (io.EOF for
// a clean end).
func pebbleRecords(b []byte, logNum uint64) (n int, stop error) {
	// record.NewReader takes the log number as a type of Pebble's internal
	// package; make one through reflection.
	newReader := reflect.ValueOf(record.NewReader)
	num := reflect.New(newReader.Type().In(1)).Elem()
	num.SetUint(logNum)
	r := newReader.Call([]reflect.Value{reflect.ValueOf(io.Reader(bytes.NewReader(b))), num})[0].Interface().(*record.Reader)
	for {
		rec, err := r.Next()
		if err != nil {
			return n, err
		}
		if _, err := io.ReadAll(rec); err != nil {
			return n, err
		}
		n++
	}
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(f string, a ...any) {
	panic(f)
}

// fataler is what both *testing.T and *rapid.T offer.
type fataler interface {
	Fatal(args ...any)
}

// pebbleLog is one log file as read while its store was open.
type pebbleLog struct {
	b   []byte
	num uint64
}

// writePebbleLogs writes batches of the given value sizes into a new
// Pebble store, each synced, and returns its log files as read while the
// store is open (what a tailer sees), oldest first. Pebble starts with a
// small memtable and rotates the log with it, so larger batches spread
// over several logs.
func writePebbleLogs(t fataler, sizes []int) []pebbleLog {
	dir, err := os.MkdirTemp("", "wal-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietLogger{}, MemTableSize: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range sizes {
		v := bytes.Repeat([]byte{byte(i)}, n)
		if err := db.Set([]byte{byte(i >> 8), byte(i)}, v, pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var logs []pebbleLog
	for _, e := range entries {
		w, _, ok := pwal.ParseLogFilename(e.Name())
		if !ok {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		logs = append(logs, pebbleLog{b, uint64(w)})
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if len(logs) == 0 {
		t.Fatal("no log file")
	}
	return logs
}

func drawSizes(t *rapid.T) []int {
	return rapid.SliceOfN(rapid.OneOf(
		rapid.IntRange(0, 400),          // small batches: many chunks a block
		rapid.IntRange(1000, 40_000),    // around a block
		rapid.IntRange(40_000, 200_000), // spanning several blocks
	), 1, 40).Draw(t, "sizes")
}

// A whole log scans to its last record, and Pebble's reader reads exactly
// that many records from the bytes up to End, ending cleanly.
func TestScanRecordsFindsEveryRecordPebbleWrote(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: writes real Pebble stores, a hundred times")
	}
	rapid.Check(t, func(t *rapid.T) {
		sizes := drawSizes(t)
		total := 0
		for _, l := range writePebbleLogs(t, sizes) {
			s := ScanRecords(l.b, 0, uint32(l.num), 0)
			n, stop := pebbleRecords(l.b, l.num)
			if !errors.Is(stop, io.EOF) && !record.IsInvalidRecord(stop) {
				t.Fatalf("pebble's reader of log %d: %v", l.num, stop)
			}
			if s.Records != n {
				t.Fatalf("log %d: scan found %d records (stop %s), pebble's reader %d", l.num, s.Records, s.Stop, n)
			}
			got, stop := pebbleRecords(l.b[:s.End], l.num)
			if got != s.Records || !errors.Is(stop, io.EOF) {
				t.Fatalf("log %d: pebble's reader of the bytes up to End (%d): %d records, then %v; want %d then EOF", l.num, s.End, got, stop, s.Records)
			}
			total += s.Records
		}
		if total != len(sizes) {
			t.Fatalf("scans found %d records in all logs, %d batches were written", total, len(sizes))
		}
	})
}

// Cut anywhere (a torn tail) or with a byte flipped (damage), the scan ends
// on the last record boundary before the cut or the damage: Pebble's reader
// reads exactly the records the scan counted, and reads the bytes up to
// End to a clean end. Scanning in pieces, each from the last End, finds
// the same records as one scan.
func TestScanRecordsEndsWhereTheEnginesReaderStops(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: writes real Pebble stores, a hundred times")
	}
	rapid.Check(t, func(t *rapid.T) {
		logs := writePebbleLogs(t, drawSizes(t))
		l := logs[rapid.IntRange(0, len(logs)-1).Draw(t, "log")]
		b, num := l.b, l.num
		cut := rapid.IntRange(0, len(b)).Draw(t, "cut")
		torn := append([]byte(nil), b[:cut]...)
		if cut > 0 && rapid.Bool().Draw(t, "flip") {
			i := rapid.IntRange(0, cut-1).Draw(t, "at")
			torn[i] ^= 1 << rapid.IntRange(0, 7).Draw(t, "bit")
		}
		s := ScanRecords(torn, 0, uint32(num), 0)
		if s.End > int64(cut) {
			t.Fatalf("End %d past the cut %d", s.End, cut)
		}
		n, _ := pebbleRecords(torn, num)
		if s.Records != n {
			t.Fatalf("scan counted %d records (stop %s), pebble's reader read %d", s.Records, s.Stop, n)
		}
		got, stop := pebbleRecords(torn[:s.End], num)
		if got != s.Records || !errors.Is(stop, io.EOF) {
			t.Fatalf("pebble's reader of the bytes up to End: %d records, then %v; want %d, then EOF", got, stop, s.Records)
		}
		// In pieces of at most limit bytes each (a segment size).
		limit := int64(rapid.IntRange(1, 300_000).Draw(t, "limit"))
		var at int64
		records := 0
		for {
			p := ScanRecords(torn[at:], at, uint32(num), limit)
			if p.End == at {
				break
			}
			if p.End-at > limit && p.Records > 1 {
				t.Fatalf("a piece of %d bytes and %d records over the limit %d", p.End-at, p.Records, limit)
			}
			records += p.Records
			at = p.End
		}
		if at != s.End || records != s.Records {
			t.Fatalf("in pieces: %d records to %d; at once: %d to %d", records, at, s.Records, s.End)
		}
	})
}

// A recycled file's old chunks carry another log number: the scan stops
// before them.
func TestScanRecordsStopsAtAnotherLogsChunks(t *testing.T) {
	logs := writePebbleLogs(t, []int{100, 50_000, 10})
	b, num := logs[len(logs)-1].b, logs[len(logs)-1].num
	s := ScanRecords(b, 0, uint32(num), 0)
	other := ScanRecords(b, 0, uint32(num)+7, 0)
	if other.Records != 0 || other.End != 0 {
		// A legacy-format log carries no number; Pebble v2 writes the
		// recyclable format, which does.
		t.Fatalf("scanning as log %d: %d records to %d, want none", num+7, other.Records, other.End)
	}
	if other.Stop != "log number" || s.Records != 3 || len(logs) != 1 {
		t.Fatalf("stop %q, records %d", other.Stop, s.Records)
	}
}

// A scan that starts inside a record (not at a boundary, as a caller that
// lost its place would) counts no record from the chunks that continue it.
func TestScanRecordsCountsNoRecordFromItsMiddle(t *testing.T) {
	logs := writePebbleLogs(t, []int{50_000}) // a first chunk in block 0, the last in block 1
	b, num := logs[len(logs)-1].b, logs[len(logs)-1].num
	if whole := ScanRecords(b, 0, uint32(num), 0); whole.Records != 1 || len(b) < BlockSize+100 {
		t.Fatalf("the log holds %d records in %d bytes, want one record over several blocks", whole.Records, len(b))
	}
	s := ScanRecords(b[BlockSize:], BlockSize, uint32(num), 0)
	if s.Records != 0 || s.End != BlockSize || s.Stop != "invalid" {
		t.Fatalf("from the second block: %+v, want no record and stop invalid", s)
	}
}

// Any bytes, any base, log number and limit: no panic, End within the
// bytes given and on or after base. Half the inputs are a real log with
// bytes overwritten at random, so that most chunks get far.
func TestScanRecordsTakesAnyBytes(t *testing.T) {
	logs := writePebbleLogs(t, []int{10, 40_000, 300, 70_000})
	real := logs[len(logs)-1]
	rapid.Check(t, func(t *rapid.T) {
		var b []byte
		num := uint32(rapid.Uint64().Draw(t, "num"))
		if rapid.Bool().Draw(t, "real") {
			b = append([]byte(nil), real.b...)
			num = uint32(real.num)
			for range rapid.IntRange(0, 20).Draw(t, "writes") {
				at := rapid.IntRange(0, len(b)-1).Draw(t, "at")
				b[at] = rapid.Byte().Draw(t, "byte")
			}
			b = b[:rapid.IntRange(0, len(b)).Draw(t, "len")]
		} else {
			b = rapid.SliceOfN(rapid.Byte(), 0, 3*BlockSize).Draw(t, "bytes")
		}
		base := rapid.Int64Range(0, 1<<40).Draw(t, "base")
		limit := rapid.Int64Range(-1, 1<<20).Draw(t, "limit")
		s := ScanRecords(b, base, num, limit)
		if s.End < base || s.End > base+int64(len(b)) || s.Records < 0 {
			t.Fatalf("%+v for %d bytes at %d", s, len(b), base)
		}
	})
}
