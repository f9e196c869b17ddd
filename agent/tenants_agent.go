package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/internal/safefs"
	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/telemetry"
)

// TenantServices is what a tenant's core needs from outside the agent
// package: its store (opened once per distinct storage URL and shared by
// the tenants that name it), its restore and drill (see Config.Restore and
// Config.Drill; they must use the tenant's job, store and local dir), and
// its telemetry (nil records nothing).
type TenantServices struct {
	Store     storage.Store
	Restore   func(ctx context.Context, r RestoreRequest) (*restore.Result, error)
	Drill     func(ctx context.Context, task string) (*restore.DrillResult, error)
	Telemetry *telemetry.Telemetry
}

// newNode builds a node agent: one core Agent per tenant, each with the
// shared settings of cfg and the tenant's job, store, roots, retention and
// local dir (cfg.LocalDir/<tenant>), behind the node's one socket.
func newNode(cfg Config) (*Agent, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	tenants := append([]Tenant(nil), cfg.Tenants...)
	if err := CheckTenants(tenants); err != nil {
		return nil, fmt.Errorf("tenants: %w", err)
	}
	if !filepath.IsAbs(cfg.LocalDir) {
		return nil, fmt.Errorf("local dir %q is relative: give an absolute path", cfg.LocalDir)
	}
	front := cfg
	front.Tenants, front.TenantServices = nil, nil
	if front.Logger == nil {
		front.Logger = slog.New(slog.DiscardHandler)
	}
	if front.MaxConnections == 0 {
		front.MaxConnections = 256
	}
	if front.MaxConnections < 1 {
		return nil, fmt.Errorf("max connections must be at least 1, got %d", front.MaxConnections)
	}
	if front.IdleTimeout == 0 {
		front.IdleTimeout = 10 * time.Minute
	}
	if front.ShutdownGrace == 0 {
		front.ShutdownGrace = 30 * time.Second
	}
	a := &Agent{cfg: front, log: front.Logger, tasks: map[string]*task{}, ready: make(chan struct{})}
	for i := range tenants {
		t := &tenants[i]
		dir := filepath.Join(cfg.LocalDir, t.Name)
		svc, err := cfg.TenantServices(*t, dir)
		if err != nil {
			return nil, fmt.Errorf("tenant %s: %w", t.where(), err)
		}
		c := cfg
		c.Tenants, c.TenantServices = nil, nil
		c.Store, c.Job, c.LocalDir = svc.Store, t.Job, dir
		c.AllowRoots = append([]string(nil), t.AllowRoots...)
		c.Restore, c.Drill, c.Telemetry = svc.Restore, svc.Drill, svc.Telemetry
		if c.Drill == nil {
			c.DrillInterval = 0
		}
		if t.Retain > 0 {
			c.Retain = t.Retain
		}
		c.Logger = front.Logger.With("tenant", t.Name, "job", t.Job)
		core, err := New(c)
		if err != nil {
			return nil, fmt.Errorf("tenant %s: %w", t.where(), err)
		}
		core.tenant = t
		a.cores = append(a.cores, core)
	}
	return a, nil
}

// tenantOf picks the core of the peer's tenant, once, at accept: the one
// tenant whose credentials the peer matches. No match (or credentials that
// cannot be read) is forbidden, and nothing else is read.
func (a *Agent) tenantOf(p Peer, credErr error) (*Agent, *protocol.Error) {
	if credErr != nil {
		return nil, errorf(protocol.CodeForbidden, "cannot read the peer's credentials (%v): in node-agent mode they decide its tenant", credErr)
	}
	var cgroup string
	var cgErr error
	for _, c := range a.cores {
		if c.tenant.Cgroup != "" {
			cgroup, cgErr = peerCgroup(p.PID)
			break
		}
	}
	var found []*Agent
	for _, c := range a.cores {
		if c.tenant.matches(p, cgroup) {
			found = append(found, c)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		msg := fmt.Sprintf("uid %d gid %d matches no tenant of this node agent (--tenants)", p.UID, p.GID)
		if cgErr != nil {
			msg += fmt.Sprintf("; its cgroup could not be read: %v", cgErr)
		}
		return nil, errorf(protocol.CodeForbidden, "%s", msg)
	}
	// CheckTenants refuses overlapping tenants; a cgroup v2 path is one
	// path, so this cannot happen. Refuse rather than guess.
	return nil, errorf(protocol.CodeForbidden, "uid %d gid %d matches %d tenants", p.UID, p.GID, len(found))
}

// permit applies the job and task rules of the peer's tenant to a request,
// before anything is read: a job other than the agent's (or its tenant's)
// and, in node-agent mode, a task outside the tenant's pattern are
// forbidden. Directories are confined by resolveDir.
func (a *Agent) permit(req protocol.Request) *protocol.Error {
	if req.Op == "hello" {
		return nil
	}
	if req.Job != "" && req.Job != a.cfg.Job {
		if a.tenant != nil {
			return errorf(protocol.CodeForbidden, "tenant %s may use job %s only, not %s", a.tenant.Name, a.cfg.Job, req.Job)
		}
		return errorf(protocol.CodeForbidden, "this agent serves job %s only, not %s", a.cfg.Job, req.Job)
	}
	if a.tenant != nil && req.Task != "" && !a.tenant.match(req.Task) {
		return errorf(protocol.CodeForbidden, "tenant %s may not use task %s (its tasks pattern is %q)", a.tenant.Name, req.Task, a.tenant.Tasks)
	}
	return nil
}

// refused answers a request that permit refused: failed for the ops that
// answer with failed, else error.
func refused(req protocol.Request, e *protocol.Error) protocol.Event {
	ev := "error"
	if req.Op == "checkpoint" || req.Op == "restore" {
		ev = "failed"
	}
	return protocol.Event{Event: ev, ID: req.ID, Task: req.Task, Checkpoint: req.Checkpoint, Error: e}
}

// lexicallyInside reports, in node-agent mode, whether the cleaned path dir
// is inside one of the tenant's roots by name alone, as configured or as
// resolved, so that a directory plainly outside them is refused before
// anything is looked up on disk.
func (a *Agent) lexicallyInside(dir string) bool {
	dir = filepath.Clean(dir)
	for _, roots := range [][]string{a.tenant.AllowRoots, a.cfg.AllowRoots} {
		for _, r := range roots {
			r = filepath.Clean(r)
			if dir == r || r == "/" || strings.HasPrefix(dir, r+"/") {
				return true
			}
		}
	}
	return false
}

// checkOwner applies the tenant owner rule to a snapshot dir opened for the
// sync phase: the dir and every file in it must be owned by the peer's
// uid. It reads the entries and their inodes through the dir's fd
// (fstatat, no symlink followed), nothing else; a file owned by another
// uid (a hard link to another tenant's file) is forbidden before anything
// is linked. Snapshot.Inspect checks the linked inodes again against the
// dir's owner, which is then the peer's uid, so a file swapped after this
// check is refused there too.
func checkOwner(dir *safefs.Dir, uid uint32) *protocol.Error {
	var st unix.Stat_t
	if err := unix.Fstat(dir.Fd(), &st); err != nil {
		return errorf(protocol.CodeInternal, "snapshot dir %s: %v", dir.Path(), err)
	}
	if st.Uid != uid {
		return errorf(protocol.CodeForbidden, "snapshot dir %s is owned by uid %d, not by the peer's uid %d", dir.Path(), st.Uid, uid)
	}
	names, err := dirNames(dir.File())
	if err != nil {
		return errorf(protocol.CodeInternal, "read snapshot dir %s: %v", dir.Path(), err)
	}
	for _, name := range names {
		if err := unix.Fstatat(dir.Fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // gone: the sync phase says so
			}
			return errorf(protocol.CodeInternal, "snapshot file %s: %v", filepath.Join(dir.Path(), name), err)
		}
		if st.Uid != uid {
			return errorf(protocol.CodeForbidden, "snapshot file %s is owned by uid %d, not by the peer's uid %d (a hard link to another user's file?)", filepath.Join(dir.Path(), name), st.Uid, uid)
		}
	}
	return nil
}

// dirNames lists the names in the open directory f without moving the
// offset that later readers start from.
func dirNames(f *os.File) ([]string, error) {
	d, err := safefs.OpenDirAt(f, ".")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Readdirnames(-1)
}

// giveTo hands a restored target to the peer that asked for it, in
// node-agent mode: the agent created the directory and its files, and the
// tenant's app, running as another uid, must be able to open its store.
// The target is opened under its parent's fd, through no symlink, and
// changed only if it is still a directory of the agent's own uid: the peer
// can replace the target in its root, but cannot make a directory owned by
// the agent nor add entries to one, so every entry changed (fchownat, no
// symlink followed) is one the restore made. The directory itself is
// changed last, through its fd.
func giveTo(parent *os.File, name string, p Peer) error {
	d, err := safefs.OpenDirAt(parent, name)
	if err != nil {
		return err
	}
	defer d.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(d.Fd()), &st); err != nil {
		return err
	}
	if self := uint32(os.Geteuid()); st.Uid != self {
		return fmt.Errorf("%s is owned by uid %d, not by the agent (uid %d) that restored it: it was replaced", name, st.Uid, self)
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := unix.Fchownat(int(d.Fd()), n, int(p.UID), int(p.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return unix.Fchown(int(d.Fd()), int(p.UID), int(p.GID))
}
