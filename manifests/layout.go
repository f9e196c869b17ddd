package manifests

import (
	"fmt"
	"strconv"
	"strings"
)

// The storage layout of a job, under the store's prefix:
//
//	<job>/shared/<hh>/<sha256>-<size>          shared files, content-addressed
//	<job>/tasks/<task>/chk/<N:020>/manifest    written last: the checkpoint exists iff it does
//	<job>/tasks/<task>/chk/<N:020>/retired     retention marker; its time starts the GC grace
//	<job>/tasks/<task>/chk/<N:020>/private/<name>
//
// <hh> is the first two hex digits of the hash, which spreads shared objects
// over key prefixes (S3 partitions its index by prefix).

// SharedPrefix is the prefix of every shared object of a job.
func SharedPrefix(job string) string { return job + "/shared/" }

// SharedKey is the content address of a shared file.
func SharedKey(job, sha string, size int64) string {
	if len(sha) < 2 {
		return SharedPrefix(job) + "xx/" + ContentID(sha, size)
	}
	return SharedPrefix(job) + sha[:2] + "/" + ContentID(sha, size)
}

// TasksPrefix is the prefix of every task's checkpoints of a job.
func TasksPrefix(job string) string { return job + "/tasks/" }

// TaskPrefix is the prefix of one task's checkpoints.
func TaskPrefix(job, task string) string { return TasksPrefix(job) + task + "/chk/" }

// CheckpointPrefix is the prefix of one checkpoint's objects.
func CheckpointPrefix(job, task string, n uint64) string {
	return fmt.Sprintf("%s%020d/", TaskPrefix(job, task), n)
}

// ManifestKey is where checkpoint n's manifest lives.
func ManifestKey(job, task string, n uint64) string {
	return CheckpointPrefix(job, task, n) + "manifest"
}

// RetiredKey is the retention marker of checkpoint n.
func RetiredKey(job, task string, n uint64) string { return CheckpointPrefix(job, task, n) + "retired" }

// PrivateKey is where a private file of checkpoint n lives when not inline.
func PrivateKey(job, task string, n uint64, name string) string {
	return CheckpointPrefix(job, task, n) + "private/" + name
}

// keyKind is what a key under <job>/tasks/ is.
type keyKind int

const (
	keyOther keyKind = iota
	keyManifest
	keyRetired
	keyPrivate
)

// parseTaskKey splits a key under TasksPrefix(job) into task, checkpoint
// number and kind. Keys that do not fit the layout return keyOther.
func parseTaskKey(job, key string) (task string, n uint64, kind keyKind) {
	rest, ok := strings.CutPrefix(key, TasksPrefix(job))
	if !ok {
		return "", 0, keyOther
	}
	parts := strings.SplitN(rest, "/", 5)
	if len(parts) < 4 || parts[1] != "chk" || len(parts[2]) != 20 {
		return "", 0, keyOther
	}
	n, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil || n == 0 {
		return "", 0, keyOther
	}
	switch {
	case len(parts) == 4 && parts[3] == "manifest":
		return parts[0], n, keyManifest
	case len(parts) == 4 && parts[3] == "retired":
		return parts[0], n, keyRetired
	case len(parts) == 5 && parts[3] == "private":
		return parts[0], n, keyPrivate
	}
	return parts[0], n, keyOther
}
