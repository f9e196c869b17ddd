// Package failpoint names the steps of ckpt's data path where tests stop
// or break a process on purpose: the crash matrix kills the agent at each
// step, the disk-fault suite makes a filesystem call fail there.
//
// Production builds compile every call to nothing (this file). A build
// with the tag ckpt_failpoints (see on.go) arms them from the
// environment:
//
//	CKPT_FAILPOINT=name[=action][,name[=action]...]
//
// where action is "kill" (the default: SIGKILL the process at once), or an
// errno name ("ENOSPC", "EIO", "EROFS"): Error then returns that error as
// the step's failure. CKPT_FAILPOINT_AFTER=k skips the first k hits of
// every armed point; CKPT_FAILPOINT_JITTER=D sleeps a random time below
// D before a kill, so repeated runs die at different moments of the step.
//
// Names are constants below, one per step; a test arms them by name.
package failpoint

// Steps of a checkpoint, GC and restore, in the order they happen.
const (
	AfterLink      = "after-link"            // sync phase done: files linked into the local store
	MidUpload      = "mid-upload"            // an object of the checkpoint is uploaded, others are not
	BeforeManifest = "before-manifest"       // every object uploaded, the manifest not yet written
	AfterManifest  = "after-manifest"        // manifest committed, older checkpoints not yet retired
	MidRetire      = "mid-retire"            // one older checkpoint retired, others not yet
	MidGC          = "mid-gc"                // GC removed manifests or markers, objects not yet deleted
	BeforeRename   = "restore-before-rename" // restore verified every file, the target not yet renamed into place
	MidAdopt       = "mid-adopt"             // local copy adoption: some files linked, the record not yet written
	LocalWrite     = "local-write"           // a write of a file in the local dir or the restore target
	LocalSync      = "local-fsync"           // an fsync in the local dir or the restore target
	LocalRename    = "local-rename"          // a rename in the local dir or the restore target
)
