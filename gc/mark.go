package gc

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// DefaultMarkDelay is D, the least time (by storage's clock) between a
// collection marking an object for deletion and a later collection deleting
// it. Writers commit within D/2 of their last look at the marks (see Guard).
// Every agent and `ckpt gc` of a job must use the same D; only tests lower
// it, with UnsafeMarkDelayEnv.
const DefaultMarkDelay = 10 * time.Minute

// UnsafeMarkDelayEnv names the environment variable that lowers
// DefaultMarkDelay (a Go duration such as "0s"), for tests only: it must be the
// same for every writer and collector of the job, and a D shorter than
// twice the longest storage request makes the deferred deletion unsafe.
const UnsafeMarkDelayEnv = "CKPT_UNSAFE_GC_MARK_DELAY"

// MarkDelay returns D in effect: DefaultMarkDelay, or less when
// UnsafeMarkDelayEnv lowers it.
func MarkDelay() time.Duration { return lowered(UnsafeMarkDelayEnv, DefaultMarkDelay) }

// gcLockHold is how long a collection that took the deletion lock may go
// on sending deletes (by its own clock, from the moment it asked for the
// lock); gcLockExpiry is the age (by storage's clock) after which another
// collection may take the lock over. The gap covers the last delete's
// flight and storage's one-second timestamps.
const (
	gcLockHold   = 5 * time.Minute
	gcLockExpiry = 7 * time.Minute
)

// UnsafeLockExpiryEnv names the environment variable that lowers
// gcLockExpiry (a Go duration), for tests only: a test that kills a
// collection while it holds the lock lets the next collection take it
// over at once instead of seven minutes later. With a real second
// collection still deleting, a lowered expiry is unsafe.
const UnsafeLockExpiryEnv = "CKPT_UNSAFE_GC_LOCK_EXPIRY"

// lockExpiry returns gcLockExpiry, or less when UnsafeLockExpiryEnv
// lowers it.
func lockExpiry() time.Duration { return lowered(UnsafeLockExpiryEnv, gcLockExpiry) }

// lowered returns the duration the test-only environment variable env
// gives, when it is one below def; def otherwise.
func lowered(env string, def time.Duration) time.Duration {
	if v := os.Getenv(env); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d >= 0 && d < def {
			return d
		}
	}
	return def
}

// markBatch bounds the candidates one mark object names.
const markBatch = 10000

// Prefix is where collections keep their marks, lock and clock probe.
func Prefix(job string) string { return job + "/gc/" }

func marksPrefix(job string) string { return Prefix(job) + "marks/" }
func lockPrefix(job string) string  { return Prefix(job) + "lock/" }
func clockKey(job string) string    { return Prefix(job) + "clock" }

// mark is the stored form of a mark: the objects one collection found
// unreferenced and older than its grace, which a later collection deletes
// if they are still unreferenced at least Delay after the mark was written.
type mark struct {
	Format     int            `json:"format"`
	Delay      time.Duration  `json:"delay_ns"`
	Candidates []markedObject `json:"candidates"`
}

type markedObject struct {
	Key  string `json:"key"`
	Size int64  `json:"size"`
}

// storedMark is a mark as found in storage. keys is nil when the object
// could not be read as a mark: its candidates are unknown, so nothing is
// deleted for it (and writers cannot honour it: see Guard).
type storedMark struct {
	key     string
	modTime time.Time
	delay   time.Duration
	keys    markedSet
}

// ErrMarked is returned (wrapped) by CommitHeld when the manifest names an
// object that was marked for deletion when the writer looked: nothing is
// committed.
var ErrMarked = errors.New("an object the manifest names is marked for deletion by GC")

// markCache keeps parsed marks by key and time: marks are never rewritten.
// It also keeps the join of the candidates of the marks last read, for
// writers, rebuilt only when the marks change.
type markCache struct {
	mu     sync.Mutex
	marks  map[string]storedMark
	joined markedSet
	of     map[string]time.Time // the marks joined, by key and time
}

// join returns the candidates of marks (the marks read last) as one set.
// The set is shared: callers must not change it.
func (c *markCache) join(marks []storedMark) markedSet {
	c.mu.Lock()
	defer c.mu.Unlock()
	same := c.joined != nil && len(c.of) == len(marks)
	for _, m := range marks {
		if t, ok := c.of[m.key]; !ok || !t.Equal(m.modTime) {
			same = false
			break
		}
	}
	if same {
		return c.joined
	}
	j, of := markedSet{}, make(map[string]time.Time, len(marks))
	for _, m := range marks {
		j.join(m.keys)
		of[m.key] = m.modTime
	}
	c.joined, c.of = j, of
	return j
}

// read lists the marks of job and reads the new ones.
func (c *markCache) read(ctx context.Context, s storage.Store, job string) ([]storedMark, error) {
	var listed []storage.ObjectInfo
	if err := s.List(ctx, marksPrefix(job), func(o storage.ObjectInfo) error {
		listed = append(listed, o)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("list gc marks of job %s: %w", job, err)
	}
	c.mu.Lock()
	if c.marks == nil {
		c.marks = map[string]storedMark{}
	}
	known := c.marks
	c.mu.Unlock()
	out := make([]storedMark, 0, len(listed))
	fresh := map[string]storedMark{}
	for _, o := range listed {
		c.mu.Lock()
		m, ok := known[o.Key]
		c.mu.Unlock()
		if !ok || !m.modTime.Equal(o.ModTime) {
			var err error
			if m, err = readMark(ctx, s, o); err != nil {
				if errors.Is(err, storage.ErrNotFound) {
					continue // removed since the listing: its deletes are done
				}
				return nil, err
			}
		}
		fresh[o.Key] = m
		out = append(out, m)
	}
	c.mu.Lock()
	c.marks = fresh
	c.mu.Unlock()
	return out, nil
}

func readMark(ctx context.Context, s storage.Store, o storage.ObjectInfo) (storedMark, error) {
	m := storedMark{key: o.Key, modTime: o.ModTime}
	rc, err := s.Get(ctx, o.Key)
	if err != nil {
		return m, fmt.Errorf("read gc mark: %w", err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, manifests.MaxManifestBytes+1))
	if err != nil {
		return m, fmt.Errorf("read gc mark %s: %w", o.Key, err)
	}
	var body mark
	if json.Unmarshal(data, &body) != nil || body.Format != 1 || len(data) > manifests.MaxManifestBytes {
		return m, nil // unreadable: nothing is deleted for it
	}
	m.delay = body.Delay
	m.keys = make(markedSet, len(body.Candidates))
	for _, c := range body.Candidates {
		m.keys.add(c.Key)
	}
	return m, nil
}

// writeMarks stores the candidates as marks of at most markBatch objects.
func writeMarks(ctx context.Context, s storage.Store, job string, delay time.Duration, cands []storage.ObjectInfo) error {
	for len(cands) > 0 {
		n := min(markBatch, len(cands))
		body := mark{Format: 1, Delay: delay}
		for _, o := range cands[:n] {
			body.Candidates = append(body.Candidates, markedObject{Key: o.Key, Size: o.Size})
		}
		cands = cands[n:]
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		key := marksPrefix(job) + strconv.FormatInt(time.Now().UnixNano(), 10) + "-" + randomHex(4)
		if err := s.Create(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
			return fmt.Errorf("gc: write mark: %w", err)
		}
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// storageNow reads storage's clock: it writes the job's clock probe and
// returns the time storage gives it, with the local time taken just before.
//
// Collections of one job, from many agents, share the probe: one may
// delete it (when it ends) between another's write and read, and that one
// then writes it again. A probe a killed collection left is overwritten
// and deleted by the next.
func storageNow(ctx context.Context, s storage.Store, job string) (time.Time, error) {
	var err error
	for attempt := 0; attempt < 10; attempt++ {
		if err = s.Put(ctx, clockKey(job), bytes.NewReader(nil), 0); err != nil {
			return time.Time{}, fmt.Errorf("gc: read storage's clock: %w", err)
		}
		var info storage.ObjectInfo
		if info, err = s.Stat(ctx, clockKey(job)); err == nil {
			return info.ModTime, nil
		}
		if !errors.Is(err, storage.ErrNotFound) {
			break
		}
		select { // another collection removed it: write it again
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 10 * time.Millisecond):
		}
	}
	return time.Time{}, fmt.Errorf("gc: read storage's clock: %w", err)
}

// takeLock takes the job's deletion lock: the next generation of
// <job>/gc/lock/<gen>, by conditional create, when no generation exists or
// the newest is older than gcLockExpiry at storage time now. It returns the
// key held ("" when another collection holds the lock).
func takeLock(ctx context.Context, s storage.Store, job string, now time.Time) (string, error) {
	var newest storage.ObjectInfo
	var gen uint64
	var all []string
	if err := s.List(ctx, lockPrefix(job), func(o storage.ObjectInfo) error {
		all = append(all, o.Key)
		if g, err := strconv.ParseUint(strings.TrimPrefix(o.Key, lockPrefix(job)), 10, 64); err == nil && g >= gen {
			gen, newest = g, o
		}
		return nil
	}); err != nil {
		return "", fmt.Errorf("gc: read the deletion lock: %w", err)
	}
	if newest.Key != "" && now.Sub(newest.ModTime) < lockExpiry() {
		return "", nil
	}
	key := fmt.Sprintf("%s%020d", lockPrefix(job), gen+1)
	err := s.Create(ctx, key, bytes.NewReader(nil), 0)
	if errors.Is(err, storage.ErrExists) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("gc: take the deletion lock: %w", err)
	}
	sort.Strings(all)
	if len(all) > 0 {
		s.Delete(ctx, all...) // expired generations: best effort
	}
	return key, nil
}

// Guard is the writer's side of deferred deletion: before a manifest is
// committed, it names the objects that collections have marked for
// deletion, so the writer references none of them (it stores those bytes
// under a FreshKey instead), and it bounds the time from that look to the
// commit by D/2 (see the package documentation of GC for why).
//
// A Guard is safe for concurrent use and caches the marks it has read.
type Guard struct {
	store storage.Store
	job   string
	// Delay is D (MarkDelay() by default); commits happen within Delay/2
	// of the last Check.
	Delay time.Duration
	// Now is the writer's clock, used only to measure durations
	// (time.Now by default, whose readings carry a monotonic clock).
	Now   func() time.Time
	cache markCache
}

// NewGuard returns the guard of writers of job in s.
func NewGuard(s storage.Store, job string) *Guard {
	return &Guard{store: s, job: job, Delay: MarkDelay(), Now: time.Now}
}

// Hold is one look at the marks: the keys marked then, and when the look
// started.
type Hold struct {
	g       *Guard
	at      time.Time
	pending markedSet
}

// Check reads the marks. The hold it returns is valid for Delay/2 from
// the moment Check was called.
func (g *Guard) Check(ctx context.Context) (*Hold, error) {
	at := g.Now()
	marks, err := g.cache.read(ctx, g.store, g.job)
	if err != nil {
		return nil, err
	}
	return &Hold{g: g, at: at, pending: g.cache.join(marks)}, nil
}

// Pending reports whether key was marked for deletion when h was taken.
func (h *Hold) Pending(key string) bool { return h.pending.has(key) }

// Expired reports whether more than Delay/2 passed since h was taken: a
// commit must look at the marks again first.
func (h *Hold) Expired() bool { return h.g.Now().Sub(h.at) > h.g.Delay/2 }

// Conflicts returns the object keys of m marked for deletion in h.
func (h *Hold) Conflicts(m *manifests.Manifest) []string {
	var out []string
	for _, f := range m.Files {
		if f.Key != "" && h.pending.has(f.Key) {
			out = append(out, f.Key)
		}
	}
	return out
}

// ErrStale is returned (wrapped) by CommitHeld when more than D/2 passed
// since the writer looked at the marks: a collection may have deleted, and
// then stopped marking, an object the manifest names. Nothing is
// committed; the checkpoint may be retried.
var ErrStale = errors.New("too long since the writer looked at GC's marks")

// CommitHeld is Commit for a writer that took hold (Guard.Check) after its
// objects were uploaded, and references no object marked then. It commits
// only within Delay/2 of that look; later, it commits nothing and returns
// an error wrapping ErrStale. (Looking again would not do: a collection
// removes a mark once it deleted the mark's objects.)
func CommitHeld(ctx context.Context, s storage.Store, m *manifests.Manifest, encoded []byte, hold *Hold) error {
	if c := hold.Conflicts(m); len(c) > 0 {
		return fmt.Errorf("commit %s checkpoint %d: %s: %w", m.Task, m.Checkpoint, c[0], ErrMarked)
	}
	if hold.Expired() {
		return fmt.Errorf("commit %s checkpoint %d: %v passed since: %w", m.Task, m.Checkpoint, hold.g.Now().Sub(hold.at).Round(time.Millisecond), ErrStale)
	}
	return manifests.Commit(ctx, s, m, encoded)
}
