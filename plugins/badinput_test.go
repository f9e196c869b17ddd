package plugins_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/plugins"
	"github.com/ckpt-io/ckpt/storage"
)

// TestBrokenPluginAnswers: a plugin that sends a short body, a wrong
// size or checksum, a malformed listing or stat, or an error ckpt does
// not know, fails that one call with an error naming the plugin; the
// host does not crash, returns no bad bytes as good ones, and the same
// plugin process serves the next call.
func TestBrokenPluginAnswers(t *testing.T) {
	h := discover(t, plugins.Options{Dir: install(t, "liar"), Log: io.Discard})
	s := open(t, h, "liar://x")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	get := func(key string) ([]byte, error) {
		rc, err := s.Get(ctx, key)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		return io.ReadAll(rc)
	}
	list := func(prefix string) ([]string, error) {
		var keys []string
		err := s.List(ctx, prefix, func(o storage.ObjectInfo) error { keys = append(keys, o.Key); return nil })
		return keys, err
	}
	for _, tc := range []struct {
		name string
		call func() error
		want string
	}{
		{"a body shorter than its trailer says", func() error { _, err := get("short/k"); return err }, "received 5 bytes, plugin ckpt-plugin-liar sent 8"},
		{"a body with a wrong CRC-32C", func() error { _, err := get("badcrc/k"); return err }, "CRC-32C of the 5 bytes received"},
		{"a body without a trailer", func() error { _, err := get("notrailer/k"); return err }, "without a trailer"},
		{"an error without ckpt's detail", func() error { _, err := get("odd/k"); return err }, "the disk ate it"},
		{"a delete error without ckpt's detail", func() error { return s.Delete(ctx, "odd/k") }, "the disk ate it"},
		{"a stat of another key", func() error { _, err := s.Stat(ctx, "otherkey/k"); return err }, `answered for key "some/other/key"`},
		{"a stat with a negative size", func() error { _, err := s.Stat(ctx, "negsize/k"); return err }, "with size -1"},
		{"a listing out of order", func() error { _, err := list("unsorted/"); return err }, "out of order"},
		{"a listing with a key twice", func() error { _, err := list("dup/"); return err }, "out of order"},
		{"a listing with a .. segment", func() error { _, err := list("badkey/"); return err }, `listed key "badkey/../../etc/passwd"`},
		{"a listing outside the prefix", func() error { _, err := list("outside/"); return err }, "not under the prefix"},
		{"a listing with a negative size", func() error { _, err := list("negsize/"); return err }, "negative size -7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "ckpt-plugin-liar") {
				t.Fatalf("got %v, want an error naming the plugin and saying %q", err, tc.want)
			}
			var pe *plugins.Error
			if errors.As(err, &pe) && pe.Crashed {
				t.Fatalf("reported as a crash: %v", err)
			}
			// The same process goes on serving.
			if b, err := get("good/k"); err != nil || string(b) != "hello" {
				t.Fatalf("the next get: %q, %v", b, err)
			}
		})
	}
	t.Run("an empty message in a body is skipped", func(t *testing.T) {
		if b, err := get("empty/k"); err != nil || string(b) != "hello" {
			t.Fatalf("get: %q, %v", b, err)
		}
	})
	t.Run("a listing in order is passed on", func(t *testing.T) {
		if keys, err := list("fine/"); err != nil || len(keys) != 1 || keys[0] != "fine/a" {
			t.Fatalf("list: %v, %v", keys, err)
		}
	})
	if err := s.Put(ctx, "k", bytes.NewReader([]byte("v")), 1); err != nil {
		t.Fatal(err)
	}
}
