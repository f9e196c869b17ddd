package manifests

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/ckpt-io/ckpt/storage"
)

// StreamWalkRef is WalkRef for GC's live set: a format 2 manifest spelled
// as Encode spells it is walked as it arrives from storage, so that memory
// holds neither the manifest nor its files (a manifest of 225,000 files
// is 10 MB). The price is the order of the checks: fn sees files before
// the checksum, which covers the whole body, is compared at the end, and
// a manifest not in Encode's spelling, or with names out of order, is read
// again and walked by WalkRef, fn seeing its first files twice. So fn must
// be idempotent, and what it gathered must be dropped when StreamWalkRef
// fails, as GC does: a failure stops the collection before anything is
// deleted. Its errors are WalkRef's.
func StreamWalkRef(ctx context.Context, s storage.Store, job string, ref Ref, fn func(*FileView) error) error {
	key := ref.Key
	if key == "" {
		key = ManifestKeyOf(job, ref.Task, ref.Checkpoint, ref.Epoch)
	}
	readErr := func(err error) error {
		return fmt.Errorf("read manifest of %s checkpoint %d: %w", ref.Task, ref.Checkpoint, err)
	}
	rc, err := s.Get(ctx, key)
	if err != nil {
		return readErr(err)
	}
	defer rc.Close()
	br := bufio.NewReaderSize(io.LimitReader(rc, MaxManifestBytes+1), 64<<10)
	const prefixLen = len(`{"format":2,"sha256":"`) + 64 + len(`","body":"`)
	prefix, err := br.Peek(prefixLen)
	if err != nil && err != io.EOF {
		return readErr(err)
	}
	format, sum, _, b64, ok := splitEnvelope(append(bytes.Clone(prefix), `"}`...))
	if !ok || !b64 || format != Format2 {
		rc.Close()
		_, _, err := WalkRef(ctx, s, job, ref, fn)
		return err
	}
	br.Discard(prefixLen - 1) // the body starts at its quote
	body := &bodyStream{r: br, h: sha256.New()}
	_, _, err = walkBase64(body, placeCheck(job, ref), fn)
	if err == nil {
		err = body.finish()
	}
	var fe *walkFnError
	switch {
	case body.readErr != nil:
		return readErr(body.readErr)
	case errors.As(err, &fe):
		return fe.err
	case errors.Is(err, errUnsorted), errors.Is(err, errNotCanonical):
		rc.Close()
		_, _, err := WalkRef(ctx, s, job, ref, fn)
		return err
	case err != nil:
		return &UnreadableError{Key: key, Err: err}
	}
	if hex.EncodeToString(body.h.Sum(nil)) != sum {
		return &UnreadableError{Key: key, Err: errors.New("manifest checksum mismatch: the manifest is corrupt or was tampered with")}
	}
	return nil
}

// errNotCanonical stops a streamed walk at a byte Encode does not write
// there (an escape in the body string, space after it): the manifest may
// still be valid JSON, and is read again the usual way.
var errNotCanonical = errors.New("manifest not in the spelling ckpt writes")

// bodyStream reads format 2's body string from r: it hashes every byte of
// the body (its quotes included), hands on the base64 text between the
// quotes, and after the closing quote wants `}` and the end.
type bodyStream struct {
	r       *bufio.Reader
	h       hash.Hash
	started bool
	done    bool
	readErr error // storage's, as opposed to a malformed manifest
}

func (b *bodyStream) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	if !b.started {
		c, err := b.r.ReadByte()
		if err != nil || c != '"' {
			return 0, b.fail(err)
		}
		b.h.Write([]byte{c})
		b.started = true
	}
	n, err := b.r.Read(p)
	for i, c := range p[:n] {
		if base64Chars[c] {
			continue
		}
		b.h.Write(p[:i])
		if c != '"' {
			return i, errNotCanonical
		}
		b.h.Write([]byte{'"'})
		// The closing quote: put back what followed it and end here.
		rest := p[i+1 : n]
		b.r = bufio.NewReader(io.MultiReader(bytes.NewReader(bytes.Clone(rest)), b.r))
		b.done = true
		return i, io.EOF
	}
	b.h.Write(p[:n])
	if err == io.EOF {
		return n, io.ErrUnexpectedEOF // no closing quote
	}
	if err != nil {
		return n, b.fail(err)
	}
	return n, nil
}

func (b *bodyStream) fail(err error) error {
	switch {
	case err == nil:
		return errNotCanonical
	case err == io.EOF:
		return io.ErrUnexpectedEOF
	}
	b.readErr = err
	return err
}

// finish reads the rest of the body (base64 text the walk did not need,
// which Decode would still decode) and the envelope's end.
func (b *bodyStream) finish() error {
	if _, err := io.Copy(io.Discard, b); err != nil {
		return err
	}
	c, err := b.r.ReadByte()
	if err != nil || c != '}' {
		return b.fail(err)
	}
	if _, err := b.r.ReadByte(); err != io.EOF {
		if err == nil {
			return errNotCanonical
		}
		return b.fail(err)
	}
	return nil
}
