// Package storagetest is the conformance suite every storage backend runs:
// the same test functions against file:// (storage/file), S3 on versitygw
// (storage/s3), GCS on fake-gcs-server (storage/gs), Azure Blob on Azurite
// through the azblob plugin, any store served through the plugin boundary
// (plugins), and the decorators (retry, ratelimit, metered), so that the
// contract documented on storage.Store holds for each of them.
package storagetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/storage"
)

// Options tunes the suite for a backend.
type Options struct {
	// LargeSize is the size of the object used to exercise large transfers
	// (multipart uploads on object stores). Zero means 24 MiB.
	LargeSize int64
}

// Run runs the conformance suite. newStore returns an empty store (a fresh
// prefix or bucket) for each subtest; the suite closes it.
func Run(t *testing.T, newStore func(t *testing.T) storage.Store, opts Options) {
	if opts.LargeSize == 0 {
		opts.LargeSize = 24 << 20
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, s storage.Store)
	}{
		{"put then get returns the same bytes", testPutGet},
		{"put replaces an object and refreshes its time", testPutReplace},
		{"create refuses an existing key and keeps it", testCreateExclusive},
		{"of concurrent creates exactly one wins", testCreateRace},
		{"get and stat of a missing key say not found, not transient", testNotFound},
		{"put with a short or long body fails and leaves nothing", testSizeMismatch},
		{"a file body round-trips, and a short or long one fails", testFileBody},
		{"list reports exactly the keys under a prefix", testList},
		{"delete removes keys and ignores missing ones", testDelete},
		{"a large object round-trips", func(t *testing.T, s storage.Store) { testLarge(t, s, opts.LargeSize) }},
		{"a body that fails on its last bytes stores nothing", func(t *testing.T, s storage.Store) { testLastReadFails(t, s, opts.LargeSize) }},
		{"a cancelled context stops a put", testCancelled},
		{"invalid keys are refused", testInvalidKeys},
		{"ranges read the bytes asked for, through decorators too", testRange},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			defer s.Close()
			tc.fn(t, s)
		})
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func randBytes(t *testing.T, n int64) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func put(t *testing.T, s storage.Store, key string, data []byte) {
	t.Helper()
	if err := s.Put(ctx(t), key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func get(t *testing.T, s storage.Store, key string) []byte {
	t.Helper()
	rc, err := s.Get(ctx(t), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return b
}

func keys(t *testing.T, s storage.Store, prefix string) []string {
	t.Helper()
	var out []string
	err := s.List(ctx(t), prefix, func(o storage.ObjectInfo) error {
		out = append(out, o.Key)
		return nil
	})
	if err != nil {
		t.Fatalf("list %q: %v", prefix, err)
	}
	sort.Strings(out)
	return out
}

func testPutGet(t *testing.T, s storage.Store) {
	data := randBytes(t, 100_000)
	put(t, s, "job/shared/ab/obj", data)
	if got := get(t, s, "job/shared/ab/obj"); !bytes.Equal(got, data) {
		t.Fatalf("get returned %d bytes that differ from the %d put", len(got), len(data))
	}
	info, err := s.Stat(ctx(t), "job/shared/ab/obj")
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(len(data)) || info.Key != "job/shared/ab/obj" {
		t.Fatalf("stat = %+v, want size %d", info, len(data))
	}
	if time.Since(info.ModTime) > time.Hour || time.Until(info.ModTime) > time.Hour {
		t.Fatalf("stat mod time %v is not near now", info.ModTime)
	}
	put(t, s, "job/empty", nil)
	if got := get(t, s, "job/empty"); len(got) != 0 {
		t.Fatalf("empty object read back %d bytes", len(got))
	}
}

func testPutReplace(t *testing.T, s storage.Store) {
	put(t, s, "k/one", []byte("first"))
	a, err := s.Stat(ctx(t), "k/one")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // object stores keep times in seconds
	put(t, s, "k/one", []byte("second version"))
	if got := string(get(t, s, "k/one")); got != "second version" {
		t.Fatalf("after replace got %q", got)
	}
	b, err := s.Stat(ctx(t), "k/one")
	if err != nil {
		t.Fatal(err)
	}
	if !b.ModTime.After(a.ModTime) {
		t.Fatalf("replace did not refresh the mod time: %v then %v", a.ModTime, b.ModTime)
	}
}

func testCreateExclusive(t *testing.T, s storage.Store) {
	c := ctx(t)
	if err := s.Create(c, "m/manifest", bytes.NewReader([]byte("winner")), 6); err != nil {
		t.Fatalf("first create: %v", err)
	}
	err := s.Create(c, "m/manifest", bytes.NewReader([]byte("loser!!")), 7)
	if !errors.Is(err, storage.ErrExists) || storage.IsTransient(err) {
		t.Fatalf("second create: got %v (transient %v), want ErrExists, not transient", err, storage.IsTransient(err))
	}
	if got := string(get(t, s, "m/manifest")); got != "winner" {
		t.Fatalf("second create changed the object to %q", got)
	}
}

func testCreateRace(t *testing.T, s storage.Store) {
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := []byte(fmt.Sprintf("writer-%d", i))
			errs[i] = s.Create(ctx(t), "race/manifest", bytes.NewReader(body), int64(len(body)))
		}()
	}
	wg.Wait()
	wins := 0
	winner := ""
	for i, err := range errs {
		switch {
		case err == nil:
			wins++
			winner = fmt.Sprintf("writer-%d", i)
		case !errors.Is(err, storage.ErrExists):
			t.Errorf("writer %d: unexpected error %v", i, err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d creates won, want exactly 1", wins)
	}
	if got := string(get(t, s, "race/manifest")); got != winner {
		t.Fatalf("object holds %q, the winner wrote %q", got, winner)
	}
}

func testNotFound(t *testing.T, s storage.Store) {
	if _, err := s.Get(ctx(t), "no/such/key"); !errors.Is(err, storage.ErrNotFound) || storage.IsTransient(err) {
		t.Fatalf("get: got %v, want ErrNotFound, not transient", err)
	}
	if _, err := s.Stat(ctx(t), "no/such/key"); !errors.Is(err, storage.ErrNotFound) || storage.IsTransient(err) {
		t.Fatalf("stat: got %v, want ErrNotFound, not transient", err)
	}
	put(t, s, "dir/file", []byte("x"))
	if _, err := s.Stat(ctx(t), "dir"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("stat of a key prefix: got %v, want ErrNotFound", err)
	}
}

func testSizeMismatch(t *testing.T, s storage.Store) {
	if err := s.Put(ctx(t), "short", bytes.NewReader([]byte("abc")), 10); err == nil {
		t.Fatal("put of 3 bytes declared as 10 succeeded")
	}
	if err := s.Put(ctx(t), "long", bytes.NewReader([]byte("abcdefghij")), 3); err == nil {
		t.Fatal("put of 10 bytes declared as 3 succeeded")
	}
	if got := keys(t, s, ""); len(got) != 0 {
		t.Fatalf("failed puts left objects: %v", got)
	}
}

// lastFails is a body that fails the read that would hand over its last
// byte, as a body that verifies what it hands over (the uploader's) does
// when the bytes are not the ones expected.
// It is only an io.ReadSeeker: no ReadAt or WriteTo to go around Read.
type lastFails struct {
	r *bytes.Reader
}

var errLast = errors.New("the last bytes are refused")

func (b lastFails) Read(p []byte) (int, error) {
	if len(p) >= b.r.Len() && b.r.Len() > 0 {
		return 0, errLast
	}
	return b.r.Read(p)
}

func (b lastFails) Seek(off int64, whence int) (int64, error) { return b.r.Seek(off, whence) }

// testLastReadFails: a Put (small, and large enough for a multipart
// upload) whose body fails just before its last byte fails and leaves the
// object that was there: the guarantee a verified upload relies on.
func testLastReadFails(t *testing.T, s storage.Store, large int64) {
	for _, size := range []int64{300 << 10, large} {
		key := fmt.Sprintf("last-%d", size)
		old := randBytes(t, size)
		put(t, s, key, old)
		err := s.Put(ctx(t), key, lastFails{bytes.NewReader(randBytes(t, size))}, size)
		if err == nil {
			t.Fatalf("put of %d bytes whose last read failed succeeded", size)
		}
		if got := get(t, s, key); !bytes.Equal(got, old) {
			t.Fatalf("put of %d bytes whose last read failed replaced the object", size)
		}
	}
}

// testFileBody puts from an *os.File, as the uploader does for files it
// does not read into memory (a backend may hand it to the kernel).
func testFileBody(t *testing.T, s storage.Store) {
	data := randBytes(t, 300<<10)
	path := filepath.Join(t.TempDir(), "body")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	open := func() *os.File {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	if err := s.Put(ctx(t), "file", open(), int64(len(data))); err != nil {
		t.Fatalf("put from a file: %v", err)
	}
	if got := get(t, s, "file"); !bytes.Equal(got, data) {
		t.Fatalf("get returned %d bytes, not the %d put from a file", len(got), len(data))
	}
	if err := s.Put(ctx(t), "short", open(), int64(len(data))+10); err == nil {
		t.Fatal("put of a file declared 10 bytes longer than it is succeeded")
	}
	if err := s.Put(ctx(t), "long", open(), int64(len(data))-10); err == nil {
		t.Fatal("put of a file declared 10 bytes shorter than it is succeeded")
	}
	if got := keys(t, s, ""); len(got) != 1 || got[0] != "file" {
		t.Fatalf("keys after the failed puts: %v, want only file", got)
	}
}

func testList(t *testing.T, s storage.Store) {
	want := []string{
		"job/shared/00/a", "job/shared/ff/b", "job/tasks/t1/chk/00000000000000000001/manifest",
		"job/tasks/t1/chk/00000000000000000002/private/CURRENT", "job/tasks/t10/chk/00000000000000000001/manifest",
		"other/x",
	}
	for _, k := range want {
		put(t, s, k, []byte(k))
	}
	cases := map[string][]string{
		"":                want,
		"job/":            want[:5],
		"job/shared/":     want[:2],
		"job/tasks/t1/":   want[2:4],
		"job/tasks/t1":    want[2:5],
		"job/tasks/t1/ch": want[2:4],
		"nothing/":        nil,
	}
	for prefix, w := range cases {
		got := keys(t, s, prefix)
		if strings.Join(got, ",") != strings.Join(w, ",") {
			t.Errorf("list %q = %v, want %v", prefix, got, w)
		}
	}
	var sizes []int64
	if err := s.List(ctx(t), "other/", func(o storage.ObjectInfo) error {
		sizes = append(sizes, o.Size)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(sizes) != 1 || sizes[0] != int64(len("other/x")) {
		t.Errorf("list sizes = %v, want [%d]", sizes, len("other/x"))
	}
	stop := errors.New("stop")
	calls := 0
	err := s.List(ctx(t), "", func(storage.ObjectInfo) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Errorf("an error from fn: got %v after %d calls, want it returned after 1", err, calls)
	}
}

func testDelete(t *testing.T, s storage.Store) {
	for i := range 5 {
		put(t, s, fmt.Sprintf("d/%d", i), []byte("x"))
	}
	if err := s.Delete(ctx(t), "d/0", "d/2", "d/missing"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if got := keys(t, s, "d/"); strings.Join(got, ",") != "d/1,d/3,d/4" {
		t.Fatalf("after delete: %v", got)
	}
	if err := s.Delete(ctx(t)); err != nil {
		t.Fatalf("delete of no keys: %v", err)
	}
	many := make([]string, 0, 1500)
	for i := range 1500 {
		many = append(many, fmt.Sprintf("many/%04d", i))
	}
	for _, k := range many[:20] {
		put(t, s, k, nil)
	}
	if err := s.Delete(ctx(t), many...); err != nil {
		t.Fatalf("delete of 1500 keys: %v", err)
	}
	if got := keys(t, s, "many/"); len(got) != 0 {
		t.Fatalf("after deleting 1500 keys, left: %v", got)
	}
}

func testLarge(t *testing.T, s storage.Store, size int64) {
	data := randBytes(t, size)
	put(t, s, "big/object", data)
	if got := get(t, s, "big/object"); !bytes.Equal(got, data) {
		t.Fatalf("large object differs after round trip (%d vs %d bytes)", len(got), len(data))
	}
	info, err := s.Stat(ctx(t), "big/object")
	if err != nil || info.Size != size {
		t.Fatalf("stat: %+v %v", info, err)
	}
}

func testCancelled(t *testing.T, s storage.Store) {
	c, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Put(c, "cancelled", bytes.NewReader([]byte("x")), 1); err == nil {
		t.Fatal("put with a cancelled context succeeded")
	}
	if got := keys(t, s, ""); len(got) != 0 {
		t.Fatalf("cancelled put left objects: %v", got)
	}
}

func testInvalidKeys(t *testing.T, s storage.Store) {
	for _, k := range []string{"", "/abs", "a//b", "a/../b", "./a", "a/."} {
		if err := s.Put(ctx(t), k, bytes.NewReader(nil), 0); err == nil {
			t.Errorf("put %q succeeded", k)
		}
	}
}

// BenchmarkPutGet measures a store's upload and download throughput with
// objects of size bytes (MB/s in the benchmark output), so every backend
// reports the same figure the same way.
func BenchmarkPutGet(b *testing.B, s storage.Store, size int64) {
	ctx := context.Background()
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		b.Fatal(err)
	}
	b.Run("put", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; b.Loop(); i++ {
			if err := s.Put(ctx, fmt.Sprintf("bench/obj%d", i%2), bytes.NewReader(data), size); err != nil {
				b.Fatal(err)
			}
		}
	})
	if err := s.Put(ctx, "bench/obj0", bytes.NewReader(data), size); err != nil {
		b.Fatal(err)
	}
	b.Run("get", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			rc, err := s.Get(ctx, "bench/obj0")
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, rc)
			rc.Close()
			if err != nil || n != size {
				b.Fatalf("get: %d bytes, %v", n, err)
			}
		}
	})
}

// ConnectionReuse checks an HTTP backend against a server that keeps
// connections alive: its requests (PUT, HEAD, GET read to the end, LIST, a
// refused conditional create, DELETE) reuse idle connections. A response
// body left unread or unclosed anywhere, an error's included, would cost a
// new TCP connection per request.
func ConnectionReuse(t *testing.T, s storage.Store) {
	data := make([]byte, 64<<10)
	var requests, reused atomic.Int64
	traced := func() context.Context {
		return httptrace.WithClientTrace(ctx(t), &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
			requests.Add(1)
			if ci.Reused {
				reused.Add(1)
			}
		}})
	}
	for i := range 3 {
		if err := s.Put(traced(), fmt.Sprintf("reuse/k%d", i), bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Stat(traced(), "reuse/k1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(traced(), "reuse/missing"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("stat of a missing key: %v", err)
	}
	rc, err := s.Get(traced(), "reuse/k2")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(rc); err != nil || len(b) != len(data) {
		t.Fatalf("get: %d bytes, %v", len(b), err)
	}
	rc.Close()
	if err := s.List(traced(), "reuse/", func(storage.ObjectInfo) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(traced(), "reuse/k0", bytes.NewReader(data), int64(len(data))); !errors.Is(err, storage.ErrExists) {
		t.Fatalf("create of an existing key: %v", err)
	}
	// Last, and of one key: a batch delete may run requests in parallel,
	// and the GCS emulator answers a delete with a body that the client
	// library closes unread (GCS itself answers 204), which costs the next
	// request a new connection.
	if err := s.Delete(traced(), "reuse/k0"); err != nil {
		t.Fatal(err)
	}
	// Opening the store may have made the first connection; allow one new
	// one anyway.
	if n, r := requests.Load(), reused.Load(); n < 9 || r < n-1 {
		t.Fatalf("%d requests, %d on a reused connection; want all but at most one", n, r)
	}
}

// testRange reads ranges of an object (first byte, across the boundaries
// of pieces a reader would cut, the short last piece, the whole object)
// through the backend's RangeReader and through a chain of decorators
// that must pass it on; a missing key says not found.
func testRange(t *testing.T, s storage.Store) {
	if _, ok := storage.AsRangeReader(s); !ok {
		t.Skip("the store reads no ranges")
	}
	const piece = 64 << 10
	data := randBytes(t, 3*piece+12345)
	put(t, s, "range/obj", data)
	size := int64(len(data))
	cases := [][2]int64{{0, 1}, {0, piece}, {piece - 1, 2}, {piece, piece}, {2*piece - 100, piece + 200}, {3 * piece, size - 3*piece}, {size - 1, 1}, {0, size}}
	for _, c := range cases {
		rc, err := storage.Range(ctx(t), s, "range/obj", c[0], c[1])
		if err != nil {
			t.Fatalf("range %d+%d: %v", c[0], c[1], err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatalf("range %d+%d: read: %v", c[0], c[1], err)
		}
		if !bytes.Equal(got, data[c[0]:c[0]+c[1]]) {
			t.Fatalf("range %d+%d: got %d bytes, not the object's bytes there", c[0], c[1], len(got))
		}
	}
	if _, err := storage.Range(ctx(t), s, "range/missing", 0, 10); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("range of a missing key: %v, want ErrNotFound", err)
	}
	if _, err := storage.Range(ctx(t), s, "range/obj", -1, 10); err == nil {
		t.Fatal("a negative offset was accepted")
	}
}
