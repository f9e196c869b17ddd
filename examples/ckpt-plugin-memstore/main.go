// Command ckpt-plugin-memstore is a complete storage plugin: it keeps
// objects in the plugin process's memory under mem://NAME URLs (gone when
// the process ends: for trying plugins out, not for checkpoints).
//
//	go build -o /usr/lib/ckpt/plugins/ ./examples/ckpt-plugin-memstore
//	ckpt plugins --plugin-dir /usr/lib/ckpt/plugins
package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ckpt-io/ckpt/plugins/sdk"
	"github.com/ckpt-io/ckpt/storage"
)

type object struct {
	data []byte
	mod  time.Time
}

type memStore struct {
	name string
	mu   sync.Mutex
	objs map[string]object
}

var (
	mu     sync.Mutex
	stores = map[string]*memStore{} // by URL, so that reopening finds the objects
)

func main() {
	sdk.ServeStorage(func(_ context.Context, u *url.URL) (storage.Store, error) {
		mu.Lock()
		defer mu.Unlock()
		name := "mem://" + u.Host + u.Path
		if stores[name] == nil {
			stores[name] = &memStore{name: name, objs: map[string]object{}}
		}
		return stores[name], nil
	}, "mem")
}

func (s *memStore) put(ctx context.Context, key string, body io.Reader, size int64, create bool) error {
	if err := storage.ValidKey(key); err != nil {
		return err
	}
	var b bytes.Buffer
	if _, err := io.Copy(&b, storage.ContextReader(ctx, body)); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if int64(b.Len()) != size {
		return fmt.Errorf("put %s: body holds %d bytes, not %d", key, b.Len(), size)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.objs[key]; ok && create {
		return fmt.Errorf("create %s: %w", key, storage.ErrExists)
	}
	s.objs[key] = object{b.Bytes(), time.Now()}
	return nil
}

func (s *memStore) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.put(ctx, key, body, size, false)
}

func (s *memStore) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return s.put(ctx, key, body, size, true)
}

func (s *memStore) Get(_ context.Context, key string) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[key]
	if !ok {
		return nil, fmt.Errorf("get %s: %w", key, storage.ErrNotFound)
	}
	return io.NopCloser(bytes.NewReader(o.data)), nil
}

func (s *memStore) Stat(_ context.Context, key string) (storage.ObjectInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[key]
	if !ok {
		return storage.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, storage.ErrNotFound)
	}
	return storage.ObjectInfo{Key: key, Size: int64(len(o.data)), ModTime: o.mod}, nil
}

func (s *memStore) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	s.mu.Lock()
	var infos []storage.ObjectInfo
	for k, o := range s.objs {
		if strings.HasPrefix(k, prefix) {
			infos = append(infos, storage.ObjectInfo{Key: k, Size: int64(len(o.data)), ModTime: o.mod})
		}
	}
	s.mu.Unlock()
	sort.Slice(infos, func(i, j int) bool { return infos[i].Key < infos[j].Key })
	for _, o := range infos {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

func (s *memStore) Delete(_ context.Context, keys ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		delete(s.objs, k)
	}
	return nil
}

func (s *memStore) String() string { return s.name }
func (s *memStore) Close() error   { return nil }
