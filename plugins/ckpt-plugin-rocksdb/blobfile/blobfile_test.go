package blobfile

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strings"
	"testing"
)

// encode writes a version-1 blob file holding the given key/value records,
// the way RocksDB's BlobLogWriter does.
func encode(records ...[2][]byte) []byte {
	var b bytes.Buffer
	hdr := make([]byte, blobHeaderSize)
	binary.LittleEndian.PutUint32(hdr[0:], blobMagic)
	binary.LittleEndian.PutUint32(hdr[4:], 1)
	b.Write(hdr)
	for _, kv := range records {
		rec := make([]byte, blobRecordHeader)
		binary.LittleEndian.PutUint64(rec[0:], uint64(len(kv[0])))
		binary.LittleEndian.PutUint64(rec[8:], uint64(len(kv[1])))
		binary.LittleEndian.PutUint32(rec[24:], maskCRC(crc32.Checksum(rec[:24], castagnoli)))
		crc := crc32.Update(crc32.Checksum(kv[0], castagnoli), castagnoli, kv[1])
		binary.LittleEndian.PutUint32(rec[28:], maskCRC(crc))
		b.Write(rec)
		b.Write(kv[0])
		b.Write(kv[1])
	}
	foot := make([]byte, blobFooterSize)
	binary.LittleEndian.PutUint32(foot[0:], blobMagic)
	binary.LittleEndian.PutUint64(foot[4:], uint64(len(records)))
	binary.LittleEndian.PutUint32(foot[28:], maskCRC(crc32.Checksum(foot[:28], castagnoli)))
	b.Write(foot)
	return b.Bytes()
}

func verify(b []byte) error {
	return Verify(context.Background(), bytes.NewReader(b), int64(len(b)))
}

func TestVerifyAcceptsSealedFiles(t *testing.T) {
	big := bytes.Repeat([]byte("v"), 300<<10) // longer than the read buffer
	for name, b := range map[string][]byte{
		"no records":              encode(),
		"one record":              encode([2][]byte{[]byte("k1"), []byte("0123456789abcdefghij")}),
		"a record over 256 KiB":   encode([2][]byte{[]byte("k"), big}, [2][]byte{[]byte("k2"), []byte("x")}),
		"an empty key and values": encode([2][]byte{nil, nil}, [2][]byte{nil, nil}),
	} {
		if err := verify(b); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestVerifyRefusesEveryProtectedByteFlipped flips each byte of a small
// file in turn: every byte outside the header's unprotected fields
// (column family, compression, TTL, expiration range) must be refused.
func TestVerifyRefusesEveryProtectedByteFlipped(t *testing.T) {
	good := encode([2][]byte{[]byte("key-1"), []byte("value one")}, [2][]byte{[]byte("key-2"), []byte("value two")})
	for i := range good {
		b := bytes.Clone(good)
		b[i] ^= 0x01
		err := verify(b)
		if i >= 8 && i < blobHeaderSize {
			continue // not covered by any checksum in the format
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("byte %d flipped: %v, want a corruption", i, err)
		}
	}
}

func TestVerifyRefusesWrongShapes(t *testing.T) {
	good := encode([2][]byte{[]byte("k"), []byte("v")})
	lying := bytes.Clone(good)
	binary.LittleEndian.PutUint64(lying[blobHeaderSize:], 1<<62) // a key longer than the file
	binary.LittleEndian.PutUint32(lying[blobHeaderSize+24:], maskCRC(crc32.Checksum(lying[blobHeaderSize:blobHeaderSize+24], castagnoli)))
	miscounted := bytes.Clone(good)
	foot := miscounted[len(miscounted)-blobFooterSize:]
	binary.LittleEndian.PutUint64(foot[4:], 2)
	binary.LittleEndian.PutUint32(foot[28:], maskCRC(crc32.Checksum(foot[:28], castagnoli)))
	for name, tc := range map[string]struct {
		b    []byte
		size int64
		want string
	}{
		"empty":                       {nil, 0, "shorter than a header"},
		"truncated":                   {good[:len(good)-1], int64(len(good) - 1), "longer than the file"},
		"shorter than its size":       {good[:len(good)-5], int64(len(good)), "EOF"},
		"longer than its size":        {append(bytes.Clone(good), 0), int64(len(good)), "after the footer"},
		"a record longer than a file": {lying, int64(len(lying)), "longer than the file"},
		"a footer miscounting":        {miscounted, int64(len(miscounted)), "counts 2 blobs"},
	} {
		err := Verify(context.Background(), bytes.NewReader(tc.b), tc.size)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a corruption saying %q", name, err, tc.want)
		}
	}
}

func TestVerifyHonoursACanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := encode([2][]byte{[]byte("k"), []byte("v")})
	if err := Verify(ctx, bytes.NewReader(b), int64(len(b))); !errors.Is(err, context.Canceled) {
		t.Errorf("Verify with a canceled context: %v", err)
	}
}

// FuzzVerify: any bytes give nil or a corruption, never a panic or another
// error, and whatever verifies has the shape of a blob file.
func FuzzVerify(f *testing.F) {
	f.Add(encode())
	f.Add(encode([2][]byte{[]byte("key"), []byte("value")}, [2][]byte{[]byte("k2"), bytes.Repeat([]byte{7}, 100)}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		err := verify(b)
		if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Verify: %v, want nil or a corruption", err)
		}
		if err == nil && (len(b) < blobHeaderSize+blobFooterSize || binary.LittleEndian.Uint32(b) != blobMagic) {
			t.Fatalf("Verify accepted %d bytes that are not a blob file", len(b))
		}
	})
}
