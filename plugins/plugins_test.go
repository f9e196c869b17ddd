package plugins_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/lab/testservers"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/plugins"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/storagetest"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// built returns a directory holding every plugin binary the tests use,
// built once per test binary with go build.
func built(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := testservers.RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		buildDir, err = os.MkdirTemp("", "ckpt-plugins-test-")
		if err != nil {
			buildErr = err
			return
		}
		for _, args := range [][]string{
			{"build", "-o", buildDir + "/", "./plugins/...", "./examples/ckpt-plugin-memstore"},
			{"build", "-o", filepath.Join(buildDir, "ckpt-plugin-faulty"), "./plugins/testdata/ckpt-plugin-faulty"},
			{"build", "-o", filepath.Join(buildDir, "ckpt-plugin-badhandshake"), "./plugins/testdata/ckpt-plugin-badhandshake"},
			{"build", "-o", filepath.Join(buildDir, "ckpt-plugin-liar"), "./plugins/testdata/ckpt-plugin-liar"},
		} {
			cmd := exec.Command("go", args...)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

func TestMain(m *testing.M) {
	if dir := os.Getenv(hostProcessEnv); dir != "" {
		os.Exit(hostProcess(dir))
	}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// install makes a plugin directory in t.TempDir() holding the named
// binaries: "memstore" installs ckpt-plugin-memstore; "faulty=v2"
// installs ckpt-plugin-faulty as ckpt-plugin-v2.
func install(t testing.TB, names ...string) string {
	t.Helper()
	src := built(t)
	dir := t.TempDir()
	for _, n := range names {
		from, to, ok := strings.Cut(n, "=")
		if !ok {
			to = from
		}
		b, err := os.ReadFile(filepath.Join(src, "ckpt-plugin-"+from))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "ckpt-plugin-"+to), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func discover(t *testing.T, opts plugins.Options) *plugins.Host {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := plugins.Discover(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func open(t *testing.T, h *plugins.Host, url string) storage.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := h.OpenStorage(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMemstoreConformance(t *testing.T) {
	h := discover(t, plugins.Options{Dir: install(t, "memstore")})
	if got := h.Plugins(); len(got) != 1 || got[0].Kind != "storage" || got[0].Schemes[0] != "mem" || got[0].Protocol != 1 {
		t.Fatalf("plugins = %+v", got)
	}
	var n atomic.Int64
	storagetest.Run(t, func(t *testing.T) storage.Store {
		return open(t, h, fmt.Sprintf("mem://run%d", n.Add(1)))
	}, storagetest.Options{})
}

// TestS3PluginConformance runs the conformance suite through a plugin
// process that wraps the built-in S3 backend, against versitygw.
func TestS3PluginConformance(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "ckpt")
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	h := discover(t, plugins.Options{Dir: install(t, "s3")})
	var n atomic.Int64
	storagetest.Run(t, func(t *testing.T) storage.Store {
		u := strings.Replace(srv.URL("ckpt", fmt.Sprintf("run/%d", n.Add(1))), "s3://", "s3+plugin://", 1)
		return open(t, h, u)
	}, storagetest.Options{})
	t.Run("a missing bucket fails the open with the backend's message", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		u := strings.Replace(srv.URL("nosuchbucket", "x"), "s3://", "s3+plugin://", 1)
		_, err := h.OpenStorage(ctx, u)
		var oe *storage.OpenError
		if !errors.As(err, &oe) || !strings.Contains(err.Error(), "nosuchbucket") || !strings.Contains(err.Error(), "ckpt-plugin-s3") {
			t.Fatalf("open of a missing bucket: %v", err)
		}
	})
}

func randBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func TestCrashFailsTheCallAndTheNextCallRestarts(t *testing.T) {
	h := discover(t, plugins.Options{Dir: install(t, "faulty"), Log: io.Discard})
	s := open(t, h, "faulty://"+t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	data := randBytes(t, 3<<20)
	err := s.Put(ctx, "crash/obj", bytes.NewReader(data), int64(len(data)))
	var pe *plugins.Error
	if !errors.As(err, &pe) || !pe.Crashed {
		t.Fatalf("put into a crashing plugin: %v, want a crash error", err)
	}
	for _, want := range []string{"ckpt-plugin-faulty", "crash/obj", "crashing on purpose", "restarted"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("crash error %q does not say %q", err, want)
		}
	}
	// The next call starts the plugin again and reopens the store.
	if err := s.Put(ctx, "ok/obj", bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("put after the crash: %v", err)
	}
	rc, err := s.Get(ctx, "ok/obj")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("get after the crash: %d bytes, %v", len(got), err)
	}
	if _, err := s.Stat(ctx, "crash/obj"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the crashed put left an object: %v", err)
	}
}

func TestHangIsCutOffByTheDeadline(t *testing.T) {
	h := discover(t, plugins.Options{Dir: install(t, "faulty"), Log: io.Discard})
	s := open(t, h, "faulty://"+t.TempDir())
	for _, call := range []struct {
		name string
		fn   func(ctx context.Context) error
	}{
		{"stat", func(ctx context.Context) error { _, err := s.Stat(ctx, "hang/x"); return err }},
		{"get", func(ctx context.Context) error { _, err := s.Get(ctx, "hang/x"); return err }},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		err := call.fn(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "ckpt-plugin-faulty") {
			t.Fatalf("%s of a hanging key: %v, want a deadline error naming the plugin", call.name, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("%s returned after %v", call.name, d)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(200 * time.Millisecond); cancel() }()
	if _, err := s.Stat(ctx, "hang/y"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled stat: %v", err)
	}
	// The plugin still answers other calls.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if _, err := s.Stat(ctx2, "other"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("stat after the hang: %v", err)
	}
}

func TestRefusedBinaries(t *testing.T) {
	dir := install(t, "memstore", "badhandshake=badcookie", "badhandshake=v2", "faulty=pinned")
	os.WriteFile(filepath.Join(dir, "ckpt-plugin-noexec"), []byte("#!/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "ckpt-plugin-script"), []byte("#!/bin/sh\necho hello\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "README"), []byte("not a plugin"), 0o644)
	sum := sha256.Sum256([]byte("another binary"))
	h := discover(t, plugins.Options{Dir: dir, Log: io.Discard, Checksums: map[string]string{"pinned": hex.EncodeToString(sum[:])}})
	if got := h.Plugins(); len(got) != 1 || got[0].Name != "memstore" {
		t.Fatalf("accepted %+v, want only memstore", got)
	}
	want := map[string]string{
		"badcookie": "wrong handshake",
		"v2":        "wrong plugin protocol version",
		"pinned":    "checksum mismatch",
		"noexec":    "not executable",
		"script":    "wrong handshake",
	}
	refused := h.Refused()
	if len(refused) != len(want) {
		t.Errorf("refused %d binaries, want %d: %v", len(refused), len(want), refused)
	}
	for _, r := range refused {
		name := strings.TrimPrefix(filepath.Base(r.Path), "ckpt-plugin-")
		if !strings.Contains(r.Reason, want[name]) {
			t.Errorf("%s refused with %q, want it to say %q", name, r.Reason, want[name])
		}
		t.Log(r)
	}
}

func TestChecksumPinningAccepts(t *testing.T) {
	dir := install(t, "memstore")
	b, err := os.ReadFile(filepath.Join(dir, "ckpt-plugin-memstore"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	h := discover(t, plugins.Options{Dir: dir, Checksums: map[string]string{"memstore": hex.EncodeToString(sum[:])}, RequireChecksums: true})
	if len(h.Plugins()) != 1 {
		t.Fatalf("pinned plugin refused: %v", h.Refused())
	}
	s := open(t, h, "mem://pinned")
	if err := s.Put(context.Background(), "k", bytes.NewReader([]byte("v")), 1); err != nil {
		t.Fatal(err)
	}
}

func TestEngineThroughLookup(t *testing.T) {
	h := discover(t, plugins.Options{Dir: install(t, "faulty=testengine")})
	h.Register()
	e, err := engines.Lookup("testengine")
	if err != nil {
		t.Fatal(err)
	}
	if e.Name() != "testengine" || e.Classify("000001.dat") != manifests.Shared || e.Classify("CURRENT") != manifests.Private {
		t.Fatalf("engine %q classifies wrongly", e.Name())
	}
	dir := t.TempDir()
	for _, n := range []string{"a.dat", "b.dat", "CURRENT"} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o644)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := engines.Check(ctx, "testengine", dir)
	if err != nil || !res.Checked || res.Keys != 3 {
		t.Fatalf("check = %+v, %v", res, err)
	}
	if _, err := e.Check(ctx, filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "ckpt-plugin-testengine") {
		t.Fatalf("check of a missing dir: %v", err)
	}
}

func TestStorageOpenFindsPluginSchemes(t *testing.T) {
	h := discover(t, plugins.Options{Dir: install(t, "memstore")})
	h.Register()
	defer storage.SetFallback(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := storage.Open(ctx, "mem://hook")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !strings.Contains(s.String(), "ckpt-plugin-memstore") {
		t.Errorf("store %q does not name its plugin", s)
	}
	_, err = storage.Open(ctx, "nope://x")
	if err == nil || !strings.Contains(err.Error(), "mem://") {
		t.Fatalf("unknown scheme: %v, want the plugin schemes listed", err)
	}
}
