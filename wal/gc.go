package wal

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// GC of WAL objects. The WAL of checkpoint n by epoch e (its manifests and
// segments) is a private part of checkpoint n: it lives while n's manifest
// by e is retained (or retired less than the grace ago), exactly like n's
// private files, and is garbage once that manifest is gone, expired or
// fenced. Garbage goes through GC's own marking and grace (consider), so a
// WAL being shipped right now, whose checkpoint the collection did not see
// yet, is younger than the grace and is kept.

// Sweep lists the WAL objects of job and passes every one that no live
// checkpoint holds to consider; live(task, n, epoch) says whether the
// manifest of checkpoint n by epoch keeps its objects alive.
func Sweep(ctx context.Context, s storage.Store, job string, live func(task string, n, epoch uint64) bool, consider func(storage.ObjectInfo) error) error {
	prefix := manifests.TasksPrefix(job)
	err := s.List(ctx, prefix, func(o storage.ObjectInfo) error {
		task, n, epoch, ok := parseKey(strings.TrimPrefix(o.Key, prefix))
		if !ok || live(task, n, epoch) {
			return nil
		}
		return consider(o)
	})
	if err != nil {
		return fmt.Errorf("gc: wal objects of job %s: %w", job, err)
	}
	return nil
}

// parseKey reads <task>/chk/<n:020>/wal[.e<epoch:020>]/<rest>, the key of
// a WAL object below the job's tasks prefix.
func parseKey(rest string) (task string, n, epoch uint64, ok bool) {
	parts := strings.SplitN(rest, "/", 5)
	if len(parts) != 5 || parts[1] != "chk" || len(parts[2]) != 20 || parts[4] == "" {
		return "", 0, 0, false
	}
	n, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil || n == 0 {
		return "", 0, 0, false
	}
	switch w := parts[3]; {
	case w == "wal":
	case strings.HasPrefix(w, "wal.e") && len(w) == 25:
		if epoch, err = strconv.ParseUint(w[5:], 10, 64); err != nil || epoch == 0 {
			return "", 0, 0, false
		}
	default:
		return "", 0, 0, false
	}
	return parts[0], n, epoch, true
}
