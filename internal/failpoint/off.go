//go:build !ckpt_failpoints

package failpoint

// Enabled reports whether this build can arm failpoints.
const Enabled = false

// Hit marks that the process reached the step name. It does nothing in
// this build.
func Hit(name string) {}

// Error returns the error armed at step name, or nil. It is always nil in
// this build.
func Error(name string) error { return nil }
