package bench

import (
	"context"
	"strings"

	"github.com/ckpt-io/ckpt/agent"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// fullAgent is the baseline of the incremental section: an in-process agent
// that uploads every file of every checkpoint, as a full checkpoint does.
//
// An agent reuses only the objects its task's earlier, retained manifests
// confirm: those it read from storage when it first saw the task, and those
// it committed since. So each checkpoint goes to a fresh incarnation of the
// agent (same job, task, local dir and storage connections) that does not
// see the task's manifests in storage: nothing is confirmed and every file
// is uploaded. What it keeps is what the incremental agent keeps too: the
// local copy of the task's previous checkpoint, and with it the hashes of
// the files it already holds (inode identity), so that the two agents
// differ only in what they upload. Starting and stopping the incarnations
// is not timed.
type fullAgent struct {
	r     *run
	name  string
	count *counting     // the bytes written: FullBytesWritten
	store storage.Store // count, with the task's manifests hidden from listings
}

// startFullAgent opens the storage of the full-upload agent called name.
func (r *run) startFullAgent(ctx context.Context, name string) (*fullAgent, error) {
	c, err := r.openCounting(ctx)
	if err != nil {
		return nil, err
	}
	return &fullAgent{r: r, name: name, count: c,
		store: &hideTask{Store: c, prefix: manifests.TaskPrefix(r.jobName(name), task)}}, nil
}

// send checkpoints dir as checkpoint n of the bench's task through a fresh
// incarnation of the agent.
func (f *fullAgent) send(ctx context.Context, n uint64, dir string) (sent, error) {
	// No job-wide GC sweeps: each incarnation would start one at its first
	// checkpoint, and through this store none of the task's manifests
	// would keep an object.
	p, err := f.r.startAgentOn(ctx, f.name, f.count, f.store, agent.Config{GCInterval: -1})
	if err != nil {
		return sent{}, err
	}
	defer p.stop()
	return send(ctx, p, task, n, dir, true)
}

func (f *fullAgent) close() { f.count.Close() }

// hideTask is a storage decorator whose listings of one task's checkpoints
// (exactly prefix, manifests.TaskPrefix) are empty: an agent reading the
// task's manifests when it first sees it finds none. Everything else,
// writes included, goes to the wrapped store.
type hideTask struct {
	storage.Store
	prefix string
}

var _ storage.Store = (*hideTask)(nil)

func (h *hideTask) List(ctx context.Context, prefix string, fn func(storage.ObjectInfo) error) error {
	if prefix == h.prefix {
		return nil
	}
	if prefix == strings.TrimSuffix(h.prefix, "chk/") {
		// The task's whole root (ownership records and checkpoints): the
		// ownership records show, the checkpoints stay hidden.
		return h.Store.List(ctx, prefix, func(o storage.ObjectInfo) error {
			if strings.HasPrefix(o.Key, h.prefix) {
				return nil
			}
			return fn(o)
		})
	}
	return h.Store.List(ctx, prefix, fn)
}

// Unwrap lets callers reach the wrapped store's optional interfaces.
func (h *hideTask) Unwrap() storage.Store { return h.Store }
