package manifests

import (
	"bufio"
	"bytes"
	"compress/flate"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/ckpt-io/ckpt/storage"
)

// Walk is Decode for readers that need each file once and no file after:
// GC's live set, a listing's totals, verify, the dedup candidates of other
// tasks. It checks exactly what Decode checks and hands the files to fn
// one at a time, in the manifest's order, through a FileView that is valid
// only during the call. A manifest as ckpt writes it (file names in order,
// a format 1 body with its fields in Encode's order) is walked file by
// file, a format 2 table as it is inflated, a format 1 body token by
// token: memory holds data and one file, not the files, whose decoded form
// is ten times the size of a format 2 manifest. Any other manifest is
// decoded whole (Decode) and then walked.
//
// Walk returns the manifest with Files nil, and the number of files. The
// checksum of data is checked before fn sees a file; a problem found
// later (a malformed file) makes Walk fail after fn saw the files before
// it, so a caller keeps what fn gathered only when Walk succeeds. An error
// from fn stops the walk and is returned as it is.
func Walk(data []byte, fn func(*FileView) error) (*Manifest, int, error) {
	m, n, err := walk(data, nil, fn)
	var fe *walkFnError
	if errors.As(err, &fe) {
		return nil, 0, fe.err
	}
	return m, n, err
}

// walk is Walk that also calls check, when not nil, with the manifest's
// header before fn sees a file; fn's errors come back as *walkFnError.
func walk(data []byte, check func(*Manifest) error, fn func(*FileView) error) (*Manifest, int, error) {
	if fn == nil {
		fn = func(*FileView) error { return nil }
	}
	if check == nil {
		check = func(*Manifest) error { return nil }
	}
	if len(data) > MaxManifestBytes {
		return nil, 0, fmt.Errorf("manifest of %d bytes exceeds the %d byte limit", len(data), MaxManifestBytes)
	}
	format, sum, body, b64, ok := splitEnvelope(data)
	if !ok {
		var env envelope
		if err := json.Unmarshal(data, &env); err != nil {
			return nil, 0, fmt.Errorf("manifest is not valid JSON: %w", err)
		}
		format, sum, body = env.Format, env.SHA256, env.Body
	}
	if format != Format1 && format != Format2 {
		return nil, 0, fmt.Errorf("manifest format %d is not supported by this ckpt (it reads formats 1 and 2); upgrade ckpt", format)
	}
	got := sha256.Sum256(body)
	if hex.EncodeToString(got[:]) != sum {
		return nil, 0, errors.New("manifest checksum mismatch: the manifest is corrupt or was tampered with")
	}
	if format == Format2 {
		m, n, err := walkBody2(body, b64, check, fn)
		if !errors.Is(err, errUnsorted) {
			return m, n, err
		}
		// Names out of order: Decode checks them with a set; the files
		// before n were handed over already and are the same.
		return walkDecoded(data, n, check, fn)
	}
	m, n, err := walkBody1(body, check, fn)
	if !errors.Is(err, errUnsorted) {
		return m, n, err
	}
	// Not as Encode writes it, or out of order: decoded whole; the header
	// is checked again, as it may differ from the part seen before the
	// files.
	return walkDecoded(data, n, check, fn)
}

// walkBody1 is decodeBody1 and Validate, a file at a time: the JSON body
// is read token by token and its files one by one, so memory holds data
// and one file. It needs the fields the files are checked against (job,
// task, checkpoint, epoch) before "files", where Encode writes them, and
// names in order; it returns errUnsorted, with the number of files handed
// over, when a body is not like that, and the caller decodes it whole.
func walkBody1(body []byte, check func(*Manifest) error, fn func(*FileView) error) (*Manifest, int, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	bad := func(err error) (*Manifest, int, error) {
		return nil, 0, fmt.Errorf("manifest body: %w", err)
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		// Let Decode word the error.
		return nil, 0, errUnsorted
	}
	fields := map[string]json.RawMessage{}
	var m Manifest
	n := 0
	var full int64
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return bad(err)
		}
		key, _ := t.(string)
		for k := range fields {
			if strings.EqualFold(k, key) {
				return nil, n, errUnsorted // the same field twice: as Decode does it
			}
		}
		if !strings.EqualFold(key, "files") {
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return bad(err)
			}
			fields[key] = v
			continue
		}
		if key != "files" {
			return nil, n, errUnsorted
		}
		fields[key] = nil
		// The header so far: the files are checked against it.
		if err := unmarshalHeader(fields, &m); err != nil {
			return nil, n, errUnsorted
		}
		m.Format = Format1
		if err := m.validateHeader(); err != nil {
			return nil, n, errUnsorted
		}
		if err := check(&m); err != nil {
			return nil, 0, err
		}
		if t, err := dec.Token(); err != nil || t != json.Delim('[') {
			return nil, n, errUnsorted // null, or not an array
		}
		var prev string
		privateKeys := map[string]bool{}
		var v FileView
		for dec.More() {
			var f File
			if err := dec.Decode(&f); err != nil {
				return bad(err)
			}
			// decodeBody1's reading of an empty private file.
			if f.Kind == Private && f.Key == "" && f.Inline == nil && f.Size == 0 {
				f.Inline = []byte{}
			}
			if err := ValidFileName(f.Name); err != nil {
				return nil, n, fmt.Errorf("manifest of %s checkpoint %d: %w", m.Task, m.Checkpoint, err)
			}
			if n > 0 && f.Name <= prev {
				return nil, n, errUnsorted
			}
			if err := m.checkFile(f, privateKeys); err != nil {
				return nil, n, err
			}
			full += f.Size
			v.set(f)
			if err := fn(&v); err != nil {
				return nil, n, &walkFnError{err}
			}
			prev = f.Name
			n++
		}
		if _, err := dec.Token(); err != nil {
			return bad(err)
		}
	}
	if _, err := dec.Token(); err != nil {
		return bad(err)
	}
	// The whole header: what followed the files must not change what they
	// were checked against.
	var whole Manifest
	if err := unmarshalHeader(fields, &whole); err != nil {
		return nil, n, errUnsorted
	}
	whole.Format = Format1
	if _, ok := fields["files"]; !ok || whole.Job != m.Job || whole.Task != m.Task || whole.Checkpoint != m.Checkpoint || whole.Epoch != m.Epoch {
		return nil, n, errUnsorted
	}
	if full != whole.FullSize {
		return nil, n, fmt.Errorf("manifest: full size %d does not equal the sum of its files %d", whole.FullSize, full)
	}
	return &whole, n, nil
}

// unmarshalHeader decodes the fields of a format 1 body but its files into
// m, as decodeBody1 would (unknown fields refused).
func unmarshalHeader(fields map[string]json.RawMessage, m *Manifest) error {
	obj := map[string]json.RawMessage{}
	for k, v := range fields {
		if k != "files" {
			obj[k] = v
		}
	}
	raw, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(m)
}

// errUnsorted stops walkBody2 at a name not after the one before it.
var errUnsorted = errors.New("file names out of order")

// walkDecoded decodes data whole and hands fn its files from the skip-th
// on, after check (when not nil) accepted the manifest.
func walkDecoded(data []byte, skip int, check func(*Manifest) error, fn func(*FileView) error) (*Manifest, int, error) {
	m, err := Decode(data)
	if err != nil {
		return nil, 0, err
	}
	if check != nil {
		if err := check(m); err != nil {
			return nil, 0, err
		}
	}
	var v FileView
	for _, f := range m.Files[min(skip, len(m.Files)):] {
		v.set(f)
		if err := fn(&v); err != nil {
			return nil, 0, &walkFnError{err}
		}
	}
	n := len(m.Files)
	m.Files = nil
	return m, n, nil
}

// FileView is one file of a manifest as Walk hands it over. Its slices
// point into buffers Walk reuses: copy what must outlive the call.
type FileView struct {
	Name     []byte
	Kind     Kind
	Size     int64
	Alg      Alg
	Sum      []byte // the raw 32-byte hash
	Key      []byte // the object's key; empty when Inline holds the bytes
	Inline   []byte // nil unless the bytes are in the manifest
	Uploaded bool
}

// Digest returns the file's digest (see digest.go).
func (v *FileView) Digest() string { return digestOf(v.Alg, hex.EncodeToString(v.Sum)) }

// File returns the file as Decode would, its own copy.
func (v *FileView) File() File {
	f := File{Name: string(v.Name), Kind: v.Kind, Size: v.Size, Key: string(v.Key), Uploaded: v.Uploaded}
	f.SetDigest(v.Digest())
	if v.Inline != nil {
		f.Inline = bytes.Clone(v.Inline)
		if f.Inline == nil {
			f.Inline = []byte{}
		}
	}
	return f
}

// set fills v from a decoded file (format 1, or a table out of order).
func (v *FileView) set(f File) {
	sum, _ := hex.DecodeString(hexOf(f.Digest())) // Validate checked it
	*v = FileView{Name: []byte(f.Name), Kind: f.Kind, Size: f.Size, Alg: f.Alg(), Sum: sum, Key: []byte(f.Key), Inline: f.Inline, Uploaded: f.Uploaded}
}

// splitEnvelope parses the envelope as Encode writes it,
// {"format":N,"sha256":"<64>","body":<body>}, without copying the body,
// when the body is a string of base64 characters (format 2) or a valid
// JSON object (format 1); b64 says which. ok is false for any other
// spelling, which json.Unmarshal then parses: the result is the same, this
// is only cheaper.
func splitEnvelope(data []byte) (format int, sum string, body []byte, b64, ok bool) {
	rest, ok := bytes.CutPrefix(data, []byte(`{"format":`))
	if !ok {
		return 0, "", nil, false, false
	}
	i := 0
	for i < len(rest) && i < 3 && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	if i == 0 || (i > 1 && rest[0] == '0') {
		return 0, "", nil, false, false
	}
	format, _ = strconv.Atoi(string(rest[:i]))
	rest, ok = bytes.CutPrefix(rest[i:], []byte(`,"sha256":"`))
	if !ok || len(rest) < 64 {
		return 0, "", nil, false, false
	}
	sumb := rest[:64]
	for _, c := range sumb {
		if c < '0' || c > 'f' || (c > '9' && c < 'a') {
			return 0, "", nil, false, false
		}
	}
	rest, ok = bytes.CutPrefix(rest[64:], []byte(`","body":`))
	if !ok || len(rest) < 3 || rest[len(rest)-1] != '}' {
		return 0, "", nil, false, false
	}
	body = rest[:len(rest)-1]
	switch {
	case body[0] == '"' && body[len(body)-1] == '"' && allBase64(body[1:len(body)-1]):
		// A JSON string of base64 characters, which JSON neither escapes
		// nor forbids.
		return format, string(sumb), body, true, true
	case body[0] == '{' && json.Valid(body):
		return format, string(sumb), body, false, true
	}
	return 0, "", nil, false, false
}

// base64Chars marks the bytes of standard base64 and its padding.
var base64Chars = func() (t [256]bool) {
	for _, c := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") {
		t[c] = true
	}
	return t
}()

func allBase64(b []byte) bool {
	ok := true
	for _, c := range b {
		ok = ok && base64Chars[c]
	}
	return ok
}

// walkBody2 is decodeBody2 and Validate, a file at a time (canonical: body
// is a JSON string of base64 characters, as splitEnvelope checked). It returns
// errUnsorted, with the number of files handed over, at the first name
// not after the one before it.
func walkBody2(body []byte, canonical bool, check func(*Manifest) error, fn func(*FileView) error) (*Manifest, int, error) {
	var b64 []byte
	if canonical || len(body) >= 2 && body[0] == '"' && body[len(body)-1] == '"' && allBase64(body[1:len(body)-1]) {
		b64 = body[1 : len(body)-1]
	} else {
		var s string
		if err := json.Unmarshal(body, &s); err != nil {
			return nil, 0, fmt.Errorf("manifest body: format 2 holds a base64 string: %w", err)
		}
		b64 = []byte(s)
	}
	return walkBase64(bytes.NewReader(b64), check, fn)
}

// walkBase64 walks format 2's body from r, its base64 text.
func walkBase64(r io.Reader, check func(*Manifest) error, fn func(*FileView) error) (*Manifest, int, error) {
	raw := &drainingReader{r: base64.NewDecoder(base64.StdEncoding, r)}
	br := bufio.NewReaderSize(raw, 32<<10)
	hlen, err := binary.ReadUvarint(br)
	var hbuf bytes.Buffer
	if err == nil && hlen <= MaxManifestBytes {
		// Grown as the bytes arrive: a corrupt length allocates nothing.
		var n int64
		n, err = io.CopyN(&hbuf, br, int64(hlen))
		if err == nil && n != int64(hlen) {
			err = io.ErrUnexpectedEOF
		}
	}
	if err != nil || hlen > MaxManifestBytes {
		if raw.err != nil {
			return nil, 0, fmt.Errorf("manifest body: %w", raw.err)
		}
		return nil, 0, errors.New("manifest body: bad header length: the manifest is corrupt")
	}
	header := hbuf.Bytes()
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, 0, fmt.Errorf("manifest header: %w", err)
	}
	if dec.More() || m.Files != nil {
		return nil, 0, errors.New("manifest header: unexpected content after the header or files in it: the manifest is corrupt")
	}
	m.Format = Format2
	if err := m.validateHeader(); err != nil {
		return nil, 0, err
	}
	if err := check(&m); err != nil {
		return nil, 0, err
	}
	fr := flate.NewReader(br)
	defer fr.Close()
	w := &tableWalker{m: &m, r: bufio.NewReaderSize(&limitedTable{r: fr, left: MaxManifestBytes}, 32<<10)}
	n, err := w.walk(fn)
	var fe *walkFnError
	switch {
	case errors.As(err, &fe) || errors.Is(err, errUnsorted):
		return nil, n, err
	case err != nil && raw.err != nil:
		return nil, 0, fmt.Errorf("manifest body: %w", raw.err)
	case err != nil:
		return nil, 0, err
	}
	// Decode rejects base64 it would not read to the end, too.
	if _, err := io.Copy(io.Discard, br); err != nil || raw.err != nil {
		return nil, 0, fmt.Errorf("manifest body: %w", errors.Join(err, raw.err))
	}
	if w.full != m.FullSize {
		return nil, 0, fmt.Errorf("manifest: full size %d does not equal the sum of its files %d", m.FullSize, w.full)
	}
	return &m, n, nil
}

// drainingReader remembers its reader's first error other than EOF, so
// that a failure of the base64 layer is reported as such rather than as
// whatever the layers above made of the short read.
type drainingReader struct {
	r   io.Reader
	err error
}

func (d *drainingReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if err != nil && err != io.EOF && d.err == nil {
		d.err = err
	}
	return n, err
}

// limitedTable fails once the inflated table passes MaxManifestBytes, the
// bound decodeBody2 puts on it.
type limitedTable struct {
	r    io.Reader
	left int64
}

func (l *limitedTable) Read(p []byte) (int, error) {
	if l.left <= 0 {
		if n, _ := l.r.Read(make([]byte, 1)); n > 0 {
			return 0, fmt.Errorf("manifest file table exceeds the %d byte limit", MaxManifestBytes)
		}
		return 0, io.EOF
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// tableWalker reads a format 2 file table from r (see encodeTable).
type tableWalker struct {
	m    *Manifest
	r    *bufio.Reader
	full int64
	err  error // the first read error, reported instead of errTable
}

func (w *tableWalker) uvarint() (uint64, bool) {
	v, err := binary.ReadUvarint(w.r)
	if err != nil {
		w.fail(err)
		return 0, false
	}
	return v, true
}

func (w *tableWalker) read(dst []byte) bool {
	if _, err := io.ReadFull(w.r, dst); err != nil {
		w.fail(err)
		return false
	}
	return true
}

func (w *tableWalker) fail(err error) {
	if w.err == nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		w.err = err
	}
}

func (w *tableWalker) bad() error {
	if w.err != nil {
		return fmt.Errorf("manifest file table: %w", w.err)
	}
	return errTable
}

// walk hands the files of the table to fn and returns how many it did.
func (w *tableWalker) walk(fn func(*FileView) error) (int, error) {
	m := w.m
	count, ok := w.uvarint()
	if !ok {
		return 0, w.bad()
	}
	e := &tableEntry{
		sharedPrefix:  []byte(SharedPrefix(m.Job)),
		privatePrefix: []byte(PrivateKeyOf(m.Job, m.Task, m.Checkpoint, m.Epoch, "")),
		name:          make([]byte, 0, maxNameLen),
		prev:          make([]byte, 0, maxNameLen),
		privateKeys:   map[string]bool{},
	}
	for i := uint64(0); i < count; i++ {
		if err := w.entry(e); err != nil {
			return int(i), err
		}
		if err := w.check(e, i); err != nil {
			return int(i), err
		}
		w.full += e.v.Size
		if w.full < 0 {
			return int(i), fmt.Errorf("manifest: full size overflows")
		}
		if err := fn(&e.v); err != nil {
			return int(i), &walkFnError{err}
		}
		e.prev, e.name = e.name, e.prev
	}
	// Nothing may follow the table.
	if _, err := w.r.ReadByte(); err != io.EOF {
		if err != nil {
			return int(count), fmt.Errorf("manifest file table: %w", err)
		}
		return int(count), errors.New("manifest body: bytes after the file table: the manifest is corrupt")
	}
	return int(count), nil
}

// tableEntry is the file table walker's scratch space, reused from file
// to file so that a walk allocates nothing per file: the file as read (v,
// whose Name, Key and Inline point into the buffers here), its flags and
// default key, and what the checks of the files before it remember.
type tableEntry struct {
	v                           FileView
	flags                       byte
	name, prev                  []byte
	sum                         [hashLen]byte
	key, defKey                 []byte
	inline                      bytes.Buffer
	privateKeys                 map[string]bool
	sharedPrefix, privatePrefix []byte
}

// entry reads the next file of the table into e.v.
func (w *tableWalker) entry(e *tableEntry) error {
	flags, err := w.r.ReadByte()
	if err != nil {
		w.fail(err)
		return w.bad()
	}
	if flags&^fileKnown != 0 {
		return w.bad()
	}
	common, ok1 := w.uvarint()
	restLen, ok2 := w.uvarint()
	if !ok1 || !ok2 || common > uint64(len(e.prev)) || restLen > maxNameLen || common+restLen > maxNameLen {
		return w.bad()
	}
	name := append(e.name[:0], e.prev[:common]...)
	name = name[:common+restLen]
	e.name = name
	if !w.read(name[common:]) {
		return w.bad()
	}
	size, ok := w.uvarint()
	if !ok || size > math.MaxInt64 || !w.read(e.sum[:]) {
		return w.bad()
	}
	alg := SHA256
	if flags&fileBLAKE3 != 0 {
		alg = BLAKE3
	}
	e.flags = flags
	e.v = FileView{Name: name, Kind: Shared, Size: int64(size), Alg: alg, Sum: e.sum[:], Uploaded: flags&fileUploaded != 0}
	v := &e.v
	if flags&filePrivate != 0 {
		v.Kind = Private
	}
	// The default key: the content address of a shared file, the
	// checkpoint's place of a private one.
	if v.Kind == Shared {
		e.defKey = append(e.defKey[:0], e.sharedPrefix...)
		e.defKey = hex.AppendEncode(e.defKey, e.sum[:1])
		e.defKey = append(e.defKey, '/')
		if alg == BLAKE3 {
			e.defKey = append(e.defKey, blake3Prefix...)
		}
		e.defKey = hex.AppendEncode(e.defKey, e.sum[:])
		e.defKey = append(e.defKey, '-')
		e.defKey = strconv.AppendInt(e.defKey, v.Size, 10)
	} else {
		e.defKey = append(append(e.defKey[:0], e.privatePrefix...), name...)
	}
	switch {
	case flags&fileInline != 0:
		if flags&fileKey != 0 || size > MaxManifestBytes {
			return w.bad()
		}
		e.inline.Reset()
		if n, err := io.CopyN(&e.inline, w.r, int64(size)); err != nil || n != int64(size) {
			w.fail(err)
			return w.bad()
		}
		v.Inline = e.inline.Bytes()
		if v.Inline == nil {
			v.Inline = []byte{}
		}
	case flags&fileKey != 0:
		klen, ok := w.uvarint()
		if !ok || klen > MaxManifestBytes {
			return w.bad()
		}
		if uint64(cap(e.key)) < klen {
			e.key = make([]byte, klen)
		}
		e.key = e.key[:klen]
		if !w.read(e.key) {
			return w.bad()
		}
		v.Key = e.key
	default:
		v.Key = e.defKey
	}
	return nil
}

// check applies Validate's checks, in the same order, to e.v, the i-th
// file of the table.
func (w *tableWalker) check(e *tableEntry, i uint64) error {
	m, v, name := w.m, &e.v, e.name
	if !validFileNameBytes(name) {
		return fmt.Errorf("manifest of %s checkpoint %d: %w", m.Task, m.Checkpoint, ValidFileName(string(name)))
	}
	if i > 0 && bytes.Compare(name, e.prev) <= 0 {
		return errUnsorted
	}
	switch {
	case v.Kind == Shared:
		if !isKeyOrFreshBytes(v.Key, e.defKey) || v.Inline != nil {
			return fmt.Errorf("manifest: shared file %q: key %q is not its content address", name, v.Key)
		}
	case v.Inline != nil:
		if err := checkInline(v.Alg, v.Inline, e.sum[:]); err != nil {
			return fmt.Errorf("manifest: private file %q: inline bytes: %w", name, err)
		}
	case !isKeyOrFreshBytes(v.Key, e.defKey):
		return fmt.Errorf("manifest: private file %q: key %q is outside its checkpoint", name, v.Key)
	case e.flags&fileKey != 0:
		// A default private key repeats its (unique) name; a fresh one
		// may equal another file's default key.
		if e.privateKeys[string(v.Key)] {
			return fmt.Errorf("manifest: private file %q: key %q names another file's object too", name, v.Key)
		}
		e.privateKeys[string(v.Key)] = true
	default:
		e.privateKeys[string(v.Key)] = true
	}
	return nil
}

// validFileNameBytes is ValidFileName of a name held as bytes, without an
// allocation.
func validFileNameBytes(name []byte) bool {
	return len(name) > 0 && len(name) <= 255 && !(len(name) == 1 && name[0] == '.') && !(len(name) == 2 && name[0] == '.' && name[1] == '.') &&
		!bytes.ContainsAny(name, "/\\\x00")
}

// walkFnError carries an error of Walk's fn through the layers of the walk.
type walkFnError struct{ err error }

func (e *walkFnError) Error() string { return e.err.Error() }
func (e *walkFnError) Unwrap() error { return e.err }

// isKeyOrFreshBytes is isKeyOrFresh without strings.
func isKeyOrFreshBytes(key, want []byte) bool {
	if bytes.Equal(key, want) {
		return true
	}
	rest, ok := bytes.CutPrefix(key, want)
	if !ok || len(rest) != 1+freshSuffixLen || rest[0] != '.' {
		return false
	}
	for _, c := range rest[1:] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// checkInline checks inline bytes against the raw hash of their file.
func checkInline(alg Alg, b, sum []byte) error {
	f := File{}
	f.SetDigest(digestOf(alg, hex.EncodeToString(sum)))
	return f.Check(SumBytes(alg, b))
}

// validateHeader is the part of Validate that is not about files.
func (m *Manifest) validateHeader() error {
	if err := ValidName("job", m.Job); err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	if err := ValidName("task", m.Task); err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	if m.Checkpoint == 0 {
		return errors.New("manifest: checkpoint number 0")
	}
	if m.Tasks != nil {
		if err := CheckTasks(m.Task, m.Tasks); err != nil {
			return fmt.Errorf("manifest of %s checkpoint %d: %w", m.Task, m.Checkpoint, err)
		}
		if !slices.IsSorted(m.Tasks) {
			return fmt.Errorf("manifest of %s checkpoint %d: tasks list is not sorted", m.Task, m.Checkpoint)
		}
	}
	return nil
}

// WalkRef is LoadRef with Walk: it reads the manifest ref names and hands
// its files to fn one at a time (see Walk), returning the manifest without
// its files and their number. Its errors are LoadRef's (an unusable
// manifest is an *UnreadableError), and fn's as fn returned them.
func WalkRef(ctx context.Context, s storage.Store, job string, ref Ref, fn func(*FileView) error) (*Manifest, int, error) {
	data, key, err := readRef(ctx, s, job, ref)
	if err != nil {
		return nil, 0, err
	}
	return walkStored(data, key, job, ref, fn)
}

// readRef reads the manifest ref names as stored, and its key.
func readRef(ctx context.Context, s storage.Store, job string, ref Ref) ([]byte, string, error) {
	key := ref.Key
	if key == "" {
		key = ManifestKeyOf(job, ref.Task, ref.Checkpoint, ref.Epoch)
	}
	rc, err := s.Get(ctx, key)
	if err != nil {
		return nil, key, fmt.Errorf("read manifest of %s checkpoint %d: %w", ref.Task, ref.Checkpoint, err)
	}
	data, err := readSized(rc, ref.ManifestSize, MaxManifestBytes+1)
	rc.Close()
	if err != nil {
		return nil, key, fmt.Errorf("read manifest of %s checkpoint %d: %w", ref.Task, ref.Checkpoint, err)
	}
	return data, key, nil
}

// walkStored walks data, the manifest stored at key for ref, with
// WalkRef's errors.
func walkStored(data []byte, key, job string, ref Ref, fn func(*FileView) error) (*Manifest, int, error) {
	m, count, err := walk(data, placeCheck(job, ref), fn)
	var fe *walkFnError
	switch {
	case errors.As(err, &fe):
		return nil, 0, fe.err
	case err != nil:
		return nil, 0, &UnreadableError{Key: key, Err: err}
	}
	return m, count, nil
}

// placeCheck fails for a manifest stored where another belongs: fn sees
// no file of it.
func placeCheck(job string, ref Ref) func(*Manifest) error {
	return func(m *Manifest) error {
		if m.Job != job || m.Task != ref.Task || m.Checkpoint != ref.Checkpoint || m.Epoch != ref.Epoch {
			return fmt.Errorf("names job %q task %q checkpoint %d epoch %d, not where it is stored", m.Job, m.Task, m.Checkpoint, m.Epoch)
		}
		return nil
	}
}
