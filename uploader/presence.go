package uploader

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// DefaultPresenceMaxAge is the default bound on how old the observation of
// a reused object may be when a manifest is committed (see Presence).
const DefaultPresenceMaxAge = 5 * time.Minute

// DefaultStatMax is how many objects whose observation is too old a check
// confirms one Stat each; more than that, it lists the whole prefix once.
const DefaultStatMax = 64

// Object is a stored object a manifest is about to reference: its key and
// the size it must have.
type Object struct {
	Key  string
	Size int64
}

// Finding is an object a presence check could not confirm: missing, or
// stored with another size (Stored, when Found).
type Finding struct {
	Object
	Found  bool
	Stored int64
}

func (f Finding) String() string {
	if !f.Found {
		return "missing"
	}
	return fmt.Sprintf("size %d, want %d", f.Stored, f.Size)
}

// Presence confirms that objects exist with the right size, from
// observations of storage no older than MaxAge (invariant 3, "confirmed
// also means still there").
//
// The guarantee: when Check returns no finding for an object, storage
// reported that object with that size (in a listing of Prefix, a Stat, or
// a successful Put by this process) at a moment no earlier than MaxAge
// before Check was called. A listing counts as observed at the moment it
// started. Callers check just before they commit a manifest, so every
// reused object was seen whole at most MaxAge (plus the time of the check
// and of re-uploads it triggers) before the manifest exists. A size check
// cannot see bytes changed in place; the agent's scrub re-hashes for that.
//
// Cost: Check keeps an index of key → size of the objects it was asked
// about (not of everything under Prefix), refreshed by a full listing when
// a check needs more than StatMax objects confirmed that the last listing,
// if newer than MaxAge, did not look for; so a task reusing thousands of
// objects pays one listing per MaxAge, and the index grows with the
// objects this process references, not with the job. A check of at most
// StatMax objects Stats them instead. Objects this process uploads are
// added as they are written (Saw).
//
// A Presence is safe for concurrent use. The zero value is not usable: use
// NewPresence.
type Presence struct {
	store  storage.Store
	prefix string
	// MaxAge bounds the age of an observation a check accepts (0: every
	// check observes again).
	MaxAge time.Duration
	// StatMax is the most objects a check Stats one by one before it
	// lists the prefix instead (default DefaultStatMax; < 0: always list).
	StatMax int
	// Concurrency bounds parallel Stats (default 8).
	Concurrency int

	refreshMu sync.Mutex // one listing at a time
	mu        sync.Mutex
	seen      map[string]seenObject
	listedAt  time.Time // start of the last complete listing
	listings  int
	stats     int
}

type seenObject struct {
	size int64
	at   time.Time
}

// NewPresence returns a presence check of the objects under prefix of s.
func NewPresence(s storage.Store, prefix string, maxAge time.Duration) *Presence {
	return &Presence{store: s, prefix: prefix, MaxAge: maxAge, StatMax: DefaultStatMax, Concurrency: 8, seen: map[string]seenObject{}}
}

// Saw records that key was observed in storage with size at time at (a Put
// that returned nil, a Stat, a read).
func (p *Presence) Saw(key string, size int64, at time.Time) {
	if p == nil || !strings.HasPrefix(key, p.prefix) {
		return
	}
	p.mu.Lock()
	if old, ok := p.seen[key]; !ok || !old.at.After(at) {
		p.seen[key] = seenObject{size: size, at: at}
	}
	p.mu.Unlock()
}

// Forget drops what is known of key: the next check observes it again.
func (p *Presence) Forget(key string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	delete(p.seen, key)
	p.mu.Unlock()
}

// Counts reports how many listings and Stats the checks made.
func (p *Presence) Counts() (listings, stats int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.listings, p.stats
}

// Check returns the objects of objs it cannot confirm, in objs' order. An
// error means storage could not be asked (nothing is confirmed then).
func (p *Presence) Check(ctx context.Context, objs []Object) ([]Finding, error) {
	cutoff := time.Now().Add(-p.MaxAge)
	todo := p.unconfirmed(objs, cutoff)
	if len(todo) == 0 {
		return nil, nil
	}
	statMax := p.StatMax
	if statMax == 0 {
		statMax = DefaultStatMax
	}
	if len(todo) > statMax {
		if err := p.refresh(ctx, cutoff, todo); err != nil {
			return nil, err
		}
		// After a listing at least as new as cutoff, what it did not
		// confirm is reported: uploading a content-addressed object again
		// is harmless, and Stats of thousands would cost more than that.
		return p.findings(p.unconfirmed(todo, cutoff)), nil
	}
	return p.statAll(ctx, todo)
}

// unconfirmed returns the objects of objs not observed with their size
// since cutoff.
func (p *Presence) unconfirmed(objs []Object, cutoff time.Time) []Object {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Object
	for _, o := range objs {
		if s, ok := p.seen[o.Key]; !ok || s.size != o.Size || s.at.Before(cutoff) {
			out = append(out, o)
		}
	}
	return out
}

// findings describes objs from the index: missing, or another size.
func (p *Presence) findings(objs []Object) []Finding {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Finding, 0, len(objs))
	for _, o := range objs {
		s, ok := p.seen[o.Key]
		found := ok && s.size != absent
		if !found {
			s.size = 0
		}
		out = append(out, Finding{Object: o, Found: found, Stored: s.size})
	}
	return out
}

// absent is the size the index records for an object a listing looked
// for and did not find.
const absent = -1

// refresh lists the prefix, unless a listing started since cutoff already
// looked for every object of want, and replaces the index with what it
// found of want and of the objects observed since cutoff (an object of
// want it did not find is recorded as absent), keeping observations made
// while it ran. The index holds only objects asked about: a job's prefix
// may hold millions of objects that this process never references, and
// keeping them all would cost ~150 bytes each.
func (p *Presence) refresh(ctx context.Context, cutoff time.Time, want []Object) error {
	p.refreshMu.Lock()
	defer p.refreshMu.Unlock()
	wanted := make(map[string]struct{}, len(want))
	for _, o := range want {
		wanted[o.Key] = struct{}{}
	}
	p.mu.Lock()
	covered := !p.listedAt.IsZero() && !p.listedAt.Before(cutoff)
	for _, o := range want {
		if s, ok := p.seen[o.Key]; !ok || s.at.Before(cutoff) {
			covered = false
			break
		}
	}
	for k, s := range p.seen {
		if !s.at.Before(cutoff) {
			wanted[k] = struct{}{}
		}
	}
	p.mu.Unlock()
	if covered {
		return nil
	}
	start := time.Now()
	listed := make(map[string]seenObject, len(wanted))
	err := p.store.List(ctx, p.prefix, func(o storage.ObjectInfo) error {
		if _, ok := wanted[o.Key]; ok {
			listed[o.Key] = seenObject{size: o.Size, at: start}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("list %s to confirm reused objects: %w", p.prefix, err)
	}
	for k := range wanted {
		if _, ok := listed[k]; !ok {
			listed[k] = seenObject{size: absent, at: start}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, s := range p.seen {
		if s.at.After(start) { // a Put or Stat newer than the listing wins
			listed[k] = s
		}
	}
	p.seen, p.listedAt = listed, start
	p.listings++
	return nil
}

// Indexed reports how many objects the index holds.
func (p *Presence) Indexed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.seen)
}

// statAll Stats every object of objs and reports those missing or of
// another size.
func (p *Presence) statAll(ctx context.Context, objs []Object) ([]Finding, error) {
	found := make([]*Finding, len(objs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(p.Concurrency, 1))
	for i, o := range objs {
		g.Go(func() error {
			at := time.Now()
			info, err := p.store.Stat(gctx, o.Key)
			switch {
			case errors.Is(err, storage.ErrNotFound):
				p.Forget(o.Key)
				found[i] = &Finding{Object: o}
			case err != nil:
				return fmt.Errorf("confirm reused object: %w", err)
			default:
				p.Saw(o.Key, info.Size, at)
				if info.Size != o.Size {
					found[i] = &Finding{Object: o, Found: true, Stored: info.Size}
				}
			}
			return nil
		})
	}
	err := g.Wait()
	p.mu.Lock()
	p.stats += len(objs)
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var out []Finding
	for _, f := range found {
		if f != nil {
			out = append(out, *f)
		}
	}
	return out, nil
}

// avoidRounds bounds the looks at GC's marks before a commit: a look that
// finds a marked object is followed by uploads and another look.
const avoidRounds = 4

// AvoidMarked makes sure the manifest of res names no object that a
// collection has marked for deletion (see gc.Guard). It looks at
// the marks; every object of res they name, reused or uploaded, is
// uploaded again from the snapshot under a fresh key (manifests.FreshKey)
// and counted as uploaded; then it looks again, until a look finds nothing
// to replace. It returns that last look: the caller commits with
// gc.CommitHeld, within the look's validity.
func AvoidMarked(ctx context.Context, req Request, res *Result, g *gc.Guard) (*gc.Hold, error) {
	for range avoidRounds {
		hold, err := g.Check(ctx)
		if err != nil {
			return nil, fmt.Errorf("read gc marks before commit: %w", err)
		}
		byKey := map[string][]int{}
		var order []string
		for i, f := range res.Files {
			if f.Key != "" && hold.Pending(f.Key) {
				if byKey[f.Key] == nil {
					order = append(order, f.Key)
				}
				byKey[f.Key] = append(byKey[f.Key], i)
			}
		}
		if len(order) == 0 {
			return hold, nil
		}
		used := make(map[string]bool, len(res.Files))
		for _, f := range res.Files {
			used[f.Key] = true
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(max(req.Concurrency, 1))
		var mu sync.Mutex
		for _, key := range order {
			// The fresh key extends the file's usual key (the marked one
			// may be a fresh key already).
			f := res.Files[byKey[key][0]]
			usual := manifests.SharedKey(req.Job, f.Digest(), f.Size)
			if f.Kind == manifests.Private {
				usual = manifests.PrivateKey(req.Job, req.Task, req.Checkpoint, f.Name)
			}
			fresh := manifests.FreshKey(usual)
			for used[fresh] {
				fresh = manifests.FreshKey(usual)
			}
			used[fresh] = true
			idx := byKey[key]
			g.Go(func() error {
				f := res.Files[idx[0]]
				var lf localrecovery.File
				for _, x := range req.Snapshot.Files {
					if x.Name == f.Name {
						lf = x
					}
				}
				// Verified as it goes: the new object is the bytes f names.
				if _, err := putSnapshotFile(gctx, req.Store, fresh, req.Snapshot, lf, 0, f.Digest()); err != nil {
					return fmt.Errorf("upload %s under a new key (%s is marked for deletion): %w", f.Name, key, err)
				}
				if f.Kind == manifests.Shared {
					req.Presence.Saw(fresh, f.Size, time.Now())
				}
				mu.Lock()
				defer mu.Unlock()
				res.BytesWritten += f.Size
				for _, i := range idx {
					res.Files[i].Key = fresh
					if !res.Files[i].Uploaded {
						res.Files[i].Uploaded = true
						res.FilesReused--
						res.FilesUploaded++
					}
				}
				res.Rekeyed = append(res.Rekeyed, key)
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("objects kept being marked for deletion while the checkpoint stored them under new keys")
}
