package plugins_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/lab/testservers"
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

// clearAzureEnv unsets every variable the Azure identity chain reads, so
// that only what a test sets is found.
func clearAzureEnv(t *testing.T) {
	for _, k := range []string{"AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT", "AZURE_CLIENT_ID", "AZURE_TENANT_ID",
		"AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PATH", "AZURE_USERNAME", "AZURE_FEDERATED_TOKEN_FILE",
		"IDENTITY_ENDPOINT", "IDENTITY_HEADER", "MSI_ENDPOINT", "MSI_SECRET", "IMDS_ENDPOINT", "AZURE_TOKEN_CREDENTIALS"} {
		t.Setenv(k, "") // restores the variable after the test
		os.Unsetenv(k)
	}
}

// tokenServer is a managed identity endpoint (the App Service kind that
// azidentity finds through IDENTITY_ENDPOINT and IDENTITY_HEADER): it
// hands out bearer tokens that Azurite's --oauth basic accepts (issuer,
// audience and lifetime right; Azurite does not check signatures). The
// identity platform itself cannot run here.
func tokenServer(t *testing.T) (endpoint, header string, calls *atomic.Int64) {
	calls = new(atomic.Int64)
	header = "ckpt-test-identity-header"
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-IDENTITY-HEADER") != header || r.URL.Query().Get("resource") == "" {
			http.Error(w, "bad identity request", http.StatusBadRequest)
			return
		}
		calls.Add(1)
		now := time.Now().Unix()
		jwt := enc(map[string]string{"alg": "none", "typ": "JWT"}) + "." + enc(map[string]any{
			"iss": "https://sts.windows.net/00000000-0000-0000-0000-000000000000/", "aud": "https://storage.azure.com",
			"iat": now - 60, "nbf": now - 60, "exp": now + 3600, "oid": "ckpt-test",
		}) + ".c2ln"
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"access_token": jwt, "expires_on": fmt.Sprint(now + 3600),
			"resource": r.URL.Query().Get("resource"), "token_type": "Bearer"})
	}))
	t.Cleanup(srv.Close)
	return srv.URL, header, calls
}

// TestAzblobPluginIdentityChain: without AZURE_STORAGE_CONNECTION_STRING
// the plugin authenticates with the Azure identity chain. Azurite over
// HTTPS with --oauth basic takes the bearer tokens a managed identity
// endpoint gave the plugin, and the conformance suite passes through the
// plugin process on them; without any credential the open fails with one
// line that says what to set; an http:// endpoint is refused before any
// token is asked for.
func TestAzblobPluginIdentityChain(t *testing.T) {
	srv := testservers.Azurite(t, testservers.AzuriteOAuth())
	srv.CreateContainer(t, "ckpt")
	clearAzureEnv(t)
	t.Setenv("SSL_CERT_FILE", srv.CAFile) // the plugin trusts the emulator's test CA
	url := func(prefix string) string { return srv.URL("ckpt", prefix) + "?endpoint=" + srv.Endpoint }

	t.Run("no credential in the chain fails the open with one line", func(t *testing.T) {
		h := discover(t, plugins.Options{Dir: install(t, "azblob"), Log: io.Discard})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, err := h.OpenStorage(ctx, url("x"))
		var oe *storage.OpenError
		if !errors.As(err, &oe) || !strings.Contains(err.Error(), "no usable Azure credentials") ||
			!strings.Contains(err.Error(), "AZURE_STORAGE_CONNECTION_STRING") || strings.Contains(err.Error(), "\n") {
			t.Fatalf("open without credentials: %v", err)
		}
	})
	t.Run("an http endpoint is refused for tokens", func(t *testing.T) {
		h := discover(t, plugins.Options{Dir: install(t, "azblob"), Log: io.Discard})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := h.OpenStorage(ctx, srv.URL("ckpt", "x")+"?endpoint="+strings.Replace(srv.Endpoint, "https://", "http://", 1))
		if err == nil || !strings.Contains(err.Error(), "only to an https:// endpoint") {
			t.Fatalf("open of an http endpoint with the identity chain: %v", err)
		}
	})

	endpoint, header, calls := tokenServer(t)
	t.Setenv("IDENTITY_ENDPOINT", endpoint)
	t.Setenv("IDENTITY_HEADER", header)
	h := discover(t, plugins.Options{Dir: install(t, "azblob")})
	var n atomic.Int64
	storagetest.Run(t, func(t *testing.T) storage.Store {
		return open(t, h, url(fmt.Sprintf("id/%d", n.Add(1))))
	}, storagetest.Options{})
	if calls.Load() == 0 {
		t.Fatal("the plugin never asked the identity endpoint for a token")
	}
}
