package uploader_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/uploader"
)

// failAfter is a store whose Puts fail once a budget is spent: a crash (or
// an abort) in the middle of an upload.
type failAfter struct {
	storage.Store
	budget atomic.Int64
}

var errCrash = errors.New("crash")

func (f *failAfter) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	if f.budget.Add(-1) < 0 {
		return errCrash
	}
	return f.Store.Put(ctx, key, body, size)
}

func (f *failAfter) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	if f.budget.Add(-1) < 0 {
		return errCrash
	}
	return f.Store.Create(ctx, key, body, size)
}

// model drives the real uploader, manifests and file store through random
// histories of checkpoints, crashes, aborts, retention and GC, and checks
// the invariants after every step.
type model struct {
	t      *rapid.T
	ctx    context.Context
	store  *file.Store
	local  *localrecovery.Store
	snaps  string
	retain int
	next   map[string]uint64 // next checkpoint number per task
	// contents is the universe of file contents: shared ids → bytes.
	contents map[int][]byte
	// presence confirms reused objects before commits, as the agent does;
	// its bound is 0 here, so every check observes storage again.
	presence *uploader.Presence
	// step counts actions; damaged is the step at which storage last lost
	// or truncated an object, committed the step of each commit. A
	// manifest committed after an object's damage must restore whole.
	step      int
	damaged   map[string]int
	committed map[string]int
}

const job = "job"

func (m *model) retained(task string) []*manifests.Manifest {
	cat, err := manifests.Scan(m.ctx, m.store, job, task)
	if err != nil {
		m.t.Fatal(err)
	}
	var out []*manifests.Manifest
	for _, r := range cat.Retained(task) {
		mf, err := manifests.Load(m.ctx, m.store, job, task, r.Checkpoint)
		if err != nil {
			m.t.Fatalf("retained manifest unreadable: %v", err)
		}
		out = append(out, mf)
	}
	return out
}

// checkpoint runs one checkpoint as the agent does; budget < 0 lets it
// finish, otherwise the store fails after budget writes.
func (m *model) checkpoint(task string, ids []int, budget int64) {
	n := m.next[task]
	m.next[task]++
	dir := filepath.Join(m.snaps, fmt.Sprintf("%s-%d", task, n))
	os.MkdirAll(dir, 0o755)
	for _, id := range ids {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("%06d.sst", id)), m.contents[id], 0o644)
	}
	os.WriteFile(filepath.Join(dir, "CURRENT"), []byte(fmt.Sprint("MANIFEST-", n)), 0o644)
	if n%2 == 0 { // a private file too large to inline: stored per checkpoint
		os.WriteFile(filepath.Join(dir, "MANIFEST-000001"), bytes.Repeat([]byte{byte(n)}, uploader.DefaultInlineMax+1), 0o644)
	}
	defer os.RemoveAll(dir)

	sn, err := m.local.Take(task, n, dir, false)
	if err == nil {
		err = sn.Inspect()
	}
	if err != nil {
		m.t.Fatal(err)
	}
	retained := m.retained(task)
	confirmed := map[string]string{}
	for _, mf := range retained {
		for _, f := range mf.Files {
			if f.Kind == manifests.Shared {
				confirmed[f.ContentID()] = f.Key
			}
		}
	}
	var st storage.Store = m.store
	if budget >= 0 {
		fa := &failAfter{Store: m.store}
		fa.budget.Store(budget)
		st = fa
	}
	res, err := uploader.Upload(m.ctx, uploader.Request{Store: st, Job: job, Task: task, Checkpoint: n, Snapshot: sn, Confirmed: confirmed, Concurrency: 3, Presence: m.presence})
	if err == nil {
		// Invariant 3: every reused object was confirmed when the upload began.
		for _, f := range res.Files {
			if f.Kind == manifests.Shared && !f.Uploaded {
				if _, ok := confirmed[f.ContentID()]; !ok {
					dup := false
					for _, g := range res.Files {
						dup = dup || (g.Uploaded && g.ContentID() == f.ContentID())
					}
					if !dup {
						m.t.Fatalf("checkpoint %d reused %s, which no retained manifest confirmed", n, f.Key)
					}
				}
			}
		}
		mf := &manifests.Manifest{Job: job, Task: task, Checkpoint: n, Created: time.Now(), Files: res.Files,
			FilesUploaded: res.FilesUploaded, FilesReused: res.FilesReused}
		for _, f := range res.Files {
			mf.FullSize += f.Size
		}
		enc, _ := mf.Encode(res.BytesWritten)
		err = manifests.Commit(m.ctx, st, mf, enc)
		if err == nil {
			m.committed[fmt.Sprint(task, "/", n)] = m.step
			m.local.Complete(task, n, mf, enc)
			cat, _ := manifests.Scan(m.ctx, m.store, job, task)
			_, retire := manifests.Retention(cat.Retained(task), m.retain)
			for _, old := range retire {
				if err := manifests.Retire(m.ctx, m.store, job, task, old.Checkpoint); err != nil {
					m.t.Fatal(err)
				}
			}
			return
		}
	}
	if budget < 0 {
		m.t.Fatalf("checkpoint without faults failed: %v", err)
	}
	m.local.Discard(task, n)
}

func (m *model) check() {
	// Invariant 1 and 4: every object of every retained manifest exists, whole.
	for _, task := range []string{"a", "b"} {
		for _, mf := range m.retained(task) {
			probs, _, err := manifests.Verify(m.ctx, m.store, mf, 4)
			if err != nil {
				m.t.Fatal(err)
			}
			for _, p := range probs {
				// Storage lost this object after the checkpoint committed:
				// nothing the writer did can prevent that (the scrub heals it).
				if d, ok := m.damaged[p.Key]; ok && d > m.committed[fmt.Sprint(task, "/", mf.Checkpoint)] {
					continue
				}
				m.t.Fatalf("retained checkpoint broken: %v", probs)
			}
		}
	}
}

func TestInvariantsHoldOverRandomHistories(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		base, err := os.MkdirTemp("", "ckpt-model-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(base)
		st, _ := file.New(filepath.Join(base, "store"))
		local, _ := localrecovery.Open(filepath.Join(base, "local"), job)
		m := &model{t: t, ctx: context.Background(), store: st, local: local, snaps: filepath.Join(base, "snaps"),
			retain: rapid.IntRange(1, 3).Draw(t, "retain"), next: map[string]uint64{"a": 1, "b": 1}, contents: map[int][]byte{},
			presence: uploader.NewPresence(st, manifests.SharedPrefix(job), 0), damaged: map[string]int{}, committed: map[string]int{}}
		for id := range 12 {
			m.contents[id] = bytes.Repeat([]byte{byte(id)}, 100+id*37)
		}
		// Tasks a and b share some contents: the same bytes under one key.
		pick := func(t *rapid.T) []int {
			ids := rapid.SliceOfNDistinct(rapid.IntRange(0, 11), 1, 6, rapid.ID[int]).Draw(t, "files")
			sort.Ints(ids)
			return ids
		}
		t.Repeat(map[string]func(*rapid.T){
			"checkpoint": func(t *rapid.T) {
				m.checkpoint(rapid.SampledFrom([]string{"a", "b"}).Draw(t, "task"), pick(t), -1)
			},
			"crash mid-upload": func(t *rapid.T) {
				m.checkpoint(rapid.SampledFrom([]string{"a", "b"}).Draw(t, "task"), pick(t), rapid.Int64Range(0, 4).Draw(t, "writes"))
			},
			"gc": func(t *rapid.T) {
				if _, err := manifests.GC(m.ctx, m.store, job, manifests.GCOptions{Grace: 0}); err != nil {
					t.Fatal(err)
				}
			},
			"gc with retention": func(t *rapid.T) {
				if _, err := manifests.GC(m.ctx, m.store, job, manifests.GCOptions{Retain: m.retain, Grace: 0}); err != nil {
					t.Fatal(err)
				}
			},
			"storage loses an object": func(t *rapid.T) {
				var keys []string
				m.store.List(m.ctx, manifests.SharedPrefix(job), func(o storage.ObjectInfo) error {
					keys = append(keys, o.Key)
					return nil
				})
				if len(keys) == 0 {
					t.Skip("no object to lose")
				}
				key := rapid.SampledFrom(keys).Draw(t, "key")
				p := filepath.Join(m.store.Root(), filepath.FromSlash(key))
				if rapid.Bool().Draw(t, "truncate") {
					os.Truncate(p, 1)
				} else {
					os.Remove(p)
				}
				m.damaged[key] = m.step
			},
			"": func(*rapid.T) { m.step++; m.check() },
		})
		// Finally: a GC past the grace leaves exactly the live objects.
		rep, err := manifests.GC(m.ctx, m.store, job, manifests.GCOptions{Grace: 0})
		if err != nil {
			t.Fatal(err)
		}
		live := map[string]bool{}
		for _, task := range []string{"a", "b"} {
			for _, mf := range m.retained(task) {
				for _, f := range mf.Files {
					if f.Key != "" {
						live[f.Key] = true
					}
				}
			}
		}
		var stored []string
		m.store.List(m.ctx, job+"/", func(o storage.ObjectInfo) error {
			if strings.Contains(o.Key, "/shared/") || strings.Contains(o.Key, "/private/") {
				stored = append(stored, o.Key)
			}
			return nil
		})
		for _, k := range stored {
			if !live[k] {
				t.Fatalf("orphan %s survived GC (report %+v)", k, rep)
			}
		}
		have := map[string]bool{}
		for _, k := range stored {
			have[k] = true
		}
		for k := range live {
			if _, lost := m.damaged[k]; !have[k] && !lost {
				t.Fatalf("live object %s missing (report %+v)", k, rep)
			}
		}
	})
}
