package plugins

// SetBeforeExec makes f run between the check of a plugin binary and its
// start, until the returned function restores the old hook.
func SetBeforeExec(f func(path string)) (restore func()) {
	old := beforeExec
	beforeExec = f
	return func() { beforeExec = old }
}
