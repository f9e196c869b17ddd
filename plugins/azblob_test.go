package plugins_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/internal/testservers"
	"github.com/ckpt-io/ckpt/plugins"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/storagetest"
)

// TestAzblobPluginConformance runs the conformance suite through the
// ckpt-plugin-azblob process against Azurite.
func TestAzblobPluginConformance(t *testing.T) {
	srv := testservers.Azurite(t)
	srv.CreateContainer(t, "ckpt")
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	h := discover(t, plugins.Options{Dir: install(t, "azblob")})
	if got := h.Plugins(); len(got) != 1 || got[0].Kind != "storage" || got[0].Schemes[0] != "az" {
		t.Fatalf("plugins = %+v", got)
	}
	var n atomic.Int64
	storagetest.Run(t, func(t *testing.T) storage.Store {
		return open(t, h, srv.URL("ckpt", fmt.Sprintf("run/%d", n.Add(1))))
	}, storagetest.Options{})

	openErr := func(t *testing.T, url string) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := h.OpenStorage(ctx, url)
		return err
	}
	t.Run("a missing container fails the open with one line", func(t *testing.T) {
		err := openErr(t, srv.URL("nosuchcontainer", "x"))
		var oe *storage.OpenError
		if !errors.As(err, &oe) || !strings.Contains(err.Error(), "nosuchcontainer") || !strings.Contains(err.Error(), "does not exist") ||
			!strings.Contains(err.Error(), "ckpt-plugin-azblob") || strings.Contains(err.Error(), "\n") {
			t.Fatalf("open of a missing container: %v", err)
		}
	})
	t.Run("a wrong key fails the open without the key", func(t *testing.T) {
		bad := strings.Replace(srv.ConnectionString, testservers.AzuriteKey, "d3Jvbmc=", 1)
		t.Setenv("AZURE_STORAGE_CONNECTION_STRING", bad)
		h := discover(t, plugins.Options{Dir: install(t, "azblob")})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := h.OpenStorage(ctx, srv.URL("ckpt", "x"))
		var oe *storage.OpenError
		if !errors.As(err, &oe) || !strings.Contains(err.Error(), "access denied") || strings.Contains(err.Error(), "d3Jvbmc=") {
			t.Fatalf("open with a wrong key: %v", err)
		}
	})
	t.Run("a stopped server fails the open naming the endpoint", func(t *testing.T) {
		t.Setenv("AZURE_STORAGE_CONNECTION_STRING", strings.Replace(srv.ConnectionString, srv.Endpoint, "http://127.0.0.1:1/"+testservers.AzuriteAccount, 1))
		h := discover(t, plugins.Options{Dir: install(t, "azblob")})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := h.OpenStorage(ctx, srv.URL("ckpt", "x"))
		if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "127.0.0.1:1") {
			t.Fatalf("open of a stopped server: %v", err)
		}
	})
}
