//go:build rocksdb

package rocksengine

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
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

// maskCRC is RocksDB's crc32c::Mask.
func maskCRC(c uint32) uint32 { return ((c >> 15) | (c << 17)) + 0xa282ead8 }

// verifyBlob reads the blob file at path through and checks the CRC of
// every record and of the footer, and that the footer counts the records.
// RocksDB's own readers check a blob's CRC only when a read reaches it;
// this also covers blobs no live key references any more. The C API of
// RocksDB 7.8 has no blob file reader, so the format is read here.
func verifyBlob(ctx context.Context, path string) error {
	name := filepath.Base(path)
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("rocksdb check: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("rocksdb check: %w", err)
	}
	corrupt := func(format string, a ...any) error {
		return fmt.Errorf("rocksdb check: blob file %s is corrupt: %s", name, fmt.Sprintf(format, a...))
	}
	size := fi.Size()
	if size < blobHeaderSize+blobFooterSize {
		return corrupt("%d bytes, shorter than a header and a footer", size)
	}
	r := bufio.NewReaderSize(f, 1<<20)
	var hdr [blobHeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
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
		if _, err := io.ReadFull(r, rec[:]); err != nil {
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
			if _, err := io.ReadFull(r, chunk); err != nil {
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
	if _, err := io.ReadFull(r, foot[:]); err != nil {
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
	if _, err := r.ReadByte(); !errors.Is(err, io.EOF) {
		return corrupt("bytes after the footer")
	}
	return nil
}
