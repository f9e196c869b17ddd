package uploader

// SetAfterHash sets the hook that runs between the hash and the upload of
// a file read in two passes, until the returned func restores it.
func SetAfterHash(fn func(name string)) (restore func()) {
	old := afterHash
	afterHash = fn
	return func() { afterHash = old }
}
