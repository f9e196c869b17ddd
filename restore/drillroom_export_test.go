package restore

// SetFreeBytes replaces how drills read free space, for tests (a full disk
// cannot be had on demand); the returned func restores it.
func SetFreeBytes(f func(dir string) (int64, error)) func() {
	old := freeBytes
	freeBytes = f
	return func() { freeBytes = old }
}
