//go:build ckpt_failpoints

package failpoint

import (
	"errors"
	"syscall"
	"testing"
)

func TestErrorsAreArmedFromTheEnvironment(t *testing.T) {
	t.Setenv("CKPT_FAILPOINT", LocalSync+"=ENOSPC,"+LocalRename+"=EIO")
	t.Setenv("CKPT_FAILPOINT_AFTER", "1")
	t.Cleanup(Reset)
	Reset()
	if err := Error(LocalSync); err != nil {
		t.Fatalf("first hit should be skipped: %v", err)
	}
	if err := Error(LocalSync); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("second hit: %v, want ENOSPC", err)
	}
	Error(LocalRename)
	if err := Error(LocalRename); !errors.Is(err, syscall.EIO) {
		t.Fatalf("rename: %v, want EIO", err)
	}
	if err := Error(LocalWrite); err != nil {
		t.Fatalf("unarmed point: %v", err)
	}
}

// Reset re-reads the environment: a point armed, then disarmed.
func TestResetRereadsTheEnvironment(t *testing.T) {
	t.Cleanup(Reset)
	t.Setenv("CKPT_FAILPOINT", LocalWrite+"=EROFS")
	Reset()
	if err := Error(LocalWrite); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("armed: %v, want EROFS", err)
	}
	t.Setenv("CKPT_FAILPOINT", "")
	Reset()
	if err := Error(LocalWrite); err != nil {
		t.Fatalf("disarmed: %v", err)
	}
}
