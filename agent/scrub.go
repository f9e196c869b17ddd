package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"golang.org/x/time/rate"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/uploader"
)

// scrubPause is the rest between two scrub passes.
var scrubPause = time.Minute

// scrubChunk is the most bytes the scrub reads between two waits on its
// rate limiter.
const scrubChunk = 64 << 10

// ScrubReport counts what one scrub pass found and did.
type ScrubReport struct {
	Objects, OK, Corrupt, Missing, Healed, Unhealed, Errors int
	Bytes                                                   int64
}

// scrubs runs scrub passes, at most Config.ScrubRate bytes per second of
// reads from storage, until ctx is done.
//
// The size check before a commit cannot see bytes changed in place; the
// scrub can: it re-reads and re-hashes every live object (of the job's
// retained manifests, every task) over time. A corrupt or missing object
// whose bytes a local copy of this agent holds is written again, under the
// same content-addressed key; one it cannot heal is reported
// (ckpt_scrub_objects_total{result="unhealed"} and an error log line).
func (a *Agent) scrubs(ctx context.Context) {
	defer a.jobs.Done()
	lim := newScrubLimiter(a.cfg.ScrubRate)
	for {
		rep, err := a.scrubPass(ctx, lim)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			a.log.Warn("scrub", "err", err)
		default:
			a.log.Info("scrub pass", "objects", rep.Objects, "bytes", rep.Bytes, "ok", rep.OK, "corrupt", rep.Corrupt,
				"missing", rep.Missing, "healed", rep.Healed, "unhealed", rep.Unhealed, "errors", rep.Errors)
		}
		t := time.NewTimer(scrubPause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// newScrubLimiter paces reads at bytesPerS, in bursts of at most one
// chunk: a pass never reads ahead of its rate by more than that.
func newScrubLimiter(bytesPerS int64) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(bytesPerS), int(max(min(bytesPerS, scrubChunk), 1)))
}

// scrubPass checks every live object of the job once, in key order.
func (a *Agent) scrubPass(ctx context.Context, lim *rate.Limiter) (ScrubReport, error) {
	var rep ScrubReport
	live, err := a.liveObjects(ctx)
	if err != nil {
		return rep, err
	}
	keys := make([]string, 0, len(live))
	for k := range live {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		a.scrubObject(ctx, lim, live[k], &rep)
	}
	return rep, ctx.Err()
}

// liveObjects maps the key of every object the job's retained manifests
// reference to one file that names it.
func (a *Agent) liveObjects(ctx context.Context) (map[string]manifests.File, error) {
	cat, err := manifests.Scan(ctx, a.cfg.Store, a.cfg.Job, "")
	if err != nil {
		return nil, err
	}
	live := map[string]manifests.File{}
	for _, r := range cat.Retained("") {
		m, err := manifests.LoadRef(ctx, a.cfg.Store, a.cfg.Job, r)
		if err != nil {
			if errors.Is(err, storage.ErrNotFound) {
				continue // retired and collected meanwhile
			}
			return nil, err
		}
		for _, f := range m.Files {
			if f.Key != "" {
				live[f.Key] = f
			}
		}
	}
	return live, nil
}

// scrubObject reads f's object back at the limiter's pace, checks its size
// and hash, and heals it from a local copy when it is corrupt or missing.
func (a *Agent) scrubObject(ctx context.Context, lim *rate.Limiter, f manifests.File, rep *ScrubReport) {
	rep.Objects++
	at := time.Now()
	n, problem, err := readBack(ctx, a.cfg.Store, lim, f)
	rep.Bytes += n
	var result string
	switch {
	case err != nil:
		if ctx.Err() == nil {
			rep.Errors++
			a.log.Warn("scrub: read failed", "key", f.Key, "err", err)
		}
		a.cfg.Telemetry.ScrubObject(ctx, "error", n)
		return
	case problem == "":
		rep.OK++
		a.presence.Saw(f.Key, f.Size, at)
		a.cfg.Telemetry.ScrubObject(ctx, "ok", n)
		return
	case problem == "missing":
		rep.Missing++
		result = "missing"
	default:
		rep.Corrupt++
		result = "corrupt"
	}
	a.presence.Forget(f.Key)
	a.cfg.Telemetry.ScrubObject(ctx, result, n)
	a.log.Warn("scrub: object "+result, "key", f.Key, "file", f.Name, "problem", problem)
	path, herr := a.heal(ctx, f)
	if herr != nil {
		rep.Unhealed++
		a.cfg.Telemetry.ScrubObject(ctx, "unhealed", 0)
		a.log.Error("scrub: object not healed: checkpoints referencing it cannot restore it from storage",
			"key", f.Key, "file", f.Name, "problem", problem, "err", herr)
		return
	}
	rep.Healed++
	a.presence.Saw(f.Key, f.Size, time.Now())
	a.cfg.Telemetry.ScrubObject(ctx, "healed", 0)
	a.log.Warn("scrub: object healed from the local copy", "key", f.Key, "from", path)
}

// readBack reads the object of f whole, waiting on lim before each chunk,
// and says what is wrong with it ("" when nothing, "missing" when it does
// not exist). err is for failures to read at all.
func readBack(ctx context.Context, s storage.Store, lim *rate.Limiter, f manifests.File) (int64, string, error) {
	rc, err := s.Get(ctx, f.Key)
	if errors.Is(err, storage.ErrNotFound) {
		return 0, "missing", nil
	}
	if err != nil {
		return 0, "", err
	}
	defer rc.Close()
	h := f.NewHasher()
	n, err := io.CopyBuffer(h, &limitedReader{ctx: ctx, r: rc, lim: lim}, make([]byte, scrubChunk))
	if err != nil {
		return n, "", err
	}
	if n != f.Size {
		return n, fmt.Sprintf("size %d, manifest says %d", n, f.Size), nil
	}
	if err := f.Check(h.Digest()); err != nil {
		return n, err.Error(), nil
	}
	return n, "", nil
}

// limitedReader waits on lim for every chunk it returns.
type limitedReader struct {
	ctx context.Context
	r   io.Reader
	lim *rate.Limiter
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if len(p) > scrubChunk {
		p = p[:scrubChunk]
	}
	if len(p) > l.lim.Burst() {
		p = p[:l.lim.Burst()]
	}
	n, err := l.r.Read(p)
	if n > 0 {
		if werr := l.lim.WaitN(l.ctx, n); werr != nil {
			return n, werr
		}
	}
	return n, err
}

// heal writes f's object again from a local copy of this agent holding
// the same content (size and hash, verified by hashing before and
// during the upload), and returns the local file used. The local store
// keeps the latest complete checkpoint of each task.
func (a *Agent) heal(ctx context.Context, f manifests.File) (string, error) {
	entries, err := os.ReadDir(a.local.Root())
	if err != nil {
		return "", fmt.Errorf("local store: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || manifests.ValidName("task", e.Name()) != nil {
			continue
		}
		l, err := a.local.Latest(e.Name())
		if err != nil || l == nil {
			continue
		}
		for _, lf := range l.Manifest.Files {
			if lf.Size != f.Size || lf.Digest() != f.Digest() {
				continue
			}
			p := l.Path(lf.Name)
			if err := uploader.PutVerified(ctx, a.cfg.Store, f.Key, p, f.Size, f.Digest()); err != nil {
				errs = append(errs, err)
				continue
			}
			return p, nil
		}
	}
	if len(errs) == 0 {
		return "", errors.New("no local copy holds its content")
	}
	return "", fmt.Errorf("no intact local copy: %w", errors.Join(errs...))
}
