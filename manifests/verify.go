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
	var todo []int // indexes into m.Files of objects read now
	var ids []string
	for i, f := range m.Files {
		if f.Key == "" {
			continue // inline: checked with the manifest's own checksum
		}
		id := identity(f)
		if v.checked.has(id) {
			continue
		}
		v.checked.add(id)
		todo = append(todo, i)
		ids = append(ids, id)
	}
	msgs := make([]string, len(todo))
	read := make([]int64, len(todo))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(v.parallelism)
	for j, i := range todo {
		g.Go(func() error {
			read[j], msgs[j] = checkObject(gctx, v.s, m.Files[i])
			return gctx.Err()
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for j := range todo {
		v.Bytes += read[j]
		if msgs[j] != "" {
			v.bad[ids[j]] = msgs[j]
		}
	}
	v.Objects += len(todo)
	var problems []Problem
	if len(v.bad) == 0 {
		return nil, nil
	}
	for _, f := range m.Files {
		if f.Key == "" {
			continue
		}
		if msg, ok := v.bad[identity(f)]; ok {
			problems = append(problems, Problem{Task: m.Task, Checkpoint: m.Checkpoint, File: f.Name, Key: f.Key, Problem: msg})
		}
	}
	return problems, nil
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
	var mu sync.Mutex
	var read int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(v.parallelism)
	_, _, werr := walkStored(data, key, job, ref, func(fv *FileView) error {
		if len(fv.Key) == 0 {
			return nil // inline: checked with the manifest's own checksum
		}
		f := fv.File()
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
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	v.Bytes += read
	problems := []Problem(nil)
	if werr != nil {
		problems = unusable(werr)
	}
	if len(v.bad) == 0 {
		return problems, nil
	}
	// The files of this manifest that name a bad object, read now or
	// before: a second walk of the manifest still in memory.
	_, _, _ = walkStored(data, key, job, ref, func(fv *FileView) error {
		if len(fv.Key) == 0 {
			return nil
		}
		f := fv.File()
		if msg, ok := v.bad[identity(f)]; ok {
			problems = append(problems, Problem{Task: ref.Task, Checkpoint: ref.Checkpoint, File: f.Name, Key: f.Key, Problem: msg})
		}
		return nil
	})
	return problems, nil
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
