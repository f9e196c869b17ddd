// Package blobfile checks RocksDB blob files (the values BlobDB keeps out
// of its table files) against their checksums, in pure Go: the C API of
// RocksDB 7.8 has no blob file reader. Every record's header and body CRC
// is checked, so a blob no live key references any more is covered too
// (RocksDB's own readers check a blob only when a read reaches it).
package blobfile

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// RocksDB's blob file format (db/blob/blob_log_format.h, version 1):
//
//	header  30 B: magic (4), version (4), column family (4), compression (1),
//	              has TTL (1), expiration range (16)
//	record  32 B: key length (8), value length (8), expiration (8),
//	              header CRC (4, of the first 24 B), blob CRC (4, of key and value)
//	        then the key and the (possibly compressed) value
//	footer  32 B: magic (4), blob count (8), expiration range (16),
//	              footer CRC (4, of the first 28 B)
//
// Integers are little-endian; CRCs are CRC-32C, masked as in leveldb.
const (
	blobMagic        = 0x00248f37
	blobHeaderSize   = 30
	blobRecordHeader = 32
	blobFooterSize   = 32
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt matches (errors.Is) every error Verify returns for bytes
// that do not verify; the error's text says what and where.
var ErrCorrupt = errors.New("corrupt blob file")

type corruptError string

func (e corruptError) Error() string      { return string(e) }
func (corruptError) Is(target error) bool { return target == ErrCorrupt }

// maskCRC is RocksDB's crc32c::Mask.
func maskCRC(c uint32) uint32 { return ((c >> 15) | (c << 17)) + 0xa282ead8 }

// Verify checks the blob file read from r, of size bytes: the header's
// magic number and version, the CRC of every record, and the footer's CRC
// and record count. It reads r once, through, in bounded memory; a file
// that is not a sealed version-1 blob file is an error saying what is
// wrong and where. ctx is checked every 1,024 records.
func Verify(ctx context.Context, r io.Reader, size int64) error {
	corrupt := func(format string, a ...any) error { return corruptError(fmt.Sprintf(format, a...)) }
	if size < blobHeaderSize+blobFooterSize {
		return corrupt("%d bytes, shorter than a header and a footer", size)
	}
	br := bufio.NewReaderSize(r, 256<<10)
	var hdr [blobHeaderSize]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return corrupt("header: %v", err)
	}
	if m := binary.LittleEndian.Uint32(hdr[0:]); m != blobMagic {
		return corrupt("bad magic number %#x in the header", m)
	}
	if v := binary.LittleEndian.Uint32(hdr[4:]); v != 1 {
		return corrupt("unknown blob file version %d", v)
	}
	off, end := int64(blobHeaderSize), size-blobFooterSize
	var records uint64
	var rec [blobRecordHeader]byte
	buf := make([]byte, 64<<10)
	for off < end {
		if records%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if end-off < blobRecordHeader {
			return corrupt("a record header at offset %d runs into the footer", off)
		}
		if _, err := io.ReadFull(br, rec[:]); err != nil {
			return corrupt("record at offset %d: %v", off, err)
		}
		if got, want := maskCRC(crc32.Checksum(rec[:24], castagnoli)), binary.LittleEndian.Uint32(rec[24:]); got != want {
			return corrupt("record header checksum mismatch at offset %d", off)
		}
		klen, vlen := binary.LittleEndian.Uint64(rec[0:]), binary.LittleEndian.Uint64(rec[8:])
		body := uint64(end - off - blobRecordHeader)
		if klen > body || vlen > body-klen {
			return corrupt("the record at offset %d is longer than the file", off)
		}
		var crc uint32
		for left := klen + vlen; left > 0; {
			chunk := buf[:min(uint64(len(buf)), left)]
			if _, err := io.ReadFull(br, chunk); err != nil {
				return corrupt("record at offset %d: %v", off, err)
			}
			crc = crc32.Update(crc, castagnoli, chunk)
			left -= uint64(len(chunk))
		}
		if maskCRC(crc) != binary.LittleEndian.Uint32(rec[28:]) {
			return corrupt("blob checksum mismatch in the record at offset %d", off)
		}
		off += blobRecordHeader + int64(klen+vlen)
		records++
	}
	var foot [blobFooterSize]byte
	if _, err := io.ReadFull(br, foot[:]); err != nil {
		return corrupt("footer: %v", err)
	}
	if m := binary.LittleEndian.Uint32(foot[0:]); m != blobMagic {
		return corrupt("bad magic number %#x in the footer", m)
	}
	if maskCRC(crc32.Checksum(foot[:28], castagnoli)) != binary.LittleEndian.Uint32(foot[28:]) {
		return corrupt("footer checksum mismatch")
	}
	if n := binary.LittleEndian.Uint64(foot[4:]); n != records {
		return corrupt("the footer counts %d blobs, the file holds %d", n, records)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		return corrupt("bytes after the footer, or a file longer than its size")
	}
	return nil
}
