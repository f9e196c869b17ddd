package manifests

import (
	"fmt"
	"strconv"
	"strings"
)

// The storage layout of a job, under the store's prefix:
//
//	<job>/shared/<hh>/<sha256>-<size>          shared files, content-addressed (SHA-256)
//	<job>/shared/<hh>/b3-<blake3>-<size>       shared files, content-addressed (BLAKE3)
//	<job>/tasks/<task>/chk/<N:020>/manifest    written last: the checkpoint exists iff it does
//	<job>/tasks/<task>/chk/<N:020>/retired     retention marker of an agent without an epoch; its time starts the GC grace
//	<job>/tasks/<task>/chk/<N:020>/retired.e<epoch:020>      a retention marker written by (or for) the owner of epoch >= 1
//	<job>/tasks/<task>/chk/<N:020>/private/<name>
//	<job>/tasks/<task>/chk/<N:020>/manifest.e<epoch:020>     a manifest written by the owner of epoch >= 1
//	<job>/tasks/<task>/chk/<N:020>/private.e<epoch:020>/<name>
//	<job>/tasks/<task>/owner/<epoch:020>       ownership records (see owner.go)
//
// Manifests and private objects of epoch 0 (written before ownership
// existed) keep the legacy names. Those of an owner of epoch >= 1 carry the
// epoch in their key, so that a fenced writer of the same checkpoint number
// never takes the key its successor needs (see owner.go).
//
// <hh> is the first two hex digits of the hash, which spreads shared objects
// over key prefixes (S3 partitions its index by prefix).

// SharedPrefix is the prefix of every shared object of a job.
func SharedPrefix(job string) string { return job + "/shared/" }

// SharedKey is the content address of a shared file of the given digest
// (see digest.go) and size.
func SharedKey(job, digest string, size int64) string {
	h := hexOf(digest)
	if len(h) < 2 {
		return SharedPrefix(job) + "xx/" + ContentID(digest, size)
	}
	return SharedPrefix(job) + h[:2] + "/" + ContentID(digest, size)
}

// TasksPrefix is the prefix of every task's checkpoints of a job.
func TasksPrefix(job string) string { return job + "/tasks/" }

// TaskRoot is the prefix of everything of one task: checkpoints and
// ownership records.
func TaskRoot(job, task string) string { return TasksPrefix(job) + task + "/" }

// TaskPrefix is the prefix of one task's checkpoints.
func TaskPrefix(job, task string) string { return TaskRoot(job, task) + "chk/" }

// OwnerPrefix is the prefix of one task's ownership records.
func OwnerPrefix(job, task string) string { return TaskRoot(job, task) + "owner/" }

// OwnerKey is where the ownership record of epoch lives.
func OwnerKey(job, task string, epoch uint64) string {
	return fmt.Sprintf("%s%020d", OwnerPrefix(job, task), epoch)
}

// CheckpointPrefix is the prefix of one checkpoint's objects.
func CheckpointPrefix(job, task string, n uint64) string {
	return fmt.Sprintf("%s%020d/", TaskPrefix(job, task), n)
}

// ManifestKey is where checkpoint n's manifest lives.
func ManifestKey(job, task string, n uint64) string {
	return CheckpointPrefix(job, task, n) + "manifest"
}

// ManifestKeyOf is where the manifest of checkpoint n written by the owner
// of epoch lives: ManifestKey for epoch 0, manifest.e<epoch:020> beside it
// otherwise.
func ManifestKeyOf(job, task string, n, epoch uint64) string {
	if epoch == 0 {
		return ManifestKey(job, task, n)
	}
	return fmt.Sprintf("%smanifest.e%020d", CheckpointPrefix(job, task, n), epoch)
}

// RetiredKey is the retention marker of checkpoint n written without an
// epoch (by a writer that owns nothing, or by an agent older than epoch
// markers; see Scan for how such a marker is read).
func RetiredKey(job, task string, n uint64) string { return CheckpointPrefix(job, task, n) + "retired" }

// RetiredKeyOf is the retention marker of checkpoint n written by the
// owner of epoch: RetiredKey for epoch 0, retired.e<epoch:020> beside it
// otherwise.
func RetiredKeyOf(job, task string, n, epoch uint64) string {
	if epoch == 0 {
		return RetiredKey(job, task, n)
	}
	return fmt.Sprintf("%sretired.e%020d", CheckpointPrefix(job, task, n), epoch)
}

// PrivateKey is where a private file of checkpoint n lives when not inline.
func PrivateKey(job, task string, n uint64, name string) string {
	return CheckpointPrefix(job, task, n) + "private/" + name
}

// PrivateKeyOf is where a private file of checkpoint n written by the
// owner of epoch lives when not inline: PrivateKey for epoch 0,
// private.e<epoch:020>/<name> otherwise.
func PrivateKeyOf(job, task string, n, epoch uint64, name string) string {
	if epoch == 0 {
		return PrivateKey(job, task, n, name)
	}
	return fmt.Sprintf("%sprivate.e%020d/%s", CheckpointPrefix(job, task, n), epoch, name)
}

// keyKind is what a key under <job>/tasks/ is.
type keyKind int

const (
	keyOther keyKind = iota
	keyManifest
	keyRetired
	keyPrivate
	keyOwner
)

// taskKey is a key under <job>/tasks/ taken apart.
type taskKey struct {
	task  string
	n     uint64 // checkpoint number (the epoch for keyOwner)
	epoch uint64 // of a manifest or private object
	kind  keyKind
}

// parseEpochSuffix reads "<name>.e<epoch:020>" (epoch >= 1) or "<name>"
// (epoch 0).
func parseEpochSuffix(s, name string) (uint64, bool) {
	if s == name {
		return 0, true
	}
	rest, ok := strings.CutPrefix(s, name+".e")
	if !ok || len(rest) != 20 {
		return 0, false
	}
	e, err := strconv.ParseUint(rest, 10, 64)
	return e, err == nil && e > 0
}

// parseTaskKey splits a key under TasksPrefix(job) into task, checkpoint
// number (or owner epoch), epoch and kind. Keys that do not fit the layout
// return keyOther.
func parseTaskKey(job, key string) taskKey {
	rest, ok := strings.CutPrefix(key, TasksPrefix(job))
	if !ok {
		return taskKey{}
	}
	parts := strings.SplitN(rest, "/", 5)
	if len(parts) < 3 || len(parts[2]) != 20 {
		return taskKey{}
	}
	n, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil || n == 0 {
		return taskKey{}
	}
	if parts[1] == "owner" {
		if len(parts) == 3 {
			return taskKey{task: parts[0], n: n, kind: keyOwner}
		}
		return taskKey{}
	}
	if len(parts) < 4 || parts[1] != "chk" {
		return taskKey{}
	}
	k := taskKey{task: parts[0], n: n}
	if e, ok := parseEpochSuffix(parts[3], "manifest"); ok && len(parts) == 4 {
		k.epoch, k.kind = e, keyManifest
	} else if e, ok := parseEpochSuffix(parts[3], "retired"); ok && len(parts) == 4 {
		k.epoch, k.kind = e, keyRetired
	} else if e, ok := parseEpochSuffix(parts[3], "private"); ok && len(parts) == 5 {
		k.epoch, k.kind = e, keyPrivate
	}
	return k
}
