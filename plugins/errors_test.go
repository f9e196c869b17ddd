package plugins_test

import (
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ckpt-io/ckpt/lab/testservers"
	"github.com/ckpt-io/ckpt/plugins"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/storagetest"
)

// TestErrorClassesCrossTheBoundary: an error a plugin's store returns
// keeps its class (transient, throttled, permission denied, not found)
// on the host, also when nothing but the class says it (no HTTP status).
func TestErrorClassesCrossTheBoundary(t *testing.T) {
	h := discover(t, plugins.Options{Dir: install(t, "faulty"), Log: io.Discard})
	s := open(t, h, "faulty://"+t.TempDir())
	defer s.Close()
	storagetest.Crossed(t, s)
}

// TestS3PluginErrorClasses runs storagetest.Errors through the S3 plugin:
// versitygw behind a relay that fails requests.
func TestS3PluginErrorClasses(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "classes")
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	relay := storagetest.NewRelay(t, srv.Endpoint)
	h := discover(t, plugins.Options{Dir: install(t, "s3")})
	var n atomic.Int64
	storagetest.Errors(t, relay, func(t *testing.T) storage.Store {
		u := strings.Replace(srv.URL("classes", fmt.Sprintf("run/%d", n.Add(1))), "s3://", "s3+plugin://", 1)
		u = strings.Replace(u, "endpoint="+url.QueryEscape(srv.Endpoint), "endpoint="+url.QueryEscape(relay.URL), 1)
		return open(t, h, u)
	})
}

// TestAzblobPluginErrorClasses runs storagetest.Errors through the
// azblob plugin: Azurite behind a relay that fails requests.
func TestAzblobPluginErrorClasses(t *testing.T) {
	srv := testservers.Azurite(t)
	srv.CreateContainer(t, "classes")
	host, _, _ := strings.Cut(strings.TrimPrefix(srv.Endpoint, "http://"), "/")
	relay := storagetest.NewRelay(t, "http://"+host)
	t.Setenv("AZURE_STORAGE_CONNECTION_STRING", strings.Replace(srv.ConnectionString, "http://"+host, relay.URL, 1))
	h := discover(t, plugins.Options{Dir: install(t, "azblob")})
	var n atomic.Int64
	storagetest.Errors(t, relay, func(t *testing.T) storage.Store {
		return open(t, h, srv.URL("classes", fmt.Sprintf("run/%d", n.Add(1))))
	})
}
