package manifests

import (
	"context"
	"fmt"
	"io"

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
	type want struct {
		key, digest string
		size        int64
	}
	type ref struct {
		m *Manifest
		f File
	}
	refs := map[want][]ref{}
	var order []want
	for _, m := range ms {
		for _, f := range m.Files {
			if f.Key == "" {
				continue // inline: checked with the manifest's own checksum
			}
			w := want{f.Key, f.Digest(), f.Size}
			if refs[w] == nil {
				order = append(order, w)
			}
			refs[w] = append(refs[w], ref{m, f})
		}
	}
	if parallelism < 1 {
		parallelism = 4
	}
	msgs := make([]string, len(order))
	read := make([]int64, len(order))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallelism)
	for i, w := range order {
		g.Go(func() error {
			read[i], msgs[i] = checkObject(gctx, s, refs[w][0].f)
			return gctx.Err()
		})
	}
	if err := g.Wait(); err != nil {
		return nil, 0, 0, err
	}
	for i, w := range order {
		bytes += read[i]
		if msgs[i] == "" {
			continue
		}
		for _, r := range refs[w] {
			problems = append(problems, Problem{Task: r.m.Task, Checkpoint: r.m.Checkpoint, File: r.f.Name, Key: r.f.Key, Problem: msgs[i]})
		}
	}
	return problems, len(order), bytes, nil
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
