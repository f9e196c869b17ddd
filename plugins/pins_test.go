package plugins_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/plugins"
)

func sha256Of(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ranFile makes the test plugin record each start in a file, and returns
// a function that reads what it recorded.
func ranFile(t *testing.T) func() string {
	p := filepath.Join(t.TempDir(), "ran")
	t.Setenv("CKPT_TEST_RAN_FILE", p)
	return func() string {
		b, _ := os.ReadFile(p)
		return string(b)
	}
}

func TestPinnedPlugins(t *testing.T) {
	t.Run("a plugin pinned to its hash runs and serves", func(t *testing.T) {
		ran := ranFile(t)
		dir := install(t, "faulty")
		sum := sha256Of(t, filepath.Join(dir, "ckpt-plugin-faulty"))
		h := discover(t, plugins.Options{Dir: dir, Log: io.Discard, Checksums: plugins.Pins{"faulty": sum}})
		if len(h.Plugins()) != 1 || len(h.Refused()) != 0 {
			t.Fatalf("accepted %v, refused %v", h.Plugins(), h.Refused())
		}
		s := open(t, h, "faulty://"+t.TempDir())
		if err := s.Put(context.Background(), "k", bytes.NewReader([]byte("v")), 1); err != nil {
			t.Fatal(err)
		}
		if ran() != "faulty\n" {
			t.Fatalf("starts recorded: %q", ran())
		}
	})
	t.Run("a plugin pinned to another hash is refused before it runs", func(t *testing.T) {
		ran := ranFile(t)
		dir := install(t, "faulty")
		path := filepath.Join(dir, "ckpt-plugin-faulty")
		got := sha256Of(t, path)
		wrong := strings.Repeat("ab", 32)
		h := discover(t, plugins.Options{Dir: dir, Log: io.Discard, Checksums: plugins.Pins{"faulty": wrong}})
		if len(h.Plugins()) != 0 || len(h.Refused()) != 1 {
			t.Fatalf("accepted %v, refused %v", h.Plugins(), h.Refused())
		}
		r := h.Refused()[0]
		for _, want := range []string{"checksum mismatch", "plugin faulty", "pinned to SHA-256 " + wrong, "binary's is " + got, "sha256sum " + path} {
			if !strings.Contains(r.Reason, want) {
				t.Errorf("refusal %q does not say %q", r.Reason, want)
			}
		}
		if r.Path != path {
			t.Errorf("refusal names %s, want %s", r.Path, path)
		}
		if ran() != "" {
			t.Fatalf("the refused binary ran: %q", ran())
		}
	})
	t.Run("a pinned binary replaced while in use is refused at its restart", func(t *testing.T) {
		ran := ranFile(t)
		dir := install(t, "faulty")
		path := filepath.Join(dir, "ckpt-plugin-faulty")
		h := discover(t, plugins.Options{Dir: dir, Log: io.Discard, Checksums: plugins.Pins{"faulty": sha256Of(t, path)}})
		s := open(t, h, "faulty://"+t.TempDir())
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		data := randBytes(t, 1<<20)
		var pe *plugins.Error
		if err := s.Put(ctx, "crash/x", bytes.NewReader(data), int64(len(data))); !errors.As(err, &pe) || !pe.Crashed {
			t.Fatalf("put that crashes the plugin: %v", err)
		}
		// Another build of the plugin takes the binary's place.
		other := install(t, "faulty=other")
		b, err := os.ReadFile(filepath.Join(other, "ckpt-plugin-other"))
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, "tampered"...)
		if err := os.WriteFile(path+".new", b, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
		before := ran()
		err = s.Put(ctx, "k", bytes.NewReader(data), int64(len(data)))
		if err == nil || !strings.Contains(err.Error(), "checksum mismatch") || !strings.Contains(err.Error(), "ckpt-plugin-faulty") {
			t.Fatalf("put after the binary changed: %v, want a checksum mismatch naming the plugin", err)
		}
		if ran() != before {
			t.Fatalf("the changed binary ran: %q", ran())
		}
	})
	t.Run("a pin for a plugin the directory lacks fails discovery", func(t *testing.T) {
		dir := install(t, "memstore")
		_, err := plugins.Discover(context.Background(), plugins.Options{Dir: dir, Log: io.Discard,
			Checksums: plugins.Pins{"azblob": strings.Repeat("0", 64)}})
		if err == nil || !strings.Contains(err.Error(), "plugin azblob") || !strings.Contains(err.Error(), "ckpt-plugin-azblob") ||
			!strings.Contains(err.Error(), "remove the pin") {
			t.Fatalf("discover with a pin for a missing plugin: %v", err)
		}
	})
}

func TestParsePins(t *testing.T) {
	hexA, hexB := strings.Repeat("a", 64), strings.Repeat("B", 64)
	for _, tc := range []struct{ in, name, sum, err string }{
		{in: "azblob=" + hexA, name: "azblob", sum: hexA},
		{in: "ckpt-plugin-s3=" + hexB, name: "s3", sum: strings.ToLower(hexB)},
		{in: "azblob", err: "want NAME=SHA256"},
		{in: "azblob=abc", err: "not a SHA-256"},
		{in: "Bad/Name=" + hexA, err: "must match"},
	} {
		name, sum, err := plugins.ParsePin(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParsePin(%q) = %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || name != tc.name || sum != tc.sum {
			t.Errorf("ParsePin(%q) = %q, %q, %v", tc.in, name, sum, err)
		}
	}
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "pins")
		os.WriteFile(p, []byte(body), 0o600)
		return p
	}
	pins, err := plugins.ReadPinFile(write("# pins\n\n" + hexA + "  /usr/lib/ckpt/plugins/ckpt-plugin-azblob\n" + hexB + " *ckpt-plugin-s3\nmemstore=" + hexA + "\n"))
	if err != nil || len(pins) != 3 || pins["azblob"] != hexA || pins["s3"] != strings.ToLower(hexB) || pins["memstore"] != hexA {
		t.Fatalf("ReadPinFile = %v, %v", pins, err)
	}
	for body, want := range map[string]string{
		hexA + "  /bin/ls\n":                 "line 1: \"/bin/ls\" is not a ckpt-plugin-* binary",
		"s3=" + hexA + "\ns3=" + hexB + "\n": "line 2: plugin s3 is pinned twice",
		"x\n":                                "line 1:",
		hexA + " ckpt-plugin-s3 extra\n":     "line 1:",
	} {
		if _, err := plugins.ReadPinFile(write(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ReadPinFile(%q) = %v, want %q", body, err, want)
		}
	}
}

// lockedBuffer is a bytes.Buffer for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStdoutNoiseDoesNotBreakTheHandshake: a plugin that prints to
// stdout before and after Serve (ckpt-plugin-faulty does both) is
// accepted, and what it printed reaches the host's log, named.
func TestStdoutNoiseDoesNotBreakTheHandshake(t *testing.T) {
	var log lockedBuffer
	h := discover(t, plugins.Options{Dir: install(t, "faulty"), Log: &log})
	if len(h.Plugins()) != 1 {
		t.Fatalf("refused: %v", h.Refused())
	}
	s := open(t, h, "faulty://"+t.TempDir())
	if err := s.Put(context.Background(), "k", bytes.NewReader([]byte("v")), 1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, want := range []string{"ckpt-plugin-faulty: noise on stdout before Serve", "ckpt-plugin-faulty: raw noise on fd 1", "ckpt-plugin-faulty: put k"} {
		for !strings.Contains(log.String(), want) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if !strings.Contains(log.String(), want) {
			t.Errorf("the host's log lacks %q:\n%s", want, log.String())
		}
	}
}
