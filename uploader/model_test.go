package uploader_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ckpt-io/ckpt/gc"
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

// clocked is the model's storage: a file store whose objects take their
// times from the model's clock (storage's clock), and whose first Delete
// of shared or private objects can be held while the model goes on: a
// collection's delete in flight.
type clocked struct {
	*file.Store
	mu      sync.Mutex
	now     time.Time
	armed   bool
	reached chan struct{}
	release chan struct{}
}

func (c *clocked) clock() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clocked) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *clocked) stamp(key string, err error) error {
	if err == nil {
		t := c.clock()
		os.Chtimes(filepath.Join(c.Root(), filepath.FromSlash(key)), t, t)
	}
	return err
}

func (c *clocked) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return c.stamp(key, c.Store.Put(ctx, key, body, size))
}

func (c *clocked) Create(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return c.stamp(key, c.Store.Create(ctx, key, body, size))
}

func (c *clocked) Delete(ctx context.Context, keys ...string) error {
	c.mu.Lock()
	hold := c.armed && slices.ContainsFunc(keys, func(k string) bool {
		return strings.Contains(k, "/shared/") || strings.Contains(k, "/private/")
	})
	if hold {
		c.armed = false
	}
	c.mu.Unlock()
	if hold {
		close(c.reached)
		<-c.release
	}
	return c.Store.Delete(ctx, keys...)
}

// writer is a checkpoint between its look at GC's marks and its commit.
type writer struct {
	task   string
	n      uint64
	format int // the manifest format the agent wrote when it began
	st     storage.Store
	res    *uploader.Result
	hold   *gc.Hold
	// checked is the step of its last look at storage (presence, marks):
	// storage losing an object after that is not the writer's to see.
	checked int
}

// model drives the real uploader, manifests and file store through random
// histories of checkpoints of several tasks sharing byte-identical files,
// crashes, retention, storage losing objects, time passing, and
// collections (some held between sending a delete and its landing), and
// checks the invariants after every step.
type model struct {
	t      *rapid.T
	ctx    context.Context
	store  *clocked
	local  *localrecovery.Store
	snaps  string
	retain int
	// format is the manifest format the agents write now (1: SHA-256
	// content ids, 2: BLAKE3): a fleet switches back and forth.
	format int
	next   map[string]uint64 // next checkpoint number per task
	// contents is the universe of file contents: shared ids → bytes.
	contents map[int][]byte
	// presence confirms reused objects before commits, as the agent does;
	// its bound is 0 here, so every check observes storage again.
	presence *uploader.Presence
	guard    *gc.Guard
	writers  map[string]*writer // at most one in flight per task
	gcDone   chan error         // a collection held at its delete
	heldAt   time.Time          // storage's time when it was held
	// step counts actions; damaged is the step at which storage last lost
	// or truncated an object, committed the step of each commit. A
	// manifest committed after an object's damage must restore whole.
	step      int
	damaged   map[string]int
	committed map[string]int
}

const job = "job"

var tasks = []string{"a", "b", "c"}

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

// begin runs a checkpoint as the agent does up to its commit: upload, then
// the look at GC's marks; budget < 0 lets it finish, otherwise the store
// fails after budget writes.
func (m *model) begin(task string, ids []int, budget int64) {
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
	confirmed := uploader.NewConfirmed()
	confirmedIDs := map[string]string{} // the same, as content ids: the model's view
	for _, mf := range retained {
		for _, f := range mf.Files {
			confirmed.Add(&f)
			if f.Kind == manifests.Shared {
				confirmedIDs[f.ContentID()] = f.Key
			}
		}
	}
	var st storage.Store = m.store
	if budget >= 0 {
		fa := &failAfter{Store: m.store}
		fa.budget.Store(budget)
		st = fa
	}
	alg := manifests.BLAKE3
	if m.format == manifests.Format1 {
		alg = manifests.SHA256
	}
	req := uploader.Request{Store: st, Job: job, Task: task, Checkpoint: n, Snapshot: sn, Confirmed: confirmed, Concurrency: 3, Presence: m.presence, Alg: alg}
	res, err := uploader.Upload(m.ctx, req)
	var hold *gc.Hold
	if err == nil {
		hold, err = uploader.AvoidMarked(m.ctx, req, res, m.guard)
	}
	if err == nil {
		// Invariant 3: every reused object was confirmed when the upload began.
		for _, f := range res.Files {
			if f.Kind == manifests.Shared && !f.Uploaded {
				if key, ok := confirmedIDs[f.ContentID()]; !ok || key != f.Key {
					dup := false
					for _, g := range res.Files {
						dup = dup || (g.Uploaded && g.Key == f.Key)
					}
					if !dup {
						m.t.Fatalf("checkpoint %d reused %s, which no retained manifest confirmed", n, f.Key)
					}
				}
			}
		}
		m.writers[task] = &writer{task: task, n: n, format: m.format, st: st, res: res, hold: hold, checked: m.step}
		return
	}
	if budget < 0 {
		m.t.Fatalf("checkpoint without faults failed: %v", err)
	}
	m.local.Discard(task, n)
}

// commit ends the checkpoint in flight of task: its manifest, committed
// within D/2 of a look at the marks, and retention.
func (m *model) commit(w *writer) {
	delete(m.writers, w.task)
	mf := &manifests.Manifest{Job: job, Task: w.task, Checkpoint: w.n, Created: time.Now(), Files: w.res.Files,
		FilesUploaded: w.res.FilesUploaded, FilesReused: w.res.FilesReused, Format: w.format}
	for _, f := range w.res.Files {
		mf.FullSize += f.Size
	}
	enc, err := mf.Encode(w.res.BytesWritten)
	if err != nil {
		m.t.Fatalf("format %d: %v", w.format, err)
	}
	err = gc.CommitHeld(m.ctx, w.st, mf, enc, w.hold)
	if err != nil {
		if _, crashing := w.st.(*failAfter); !crashing && !errors.Is(err, gc.ErrStale) {
			m.t.Fatalf("commit without faults failed: %v", err)
		}
		m.local.Discard(w.task, w.n)
		return
	}
	m.committed[fmt.Sprint(w.task, "/", w.n)] = w.checked
	m.local.Complete(w.task, w.n, mf, enc)
	cat, _ := manifests.Scan(m.ctx, m.store, job, w.task)
	_, retire := manifests.Retention(cat.Retained(w.task), m.retain)
	for _, old := range retire {
		if err := manifests.Retire(m.ctx, m.store, job, w.task, old.Checkpoint); err != nil {
			m.t.Fatal(err)
		}
	}
}

func (m *model) gc(retain int) {
	if _, err := gc.Collect(m.ctx, m.store, job, gc.Options{Retain: retain, Grace: 0}); err != nil {
		m.t.Fatal(err)
	}
}

// land lets a held collection's delete land and waits for it to end.
func (m *model) land() {
	if m.gcDone == nil {
		return
	}
	close(m.store.release)
	if err := <-m.gcDone; err != nil {
		m.t.Fatal(err)
	}
	m.gcDone = nil
}

func (m *model) check() {
	// Invariants 1 and 4: every object of every retained manifest exists,
	// whole, and no collection deleted one of them.
	for _, task := range tasks {
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
		fs, _ := file.New(filepath.Join(base, "store"))
		st := &clocked{Store: fs, now: time.Now()}
		local, _ := localrecovery.Open(filepath.Join(base, "local"), job)
		guard := gc.NewGuard(st, job)
		guard.Now, guard.Delay = st.clock, gc.DefaultMarkDelay
		m := &model{t: t, ctx: context.Background(), store: st, local: local, snaps: filepath.Join(base, "snaps"),
			retain: rapid.IntRange(1, 3).Draw(t, "retain"), format: rapid.IntRange(1, 2).Draw(t, "format"), next: map[string]uint64{}, contents: map[int][]byte{},
			presence: uploader.NewPresence(st, manifests.SharedPrefix(job), 0), guard: guard, writers: map[string]*writer{},
			damaged: map[string]int{}, committed: map[string]int{}}
		for _, task := range tasks {
			m.next[task] = 1
		}
		defer m.land()
		for id := range 12 {
			m.contents[id] = bytes.Repeat([]byte{byte(id)}, 100+id*37)
		}
		// The tasks share some contents: the same bytes under one key.
		pick := func(t *rapid.T) []int {
			ids := rapid.SliceOfNDistinct(rapid.IntRange(0, 11), 1, 6, rapid.ID[int]).Draw(t, "files")
			sort.Ints(ids)
			return ids
		}
		idle := func(t *rapid.T) string {
			var free []string
			for _, task := range tasks {
				if m.writers[task] == nil {
					free = append(free, task)
				}
			}
			if len(free) == 0 {
				t.Skip("every task has a checkpoint in flight")
			}
			return rapid.SampledFrom(free).Draw(t, "task")
		}
		t.Repeat(map[string]func(*rapid.T){
			"checkpoint": func(t *rapid.T) {
				task := idle(t)
				m.begin(task, pick(t), -1)
				if w := m.writers[task]; w != nil {
					m.commit(w)
				}
			},
			"checkpoint uploads and looks at the marks": func(t *rapid.T) {
				m.begin(idle(t), pick(t), -1)
			},
			"checkpoint commits": func(t *rapid.T) {
				var ws []string
				for task := range m.writers {
					ws = append(ws, task)
				}
				if len(ws) == 0 {
					t.Skip("no checkpoint in flight")
				}
				sort.Strings(ws)
				m.commit(m.writers[rapid.SampledFrom(ws).Draw(t, "writer")])
			},
			"crash mid-upload": func(t *rapid.T) {
				task := idle(t)
				m.begin(task, pick(t), rapid.Int64Range(0, 4).Draw(t, "writes"))
				if w := m.writers[task]; w != nil {
					m.commit(w)
				}
			},
			"the fleet switches manifest formats": func(t *rapid.T) {
				m.format = 3 - m.format
			},
			"time passes": func(t *rapid.T) {
				d := time.Duration(rapid.IntRange(1, 12).Draw(t, "minutes")) * time.Minute
				if m.gcDone != nil {
					// A request lands within a bound (the design's q): a delete
					// in flight does not outlive a minute of storage's time.
					d = min(d, m.heldAt.Add(time.Minute).Sub(m.store.clock()))
				}
				m.store.advance(d)
			},
			"gc":                func(t *rapid.T) { m.gc(0) },
			"gc with retention": func(t *rapid.T) { m.gc(m.retain) },
			"gc sends a delete, held in flight": func(t *rapid.T) {
				if m.gcDone != nil {
					t.Skip("a collection is already held")
				}
				st.mu.Lock()
				st.armed, st.reached, st.release = true, make(chan struct{}), make(chan struct{})
				st.mu.Unlock()
				done := make(chan error, 1)
				go func() {
					_, err := gc.Collect(m.ctx, m.store, job, gc.Options{Grace: 0})
					done <- err
				}()
				select {
				case <-st.reached:
					m.gcDone, m.heldAt = done, st.clock()
				case err := <-done:
					st.mu.Lock()
					st.armed = false
					st.mu.Unlock()
					if err != nil {
						t.Fatal(err)
					}
				}
			},
			"gc's delete lands": func(t *rapid.T) { m.land() },
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
					t := m.store.clock() // storage's clock stamps the damage
					os.Chtimes(p, t, t)
				} else {
					os.Remove(p)
				}
				m.damaged[key] = m.step
			},
			"": func(*rapid.T) { m.step++; m.check() },
		})
		m.land()
		m.check()
		for _, w := range m.writers {
			m.commit(w)
		}
		m.check()
		// Finally: two collections D apart leave exactly the live objects.
		m.gc(0)
		m.store.advance(gc.DefaultMarkDelay)
		rep, err := gc.Collect(m.ctx, m.store, job, gc.Options{Grace: 0})
		if err != nil {
			t.Fatal(err)
		}
		live := map[string]bool{}
		for _, task := range tasks {
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
