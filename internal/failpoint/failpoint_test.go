package failpoint

import "testing"

// Without the build tag every failpoint is inert, whatever the environment.
func TestOffByDefault(t *testing.T) {
	if Enabled {
		t.Skip("built with ckpt_failpoints")
	}
	t.Setenv("CKPT_FAILPOINT", MidUpload+",x=EIO")
	Hit(MidUpload)
	if err := Error("x"); err != nil {
		t.Fatalf("Error armed in a production build: %v", err)
	}
}
