package manifests

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/storage"
)

// Problem is one thing wrong with a stored checkpoint.
type Problem struct {
	Task       string `json:"task"`
	Checkpoint uint64 `json:"checkpoint"`
	File       string `json:"file,omitempty"`
	Key        string `json:"key,omitempty"`
	Problem    string `json:"problem"`
}

func (p Problem) String() string {
	if p.File == "" {
		return fmt.Sprintf("%s checkpoint %d: %s", p.Task, p.Checkpoint, p.Problem)
	}
	return fmt.Sprintf("%s checkpoint %d: file %s (object %s): %s", p.Task, p.Checkpoint, p.File, p.Key, p.Problem)
}

// Verify reads every object m references and checks its size and SHA-256
// against the manifest, with up to parallelism reads at once. It returns
// the problems found; err is only for failures to run at all (ctx).
func Verify(ctx context.Context, s storage.Store, m *Manifest, parallelism int) ([]Problem, int64, error) {
	problems, _, n, err := VerifyAll(ctx, s, []*Manifest{m}, parallelism)
	return problems, n, err
}

// VerifyAll reads every object the manifests reference once, however many
// of them reference it (a shared object of an incremental job is named by
// every retained checkpoint), and checks its size and SHA-256 against each
// manifest that names it. A problem is reported for every manifest and
// file that names a bad object. objects is the number of distinct objects
// read, bytes what was read; err is only for failures to run at all.
func VerifyAll(ctx context.Context, s storage.Store, ms []*Manifest, parallelism int) (problems []Problem, objects int, bytes int64, err error) {
	v := NewVerifier(s, parallelism)
	for _, m := range ms {
		p, err := v.Check(ctx, m)
		if err != nil {
			return nil, 0, 0, err
		}
		problems = append(problems, p...)
	}
	return problems, v.Objects, v.Bytes, nil
}

// Verifier checks the objects of manifests given one at a time, reading
// each distinct object (key, size and checksum) once across all of them:
// a caller can load, check and drop the manifests of a job one by one, and
// its memory holds one manifest and 16 bytes per object checked, not every
// manifest at once.
type Verifier struct {
	s           storage.Store
	parallelism int
	checked     *keySet
	bad         map[string]string // identity of a bad object -> its problem
	// Objects is the number of distinct objects read so far, Bytes what
	// was read.
	Objects int
	Bytes   int64
}

// NewVerifier returns a Verifier reading from s, up to parallelism
// objects at once (4 when < 1).
func NewVerifier(s storage.Store, parallelism int) *Verifier {
	if parallelism < 1 {
		parallelism = 4
	}
	return &Verifier{s: s, parallelism: parallelism, checked: newKeySet(), bad: map[string]string{}}
}

// identity names what is checked of an object: key, size and checksum.
func identity(f File) string {
	return f.Key + "\x00" + f.Digest() + "\x00" + strconv.FormatInt(f.Size, 10)
}

// Check reads the objects of m not read before by v and checks their size
// and digest; it returns a problem for every file of m naming a bad
// object, read now or before. err is only for failures to run at all.
func (v *Verifier) Check(ctx context.Context, m *Manifest) ([]Problem, error) {
	problems, _, err := v.check(ctx, m.Task, m.Checkpoint, func(fn func(File) error) error {
		for _, f := range m.Files {
			if err := fn(f); err != nil {
				return err
			}
		}
		return nil
	})
	return problems, err
}

// CheckRef is Check for the manifest ref names, read from v's store and
// walked (see Walk) instead of decoded: memory holds the manifest as
// stored and the objects being read, not its decoded files. A manifest
// that cannot be read or used is one problem of its own; err is only for
// failures to run at all (ctx).
func (v *Verifier) CheckRef(ctx context.Context, job string, ref Ref) ([]Problem, error) {
	unusable := func(err error) []Problem {
		return []Problem{{Task: ref.Task, Checkpoint: ref.Checkpoint, Problem: err.Error()}}
	}
	data, key, err := readRef(ctx, v.s, job, ref)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return unusable(err), nil
	}
	problems, werr, err := v.check(ctx, ref.Task, ref.Checkpoint, func(fn func(File) error) error {
		_, _, err := walkStored(data, key, job, ref, func(fv *FileView) error { return fn(fv.File()) })
		return err
	})
	if err != nil {
		return nil, err
	}
	if werr != nil {
		problems = append(unusable(werr), problems...)
	}
	return problems, nil
}

// check reads the objects of the files each hands to its function that v
// has not read before, up to v.parallelism at once, then returns a problem
// for every file naming a bad object, read now or before (each is called
// a second time for those, only when v knows a bad object). walkErr is
// each's own error (a manifest found unusable part way), err a failure to
// run at all.
func (v *Verifier) check(ctx context.Context, task string, n uint64, each func(func(File) error) error) (problems []Problem, walkErr, err error) {
	var mu sync.Mutex
	var read int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(v.parallelism)
	walkErr = each(func(f File) error {
		if f.Key == "" {
			return nil // inline: checked with the manifest's own checksum
		}
		id := identity(f)
		if v.checked.has(id) {
			return nil
		}
		v.checked.add(id)
		v.Objects++
		g.Go(func() error {
			n, msg := checkObject(gctx, v.s, f)
			mu.Lock()
			defer mu.Unlock()
			read += n
			if msg != "" {
				v.bad[id] = msg
			}
			return gctx.Err()
		})
		return gctx.Err()
	})
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	v.Bytes += read
	if len(v.bad) == 0 {
		return nil, walkErr, nil
	}
	each(func(f File) error {
		if msg, ok := v.bad[identity(f)]; ok && f.Key != "" {
			problems = append(problems, Problem{Task: task, Checkpoint: n, File: f.Name, Key: f.Key, Problem: msg})
		}
		return nil
	})
	return problems, walkErr, nil
}

func checkObject(ctx context.Context, s storage.Store, f File) (int64, string) {
	rc, err := s.Get(ctx, f.Key)
	if err != nil {
		return 0, fmt.Sprintf("missing or unreadable: %v", err)
	}
	defer rc.Close()
	h := f.NewHasher()
	n, err := io.Copy(h, rc)
	if err != nil {
		return n, fmt.Sprintf("read failed after %d bytes: %v", n, err)
	}
	if n != f.Size {
		return n, fmt.Sprintf("size %d, manifest says %d", n, f.Size)
	}
	if err := f.Check(h.Digest()); err != nil {
		return n, err.Error()
	}
	return n, ""
}
