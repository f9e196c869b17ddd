//go:build ckpt_failpoints

package failpoint

import (
	"strconv"
	"syscall"
	"testing"
)

// Errnos are the disk faults the fault suites inject.
var Errnos = []syscall.Errno{syscall.ENOSPC, syscall.EIO, syscall.EROFS}

var errnoNames = map[syscall.Errno]string{syscall.ENOSPC: "ENOSPC", syscall.EIO: "EIO", syscall.EROFS: "EROFS", syscall.EDQUOT: "EDQUOT"}

// Arm makes point return errno from the hit after the first after ones,
// for the rest of t or until Disarm (tests only).
func Arm(t *testing.T, point string, errno syscall.Errno, after int) {
	t.Helper()
	t.Cleanup(Reset) // runs after t.Setenv restored the environment
	t.Setenv("CKPT_FAILPOINT", point+"="+errnoNames[errno])
	t.Setenv("CKPT_FAILPOINT_AFTER", strconv.Itoa(after))
	Reset()
}

// Disarm clears every failpoint for the rest of t.
func Disarm(t *testing.T) {
	t.Setenv("CKPT_FAILPOINT", "")
	t.Setenv("CKPT_FAILPOINT_AFTER", "")
	Reset()
}

// ErrnoName is the name Arm gives errno in CKPT_FAILPOINT ("ENOSPC").
func ErrnoName(errno syscall.Errno) string { return errnoNames[errno] }
