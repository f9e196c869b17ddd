//go:build !linux

package wal

import "os"

// Watch is a no-op where inotify is missing: rounds run on their interval
// only.
func Watch(dir *os.File) (events <-chan *os.File, stop func(), err error) {
	return nil, func() {}, nil
}
