package gc

import (
	"fmt"
	"os"
	"time"
)

// MinGrace is the least GC grace period that `ckpt gc --grace` and
// `ckpt agent --gc-grace` accept.
//
// The grace is all that stands between GC and an upload in flight: GC
// cannot see checkpoints in progress, only objects and their ages, and an
// object uploaded by a checkpoint that has not committed its manifest yet
// is unreferenced. Such an object may be older than the grace when GC lists
// it, because a checkpoint's async phase uploads its first files minutes
// before it commits: a large state on a shared or throttled link
// (--upload-rate), retries with backoff through a storage outage, and up
// to --commit-patience (2m) of commit retries, on an agent of another node
// that this GC knows nothing about. Ages are also read against the storage
// server's clock, which may be off from the GC's by a minute or more. A
// grace shorter than that lets GC delete objects that a manifest committed
// a moment later references: a checkpoint that reports completed and
// cannot be restored. 10 minutes is the order of the longest async phase
// an agent lets run by default (its checkpoint timeout) plus the skew; the
// default grace, 1h, leaves a wide margin.
//
// Tests that need short graces lower the floor with UnsafeMinGraceEnv.
const MinGrace = 10 * time.Minute

// UnsafeMinGraceEnv names the environment variable that lowers
// MinGrace to its value (a Go duration such as "0s"). It exists for tests,
// which exercise GC in seconds on storage that nothing else writes to; it
// is unsafe anywhere else, for the reason MinGrace gives. It can only
// lower the floor.
const UnsafeMinGraceEnv = "CKPT_UNSAFE_MIN_GC_GRACE"

// GraceFloor returns the floor in effect: MinGrace, or less when
// UnsafeMinGraceEnv lowers it (then lowered is true).
func GraceFloor() (floor time.Duration, lowered bool, err error) {
	v := os.Getenv(UnsafeMinGraceEnv)
	if v == "" {
		return MinGrace, false, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, false, fmt.Errorf("%s=%q: want a duration such as 0s or 1m", UnsafeMinGraceEnv, v)
	}
	if d >= MinGrace {
		return MinGrace, false, nil
	}
	return d, true, nil
}

// CheckGrace refuses a grace below the floor (GraceFloor), with an
// error that names option (the flag or setting it came from), the floor
// and why.
func CheckGrace(option string, grace time.Duration) error {
	floor, _, err := GraceFloor()
	if err != nil {
		return err
	}
	if grace < floor {
		return fmt.Errorf("%s %v is below the floor of %v: an upload in flight elsewhere (a checkpoint of this job not committed yet) "+
			"may be older than the grace when GC lists its objects, and GC would delete objects its manifest is about to reference; "+
			"use at least %v (the default is 1h)", option, grace, floor, floor)
	}
	return nil
}
