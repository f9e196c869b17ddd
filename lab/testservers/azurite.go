package testservers

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
)

// AzuriteVersion is the pinned Azurite (Microsoft's Azure Storage
// emulator, an npm package) that Azurite installs.
const AzuriteVersion = "3.37.0"

// Azurite's well-known development account (from Azurite's README; it is
// public and only opens the emulator).
const (
	AzuriteAccount = "devstoreaccount1"
	AzuriteKey     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// AzuriteServer is a running azurite-blob with the development account.
type AzuriteServer struct {
	// Endpoint is the blob service URL, http://127.0.0.1:PORT/devstoreaccount1.
	Endpoint string
	// ConnectionString reaches the emulator with the account key.
	ConnectionString string
	// DataDir is the emulator's --location.
	DataDir string
	// CAFile is the PEM file of the CA that signed the emulator's
	// certificate (AzuriteOAuth only).
	CAFile string

	client *http.Client // trusts CAFile
}

// AzuriteOption configures Azurite.
type AzuriteOption func(*azuriteConfig)

type azuriteConfig struct{ oauth bool }

// AzuriteOAuth serves HTTPS (a certificate for 127.0.0.1 signed by a fresh
// test CA, AzuriteServer.CAFile) and accepts bearer tokens as well as the
// account key (--oauth basic: Azurite checks a token's issuer, audience
// and lifetime, not its signature). Azure SDKs send tokens only over
// HTTPS.
func AzuriteOAuth() AzuriteOption { return func(c *azuriteConfig) { c.oauth = true } }

// Azurite starts azurite-blob on a free 127.0.0.1 port with a fresh data
// directory, installing Azurite with npm into <repo>/.bin/azurite on first
// use. Like the Go servers it skips with -short and fails the test when
// npm is missing or the install fails.
func Azurite(t testing.TB, opts ...AzuriteOption) *AzuriteServer {
	t.Helper()
	var cfg azuriteConfig
	for _, o := range opts {
		o(&cfg)
	}
	skipShort(t, "the Azure Blob emulator (Azurite)")
	root, err := RepoRoot()
	if err != nil {
		t.Fatalf("testservers: find the repository root: %v", err)
	}
	bin, err := installAzurite(context.Background(), root, func(f string, a ...any) { t.Logf("testservers: "+f, a...) })
	if err != nil {
		t.Fatalf("testservers: %v", err)
	}
	s := &AzuriteServer{DataDir: t.TempDir()}
	scheme, client := "http", (*http.Client)(nil)
	var extra []string
	if cfg.oauth {
		var certFile, keyFile string
		s.CAFile, certFile, keyFile, client = testCerts(t)
		s.client = client
		scheme = "https"
		extra = []string{"--cert", certFile, "--key", keyFile, "--oauth", "basic"}
	}
	// --skipApiVersionCheck: the azblob SDK speaks a newer service version
	// (2026-12-06) than Azurite 3.37.0 announces; the blob operations ckpt
	// uses are the same.
	port := start(t, "azurite-blob", bin, func(port int) []string {
		args := []string{"--blobHost", "127.0.0.1", "--blobPort", fmt.Sprint(port), "--location", s.DataDir,
			"--silent", "--skipApiVersionCheck"}
		return append(args, extra...)
	}, func(port int) bool {
		return httpAnswers(client, fmt.Sprintf("%s://127.0.0.1:%d/%s?comp=list", scheme, port, AzuriteAccount))
	})
	s.Endpoint = fmt.Sprintf("%s://127.0.0.1:%d/%s", scheme, port, AzuriteAccount)
	s.ConnectionString = fmt.Sprintf("DefaultEndpointsProtocol=%s;AccountName=%s;AccountKey=%s;BlobEndpoint=%s;",
		scheme, AzuriteAccount, AzuriteKey, s.Endpoint)
	return s
}

// Env returns the environment a ckpt process (and its azblob plugin) needs
// to reach the emulator.
func (s *AzuriteServer) Env() []string {
	return []string{"AZURE_STORAGE_CONNECTION_STRING=" + s.ConnectionString}
}

// URL returns the storage URL of prefix in container (credentials and
// endpoint come from Env).
func (s *AzuriteServer) URL(container, prefix string) string {
	return "az://" + container + "/" + strings.Trim(prefix, "/")
}

// CreateContainer creates a container, failing the test on error.
func (s *AzuriteServer) CreateContainer(t testing.TB, name string) {
	t.Helper()
	if err := s.createContainer(name); err != nil {
		t.Fatalf("testservers: create Azure container %q: %v", name, err)
	}
}

// installAzurite returns the path of azurite-blob in
// <root>/.bin/azurite, running npm install first if it is missing or of
// another version. The lock file is the one the Go servers use, so
// parallel test binaries install one at a time.
func installAzurite(ctx context.Context, root string, logf func(string, ...any)) (string, error) {
	binDir := filepath.Join(root, ".bin")
	prefix := filepath.Join(binDir, "azurite")
	path := filepath.Join(prefix, "node_modules", ".bin", "azurite-blob")
	stamp := filepath.Join(binDir, ".azurite.version")
	installed := func() bool {
		v, err := os.ReadFile(stamp)
		if err != nil || strings.TrimSpace(string(v)) != AzuriteVersion {
			return false
		}
		_, err = os.Stat(path)
		return err == nil
	}
	if installed() {
		return path, nil
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(binDir, ".install.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("install lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("install lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if installed() {
		return path, nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return "", fmt.Errorf("npm not found: Azurite %s is an npm package (install Node.js and npm, e.g. apt-get install nodejs npm)", AzuriteVersion)
	}
	if logf != nil {
		logf("installing azurite@%s into %s with npm (once; about a minute)", AzuriteVersion, prefix)
	}
	ictx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ictx, npm, "install", "--prefix", prefix, "--no-audit", "--no-fund", "azurite@"+AzuriteVersion)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm install azurite@%s failed (%v); the npm registry must be reachable:\n%s", AzuriteVersion, err, tail(out, 2000))
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("npm install azurite@%s left no %s", AzuriteVersion, path)
	}
	if err := os.WriteFile(stamp, []byte(AzuriteVersion+"\n"), 0o644); err != nil {
		return "", err
	}
	return path, nil
}

func (s *AzuriteServer) createContainer(name string) error {
	var opts *container.ClientOptions
	if s.client != nil {
		opts = &container.ClientOptions{ClientOptions: policy.ClientOptions{Transport: s.client}}
	}
	c, err := container.NewClientFromConnectionString(s.ConnectionString, name, opts)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = c.Create(ctx, nil)
	return err
}
