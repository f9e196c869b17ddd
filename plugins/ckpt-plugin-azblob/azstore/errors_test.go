package azstore

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/lab/testservers"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/storagetest"
)

// TestErrorClasses: see storagetest.Errors.
func TestErrorClasses(t *testing.T) {
	srv := testservers.Azurite(t)
	srv.CreateContainer(t, "classes")
	host, _, _ := strings.Cut(strings.TrimPrefix(srv.Endpoint, "http://"), "/")
	relay := storagetest.NewRelay(t, "http://"+host)
	cs := strings.Replace(srv.ConnectionString, "http://"+host, relay.URL, 1)
	var n atomic.Int64
	storagetest.Errors(t, relay, func(t *testing.T) storage.Store {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := New(ctx, Options{Container: "classes", Prefix: fmt.Sprintf("run/%d", n.Add(1)), ConnectionString: cs})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
