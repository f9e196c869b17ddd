package manifests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	if parallelism < 1 {
		parallelism = 4
	}
	problems := make([]*Problem, len(m.Files))
	read := make([]int64, len(m.Files))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallelism)
	for i, f := range m.Files {
		if f.Key == "" {
			continue // inline: checked with the manifest's own checksum
		}
		g.Go(func() error {
			n, msg := checkObject(gctx, s, f)
			read[i] = n
			if msg != "" {
				problems[i] = &Problem{Task: m.Task, Checkpoint: m.Checkpoint, File: f.Name, Key: f.Key, Problem: msg}
			}
			return gctx.Err()
		})
	}
	if err := g.Wait(); err != nil {
		return nil, 0, err
	}
	var out []Problem
	var total int64
	for i, p := range problems {
		total += read[i]
		if p != nil {
			out = append(out, *p)
		}
	}
	return out, total, nil
}

func checkObject(ctx context.Context, s storage.Store, f File) (int64, string) {
	rc, err := s.Get(ctx, f.Key)
	if err != nil {
		return 0, fmt.Sprintf("missing or unreadable: %v", err)
	}
	defer rc.Close()
	h := sha256.New()
	n, err := io.Copy(h, rc)
	if err != nil {
		return n, fmt.Sprintf("read failed after %d bytes: %v", n, err)
	}
	if n != f.Size {
		return n, fmt.Sprintf("size %d, manifest says %d", n, f.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 {
		return n, fmt.Sprintf("sha256 %s, manifest says %s", got, f.SHA256)
	}
	return n, ""
}
