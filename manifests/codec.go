package manifests

import (
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// Format 2's body is a JSON string holding, in base64:
//
//	uvarint len(header) | header | deflate(file table)
//
// header is the manifest's JSON without its files ("files": null), so a
// field added to Manifest is carried by both formats. The file table is
//
//	uvarint count, then per file:
//	  flags (1 byte, the file* bits below)
//	  uvarint bytes shared with the previous name | uvarint len(rest) | rest
//	  uvarint size
//	  32 bytes of hash (the algorithm is in the flags)
//	  [uvarint len(key) | key]   only when the key is not the default one
//	  [size bytes]               only for inline files
//
// The default key of a shared file is SharedKey of its digest and size, of
// a private file PrivateKeyOf its checkpoint: keys, which repeat the hash,
// cost nothing unless GC made the writer use a FreshKey. The envelope stays
// JSON with "format": 2, so that a ckpt that reads format 1 only refuses the
// manifest with a clear "upgrade ckpt" instead of a parse error.

const (
	filePrivate  = 1 << 0
	fileUploaded = 1 << 1
	fileKey      = 1 << 2 // an explicit key follows
	fileInline   = 1 << 3
	fileBLAKE3   = 1 << 4 // else SHA-256
	fileKnown    = filePrivate | fileUploaded | fileKey | fileInline | fileBLAKE3
)

// maxNameLen bounds a file name (ValidFileName), checked before a name is
// built so that shared prefixes cannot grow names without bound.
const maxNameLen = 255

// hashLen is the length of a raw hash of either algorithm.
const hashLen = 32

// minFileLen is the fewest bytes a file of the table takes: flags, two name
// lengths, one name byte, size, hash.
const minFileLen = 1 + 1 + 1 + 1 + 1 + hashLen

// defaultKey is the key a file of m has unless its writer chose another.
func (m *Manifest) defaultKey(f File) string {
	if f.Kind == Shared {
		return SharedKey(m.Job, f.Digest(), f.Size)
	}
	return PrivateKeyOf(m.Job, m.Task, m.Checkpoint, m.Epoch, f.Name)
}

// encodeTable returns format 2's compressed file table of m. It costs no
// allocation per file (a checkpoint of 100,000 files encodes one each
// time), and compresses at flate.BestSpeed: the table is mostly hashes,
// which no level compresses, so a higher level spends ~4x the time to
// save ~3% of the bytes (see BenchmarkEncode).
func (m *Manifest) encodeTable() ([]byte, error) {
	// The table goes to the compressor a chunk at a time: memory holds
	// the compressed table, not the raw one too.
	var out bytes.Buffer
	out.Grow(16 + len(m.Files)*(hashLen+8))
	w, err := flate.NewWriter(&out, flate.BestSpeed)
	if err != nil {
		return nil, err
	}
	raw := make([]byte, 0, tableChunk+2*maxNameLen+hashLen+64)
	raw = binary.AppendUvarint(raw, uint64(len(m.Files)))
	prev := ""
	var sum [hashLen]byte
	for i := range m.Files {
		f := &m.Files[i]
		var flags byte
		switch f.Kind {
		case Shared:
		case Private:
			flags |= filePrivate
		default:
			return nil, fmt.Errorf("file %q: unknown kind %q", f.Name, f.Kind)
		}
		if f.Uploaded {
			flags |= fileUploaded
		}
		if f.Inline != nil {
			flags |= fileInline
			if int64(len(f.Inline)) != f.Size {
				return nil, fmt.Errorf("file %q: inline bytes do not match its size", f.Name)
			}
		} else if !m.hasDefaultKey(f) {
			flags |= fileKey
		}
		hexSum := f.SHA256
		if f.BLAKE3 != "" {
			flags |= fileBLAKE3
			hexSum = f.BLAKE3
		}
		if !decodeHash(&sum, hexSum) || f.Size < 0 {
			return nil, fmt.Errorf("file %q: bad size or hash", f.Name)
		}
		common := 0
		for common < len(prev) && common < len(f.Name) && prev[common] == f.Name[common] {
			common++
		}
		raw = append(raw, flags)
		raw = binary.AppendUvarint(raw, uint64(common))
		raw = binary.AppendUvarint(raw, uint64(len(f.Name)-common))
		raw = append(raw, f.Name[common:]...)
		raw = binary.AppendUvarint(raw, uint64(f.Size))
		raw = append(raw, sum[:]...)
		if flags&fileKey != 0 {
			raw = binary.AppendUvarint(raw, uint64(len(f.Key)))
			raw = append(raw, f.Key...)
		}
		raw = append(raw, f.Inline...)
		prev = f.Name
		if len(raw) >= tableChunk {
			if _, err := w.Write(raw); err != nil {
				return nil, err
			}
			raw = raw[:0]
		}
	}
	if _, err := w.Write(raw); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// tableChunk is how much of the raw file table encodeTable builds before
// it hands it to the compressor.
const tableChunk = 64 << 10

// hasDefaultKey reports whether f.Key is m.defaultKey(f), without building
// that key for a shared file: SharedKey is
// <job>/shared/<hh>/<alg prefix><hex>-<size>.
func (m *Manifest) hasDefaultKey(f *File) bool {
	if f.Kind != Shared {
		return f.Key == m.defaultKey(*f)
	}
	h, alg := f.SHA256, ""
	if f.BLAKE3 != "" {
		h, alg = f.BLAKE3, blake3Prefix
	}
	hh := "xx"
	if len(h) >= 2 {
		hh = h[:2]
	}
	var num [20]byte
	size := strconv.AppendInt(num[:0], f.Size, 10)
	k := f.Key
	if len(k) != len(m.Job)+len(sharedDir)+len(hh)+1+len(alg)+len(h)+1+len(size) {
		return false
	}
	for _, part := range [...]string{m.Job, sharedDir, hh, "/", alg, h, "-"} {
		if k[:len(part)] != part {
			return false
		}
		k = k[len(part):]
	}
	return k == string(size)
}

// sharedDir follows the job in a shared key (see SharedPrefix).
const sharedDir = "/shared/"

// decodeHash decodes the hex of a hash (either case) into sum; false when
// s is not 2*hashLen hex digits.
func decodeHash(sum *[hashLen]byte, s string) bool {
	if len(s) != 2*hashLen {
		return false
	}
	bad := byte(0)
	for i := range sum {
		hi, lo := hexValue[s[2*i]], hexValue[s[2*i+1]]
		bad |= hi | lo
		sum[i] = hi<<4 | lo&0x0f
	}
	return bad&0xf0 == 0
}

// hexValue maps a hex digit (either case) to its value, anything else to
// 0xff: a table, not branches, as a checkpoint of 100,000 files decodes
// 6.4 million digits each time.
var hexValue = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i, c := range "0123456789abcdef" {
		t[c] = byte(i)
	}
	for i, c := range "ABCDEF" {
		t[c] = byte(10 + i)
	}
	return t
}()

// encodeHeader returns format 2's header: m's JSON without its files.
func (m *Manifest) encodeHeader() ([]byte, error) {
	h := *m
	h.Files = nil
	return json.Marshal(&h)
}

// envelope2Len is the length of the stored form of format 2 (see
// appendEnvelope2) for a header and a compressed table of these lengths.
func envelope2Len(header, table int) int {
	raw := uvarintLen(uint64(header)) + header + table
	return len(envelope2Start) + 2*sha256.Size + len(envelope2Body) + base64.StdEncoding.EncodedLen(raw) + len(envelope2End)
}

// The stored form of format 2, as encoding/json writes the envelope
// {"format":2,"sha256":...,"body":"<base64>"}: base64 needs no escaping.
const (
	envelope2Start = `{"format":2,"sha256":"`
	envelope2Body  = `","body":"`
	envelope2End   = `"}`
)

// appendEnvelope2 returns format 2's stored form: the envelope around the
// body, a JSON string holding in base64 uvarint len(header) | header |
// table, and the SHA-256 of that body (quotes included), built in one
// buffer of its final size.
func appendEnvelope2(header, table []byte) []byte {
	// The body's bytes are encoded in two parts, the second being the
	// bulk of the table as it is: a first part of a length divisible by 3
	// encodes to exactly the first characters of the whole.
	head := make([]byte, 0, uvarintLen(uint64(len(header)))+len(header)+2)
	head = binary.AppendUvarint(head, uint64(len(header)))
	head = append(head, header...)
	k := min((3-len(head)%3)%3, len(table))
	head = append(head, table[:k]...)
	out := make([]byte, envelope2Len(len(header), len(table)))
	n := copy(out, envelope2Start)
	sumAt := n
	n += 2 * sha256.Size
	n += copy(out[n:], envelope2Body)
	bodyStart := n - 1 // the opening quote
	base64.StdEncoding.Encode(out[n:], head)
	n += base64.StdEncoding.EncodedLen(len(head))
	base64.StdEncoding.Encode(out[n:], table[k:])
	n += base64.StdEncoding.EncodedLen(len(table) - k)
	n += copy(out[n:], envelope2End)
	sum := sha256.Sum256(out[bodyStart : n-1]) // through the closing quote
	hex.Encode(out[sumAt:], sum[:])
	return out
}

func uvarintLen(v uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], v)
}

// errTable is the error of a malformed file table.
var errTable = errors.New("manifest body: malformed file table: the manifest is corrupt")

// decodeBody2 parses format 2's body (see encodeBody2). Every length is
// checked against the bytes left, the inflated table is bounded by
// MaxManifestBytes, and nothing it reads can make it panic.
func decodeBody2(body []byte) (*Manifest, error) {
	var s string
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("manifest body: format 2 holds a base64 string: %w", err)
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("manifest body: %w", err)
	}
	hlen, k := binary.Uvarint(raw)
	if k <= 0 || hlen > uint64(len(raw)-k) {
		return nil, errors.New("manifest body: bad header length: the manifest is corrupt")
	}
	header, rest := raw[k:k+int(hlen)], raw[k+int(hlen):]
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("manifest header: %w", err)
	}
	if dec.More() || m.Files != nil {
		return nil, errors.New("manifest header: unexpected content after the header or files in it: the manifest is corrupt")
	}
	fr := flate.NewReader(bytes.NewReader(rest))
	defer fr.Close()
	table, err := io.ReadAll(io.LimitReader(fr, MaxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("manifest file table: %w", err)
	}
	if len(table) > MaxManifestBytes {
		return nil, fmt.Errorf("manifest file table exceeds the %d byte limit", MaxManifestBytes)
	}
	files, err := m.decodeTable(table)
	if err != nil {
		return nil, err
	}
	m.Files = files
	return &m, nil
}

// tableReader reads a file table, failing on the first short read.
type tableReader struct {
	b   []byte
	bad bool
}

func (r *tableReader) uvarint() uint64 {
	v, k := binary.Uvarint(r.b)
	if k <= 0 {
		r.bad = true
		r.b = nil
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *tableReader) bytes(n uint64) []byte {
	if r.bad || n > uint64(len(r.b)) {
		r.bad = true
		r.b = nil
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

// decodeTable parses a file table of m (whose header is read: default
// keys need its job, task, checkpoint and epoch).
func (m *Manifest) decodeTable(table []byte) ([]File, error) {
	r := &tableReader{b: table}
	count := r.uvarint()
	if r.bad || count > uint64(len(r.b))/minFileLen {
		return nil, errTable
	}
	files := make([]File, 0, count)
	prev := ""
	for range count {
		fl := r.bytes(1)
		if r.bad || fl[0]&^fileKnown != 0 {
			return nil, errTable
		}
		flags := fl[0]
		common := r.uvarint()
		rest := r.bytes(r.uvarint())
		size := r.uvarint()
		sum := r.bytes(hashLen)
		if r.bad || common > uint64(len(prev)) || common+uint64(len(rest)) > maxNameLen || size > math.MaxInt64 {
			return nil, errTable
		}
		f := File{Name: prev[:common] + string(rest), Kind: Shared, Size: int64(size), Uploaded: flags&fileUploaded != 0}
		if flags&filePrivate != 0 {
			f.Kind = Private
		}
		alg := SHA256
		if flags&fileBLAKE3 != 0 {
			alg = BLAKE3
		}
		f.SetDigest(digestOf(alg, hex.EncodeToString(sum)))
		switch {
		case flags&fileInline != 0:
			if flags&fileKey != 0 {
				return nil, errTable
			}
			f.Inline = bytes.Clone(r.bytes(size))
			if f.Inline == nil {
				f.Inline = []byte{}
			}
		case flags&fileKey != 0:
			f.Key = string(r.bytes(r.uvarint()))
		default:
			f.Key = m.defaultKey(f)
		}
		if r.bad {
			return nil, errTable
		}
		files = append(files, f)
		prev = f.Name
	}
	if len(r.b) != 0 {
		return nil, errors.New("manifest body: bytes after the file table: the manifest is corrupt")
	}
	return files, nil
}
