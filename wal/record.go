// Package wal follows an LSM store's write-ahead log files and cuts them
// into segments that end on record boundaries, so that the bytes written
// between two checkpoints can be shipped within seconds and replayed by the
// engine after a restore.
//
// Pebble and RocksDB share LevelDB's log format: the file is a sequence of
// 32 KiB blocks, each holding tightly packed chunks; a record (one write
// batch) is one full chunk, or a first chunk, middle chunks and a last
// chunk. A chunk's header is a masked CRC-32C (4 bytes), the payload length
// (2), the chunk type (1) and, for the recyclable (types 5-8) and WAL-sync
// (9-12) formats, the low 32 bits of the log number (4) and a sync offset
// (8, WAL-sync only). A block's tail too short for a header is zero.
//
// A log file is read while the engine appends to it, so its end may hold a
// record half written, zeros of a preallocated extent, or chunks of an older
// log that a recycled file still holds (their log number is not the file's).
// ScanRecords finds where the complete records end: a segment cut there
// is accepted, record for record, by the engine's own reader (the tests
// check it against Pebble's record package), and it never ends inside a
// record, so a restore replays a write batch whole or not at all.
package wal

import (
	"encoding/binary"
	"hash/crc32"
)

// BlockSize is the log format's block size.
const BlockSize = 32 << 10

const (
	legacyHeader     = 7
	recyclableHeader = legacyHeader + 4
	walSyncHeader    = recyclableHeader + 8
)

// chunk positions within a record.
const (
	posFull = iota + 1
	posFirst
	posMiddle
	posLast
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maskedCRC is the log format's checksum: CRC-32C, rotated and offset so
// that a CRC of data holding CRCs is not trivially zero.
func maskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return (c>>15 | c<<17) + 0xa282ead8
}

// chunkType decodes a chunk type byte: its position in its record and its
// header size; ok is false for a type the format does not have.
func chunkType(t byte) (pos, header int, ok bool) {
	switch {
	case t >= 1 && t <= 4:
		return int(t), legacyHeader, true
	case t >= 5 && t <= 8:
		return int(t) - 4, recyclableHeader, true
	case t >= 9 && t <= 12:
		return int(t) - 8, walSyncHeader, true
	}
	return 0, 0, false
}

// Scan is what ScanRecords found.
type Scan struct {
	// End is the file offset just past the last complete record found (the
	// start offset when none was).
	End int64
	// Records counts the complete records in [start, End).
	Records int
	// Stop says why the scan stopped after End: "end" (the bytes ran out,
	// possibly inside a record), "zeroes" (a zeroed header: the end of what
	// was written), "sealed" (the trailer the engine writes when it closes
	// a log: nothing follows, ever), "log number" (a chunk of another log: a
	// recycled file's old contents), "limit" (the next record would pass
	// the limit), or "invalid" (a bad type, length or checksum: a torn write
	// or damage).
	Stop string
}

// ScanRecords walks the chunks of buf, the bytes of a log file from file
// offset base, which must be a record boundary (0, or an End an earlier
// scan returned). logNum is the low 32 bits of the log file's number; the
// chunks of the recyclable and WAL-sync formats must carry it. It stops at
// the first byte that is not part of a valid chunk in sequence, or when the
// record in progress would end after limit bytes from base (limit <= 0: no
// limit), and never returns an End inside a record.
func ScanRecords(buf []byte, base int64, logNum uint32, limit int64) Scan {
	s := Scan{End: base, Stop: "end"}
	p := 0 // position in buf
	inRecord := false
	for {
		off := base + int64(p)
		left := BlockSize - int(off%BlockSize) // bytes left in this block
		if left < legacyHeader {
			// The block's tail is padding: skip it, if it is there.
			if p+left > len(buf) {
				return s
			}
			p += left
			continue
		}
		if p+legacyHeader > len(buf) {
			return s
		}
		h := buf[p : p+legacyHeader]
		sum := binary.LittleEndian.Uint32(h[0:4])
		length := int(binary.LittleEndian.Uint16(h[4:6]))
		if sum == 0 && length == 0 && h[6] == 0 {
			// A zeroed header. Where no WAL-sync header fits in the block's
			// tail, the tail is padding when it is all zero (as Pebble's
			// reader takes it); anywhere else it is the end of what was
			// written (a preallocated extent, or nothing yet).
			if left >= walSyncHeader {
				s.Stop = "zeroes"
				return s
			}
			if p+left > len(buf) {
				return s
			}
			if left >= recyclableHeader && !allZero(buf[p:p+left]) {
				s.Stop = "zeroes"
				return s
			}
			p += left
			continue
		}
		pos, hs, ok := chunkType(h[6])
		if !ok || hs > left {
			s.Stop = "invalid"
			return s
		}
		if p+hs > len(buf) {
			return s
		}
		if hs > legacyHeader && binary.LittleEndian.Uint32(buf[p+7:p+11]) != logNum {
			n := binary.LittleEndian.Uint32(buf[p+7 : p+11])
			s.Stop = "log number"
			if n == logNum+1 && !inRecord {
				// The trailer the engine writes when it closes a log.
				s.Stop = "sealed"
			}
			return s
		}
		end := p + hs + length
		if hs+length > left {
			s.Stop = "invalid"
			return s
		}
		if end > len(buf) {
			return s
		}
		if maskedCRC(buf[p+6:end]) != sum {
			s.Stop = "invalid"
			return s
		}
		switch {
		case pos == posFull && !inRecord, pos == posLast && inRecord:
			if limit > 0 && int64(end) > limit && s.Records > 0 {
				s.Stop = "limit"
				return s
			}
			inRecord = false
			s.Records++
			s.End = base + int64(end)
		case pos == posFirst && !inRecord:
			inRecord = true
		case pos == posMiddle && inRecord:
		default: // a chunk out of sequence
			s.Stop = "invalid"
			return s
		}
		p = end
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
