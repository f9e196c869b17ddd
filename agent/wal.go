package agent

// WAL shipping between checkpoints (issue: RPO in seconds).
//
// A checkpoint request may name wal_dir, the live store's directory. The
// agent opens it when the request arrives, confined exactly as the
// snapshot dir is (resolveDir: inside an allowed root, through no
// symlink; in node-agent mode the directory must be the peer's, and every
// log the shipper opens must be the peer's uid's too: a log linked in
// later is checked when it is read, which a look at the request could not
// do). Once that checkpoint completes, the task's shipping loop rebases
// on it (wal.Shipper.Rebase: the WAL continues the snapshot's newest log
// where its copy ends) and ships a round every WALInterval, as the task's
// owner: a round commits only after a look at the ownership records, and
// a fenced shipper stops and fences the task. A completed checkpoint
// without wal_dir stops the task's shipping. Loops stop with the agent's
// Run context; none outlives Run.

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/internal/safefs"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/wal"
)

// walShips is an agent's WAL shipping: the dirs requests named, and one
// loop per task that ships.
type walShips struct {
	mu      sync.Mutex
	ctx     context.Context // Run's; nil until walStart, or once stopped
	stopped bool
	wg      sync.WaitGroup
	dirs    map[string]*walDir // per task: the wal_dir its latest request named
	loops   map[string]*walLoop
}

// walDir is a wal_dir as a request named it, opened and confined.
type walDir struct {
	path     string
	d        *safefs.Dir
	dev, ino uint64
	owner    *uint32 // node-agent mode: the peer's uid, owner of every log
}

func (w *walDir) same(o *walDir) bool { return w.dev == o.dev && w.ino == o.ino && w.path == o.path }

// walLoop ships one task's WAL.
type walLoop struct {
	dir    *walDir
	cancel context.CancelFunc
	done   chan struct{}
	rebase chan walRebase // the newest checkpoint not applied yet (at most one)
}

type walRebase struct {
	n, epoch uint64
	logs     []wal.LogEnd
	at       time.Time
}

// walStart enables shipping under ctx (Run's) and stops every loop when
// ctx is done.
func (a *Agent) walStart(ctx context.Context) {
	if a.cfg.WALInterval < 0 {
		return
	}
	a.wal.mu.Lock()
	a.wal.ctx = ctx
	a.wal.mu.Unlock()
	a.jobs.Add(1)
	go func() {
		defer a.jobs.Done()
		<-ctx.Done()
		a.wal.mu.Lock()
		a.wal.stopped, a.wal.ctx = true, nil
		for task, l := range a.wal.loops {
			l.cancel()
			delete(a.wal.loops, task)
		}
		a.wal.mu.Unlock()
		a.wal.wg.Wait() // the loops close the dirs no request names any more
		a.wal.mu.Lock()
		for task, d := range a.wal.dirs {
			d.d.Close()
			delete(a.wal.dirs, task)
		}
		a.wal.mu.Unlock()
	}()
}

// walRequest opens the wal_dir of a checkpoint request, if it names one,
// as the task's WAL dir. A dir the peer may not name fails the request
// (false: the failed event is sent) before anything else happens.
func (a *Agent) walRequest(c *conn, req protocol.Request) bool {
	if req.Op != protocol.OpCheckpoint || req.WALDir == "" || a.cfg.WALInterval < 0 {
		return true
	}
	d, perr := a.resolveDir(req.WALDir)
	if perr != nil {
		perr.Message = "wal_dir: " + perr.Message
		c.send(failed(req, perr))
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstat(d.Fd(), &st); err != nil {
		d.Close()
		c.send(failed(req, errorf(protocol.CodeInternal, "wal_dir %s: %v", req.WALDir, err)))
		return false
	}
	w := &walDir{path: req.WALDir, d: d, dev: uint64(st.Dev), ino: st.Ino}
	if a.tenant != nil {
		uid := c.peer().UID
		if st.Uid != uid {
			d.Close()
			c.send(failed(req, errorf(protocol.CodeForbidden, "wal_dir %s is owned by uid %d, not by the peer's uid %d", req.WALDir, st.Uid, uid)))
			return false
		}
		w.owner = &uid
	}
	a.wal.mu.Lock()
	defer a.wal.mu.Unlock()
	if a.wal.stopped {
		d.Close()
		return true
	}
	if a.wal.dirs == nil {
		a.wal.dirs = map[string]*walDir{}
	}
	if old := a.wal.dirs[req.Task]; old != nil && !a.walInUse(old) {
		old.d.Close()
	}
	a.wal.dirs[req.Task] = w
	// The loop holds the store's logs open from now on (Shipper.Track):
	// the snapshot's newest log is then continued after the commit even
	// if the engine deleted it meanwhile. It ships once the checkpoint
	// completes.
	if a.wal.loops[req.Task] == nil && a.wal.ctx != nil {
		a.mu.Lock()
		t := a.taskLocked(req.Task)
		fenced := a.txn.Status(req.Task).Fenced
		a.mu.Unlock()
		if fenced == nil {
			a.walLoopLocked(t, w)
		}
	}
	return true
}

// walLoopLocked starts t's shipping loop over dir (under a.wal.mu).
func (a *Agent) walLoopLocked(t *task, dir *walDir) *walLoop {
	ctx, cancel := context.WithCancel(a.wal.ctx)
	l := &walLoop{dir: dir, cancel: cancel, done: make(chan struct{}), rebase: make(chan walRebase, 1)}
	if a.wal.loops == nil {
		a.wal.loops = map[string]*walLoop{}
	}
	a.wal.loops[t.name] = l
	a.wal.wg.Add(1)
	go a.walLoop(ctx, t, l)
	return l
}

// walInUse reports whether a loop ships from w (under a.wal.mu).
func (a *Agent) walInUse(w *walDir) bool {
	for _, l := range a.wal.loops {
		if l.dir == w {
			return true
		}
	}
	return false
}

// walCheckpointed rebases the task's WAL on ck, just completed: shipping
// (re)starts from ck's snapshot when its request named a wal_dir, and
// stops when it did not.
func (a *Agent) walCheckpointed(ck *flight) {
	if a.cfg.WALInterval < 0 {
		return
	}
	task, n := ck.req.Task, ck.req.Checkpoint
	if ck.req.WALDir == "" {
		a.walStop(task)
		return
	}
	epoch := ck.epoch
	if a.txn.Status(task).Fenced != nil || epoch == 0 {
		a.walStop(task)
		return
	}
	// Where the snapshot's copies of the logs end: read now, while the
	// snapshot is the task's newest local copy.
	var logs []wal.LogEnd
	for _, f := range ck.snap.Files {
		if _, ok := wal.ParseLogName(f.Name); !ok {
			continue
		}
		r, err := ck.snap.Open(f)
		if err != nil {
			a.log.Warn("wal shipping stops until the next checkpoint: cannot read the snapshot's copy of a log", "task", task, "checkpoint", n, "log", f.Name, "err", err)
			a.walStop(task)
			return
		}
		l, err := wal.ScanCopy(r, f.Name, f.Size)
		r.Close()
		if err != nil {
			a.log.Warn("wal shipping stops until the next checkpoint", "task", task, "checkpoint", n, "err", err)
			a.walStop(task)
			return
		}
		logs = append(logs, l)
	}
	rb := walRebase{n: n, epoch: epoch, logs: logs, at: ck.start}

	a.wal.mu.Lock()
	defer a.wal.mu.Unlock()
	if a.wal.ctx == nil {
		return // not running, or stopping
	}
	dir := a.wal.dirs[task]
	if dir == nil || dir.path != ck.req.WALDir {
		a.log.Warn("wal shipping stops: the task's latest wal_dir is not the one this checkpoint named", "task", task, "checkpoint", n, "wal_dir", ck.req.WALDir)
		a.walStopLocked(task)
		return
	}
	l := a.wal.loops[task]
	if l != nil && l.dir != dir && !l.dir.same(dir) {
		a.walStopLocked(task)
		l = nil
	}
	if l == nil {
		l = a.walLoopLocked(ck.t, dir)
	}
	select { // the newest checkpoint wins
	case <-l.rebase:
	default:
	}
	l.rebase <- rb
}

// walStop stops the task's shipping, if it ships.
func (a *Agent) walStop(task string) {
	a.wal.mu.Lock()
	defer a.wal.mu.Unlock()
	a.walStopLocked(task)
}

func (a *Agent) walStopLocked(task string) {
	if l := a.wal.loops[task]; l != nil {
		l.cancel()
		delete(a.wal.loops, task)
		a.cfg.Telemetry.WALStopped(task)
	}
}

// walLoop ships t's WAL every WALInterval until ctx is done or the task's
// owner is fenced. It owns l.dir until it returns.
func (a *Agent) walLoop(ctx context.Context, t *task, l *walLoop) {
	defer a.wal.wg.Done()
	defer close(l.done)
	defer func() {
		a.wal.mu.Lock()
		if a.wal.dirs[t.name] != l.dir {
			l.dir.d.Close() // replaced since: no request names it any more
		}
		a.wal.mu.Unlock()
	}()
	sh := wal.NewShipper(wal.ShipperConfig{Store: a.cfg.Store, Job: a.cfg.Job, Task: t.name, Dir: l.dir.d.File(),
		MaxSegment: a.cfg.WALSegmentBytes, Owner: l.dir.owner, Agent: a.agentID, Node: a.cfg.Node})
	defer sh.Close()
	if err := sh.Track(); err != nil {
		a.log.Warn("wal: read the store dir", "task", t.name, "err", err)
	}
	// A log appearing (the engine rotated) ships the sealed one at once,
	// before the engine deletes or recycles it.
	rotated, stopWatch, err := wal.Watch(l.dir.d.File())
	if err != nil {
		a.log.Warn("wal: cannot watch the store dir; rounds run on --wal-interval only", "task", t.name, "err", err)
	} else {
		defer stopWatch()
	}
	tick := time.NewTicker(a.cfg.WALInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case f := <-rotated:
			sh.Adopt(f)
			for more := true; more; { // every log the watch opened meanwhile
				select {
				case f := <-rotated:
					sh.Adopt(f)
				default:
					more = false
				}
			}
		case rb := <-l.rebase:
			err := sh.Rebase(rb.n, rb.epoch, rb.logs)
			if errors.Is(err, manifests.ErrFenced) {
				a.walFenced(t, err)
				return
			}
			a.cfg.Telemetry.WALRebased(t.name, rb.n, rb.at)
			if err != nil {
				a.log.Warn("wal shipping cannot start for this checkpoint: the writes after it reach storage with the next checkpoint", "task", t.name, "checkpoint", rb.n, "err", err)
				a.cfg.Telemetry.WALEnded(ctx, t.name, err.Error(), false)
				continue
			}
			a.log.Debug("wal shipping follows the checkpoint", "task", t.name, "checkpoint", rb.n, "logs", len(rb.logs))
			continue
		case <-tick.C:
		}
		if n, ended := sh.Checkpoint(); n == 0 || ended != nil {
			if err := sh.Track(); err != nil {
				a.log.Warn("wal: read the store dir", "task", t.name, "err", err)
			}
			continue
		}
		r, err := sh.Ship(ctx)
		switch {
		case err == nil:
			a.cfg.Telemetry.WALShipped(ctx, t.name, r.Seq, r.Through, r.Bytes, r.Segments)
		case errors.Is(err, manifests.ErrFenced):
			a.walFenced(t, err)
			return
		case errors.Is(err, wal.ErrChainEnded):
			var g wal.Gap
			gap := errors.As(err, &g)
			a.log.Warn("wal shipping stopped until the next checkpoint: the writes after this point reach storage with it", "task", t.name, "checkpoint", r.Checkpoint, "gap", gap, "err", err)
			a.cfg.Telemetry.WALEnded(ctx, t.name, err.Error(), gap)
		case ctx.Err() != nil:
			return
		default:
			// Storage trouble: the round's records are shipped by the
			// next one; the lag grows meanwhile.
			a.log.Warn("wal round failed; the next one ships its records", "task", t.name, "checkpoint", r.Checkpoint, "err", err)
		}
	}
}

// walFenced stops t's shipping for good: a newer owner took the task.
func (a *Agent) walFenced(t *task, err error) {
	a.txn.Fence(t.name, err)
	a.log.Warn("wal shipping stopped: another agent owns the task now", "task", t.name, "err", err)
	a.wal.mu.Lock()
	if l := a.wal.loops[t.name]; l != nil {
		l.cancel()
		delete(a.wal.loops, t.name)
	}
	a.wal.mu.Unlock()
	a.cfg.Telemetry.WALStopped(t.name)
}
