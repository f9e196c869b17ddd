package wal

import (
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watch returns a channel that receives when a log file appears in dir
// (created, or renamed there to recycle an old one): the engine rotated
// its log, and the one before is sealed and about to be deleted or
// recycled, so a round now reads it to its end. stop ends the watch and
// waits for its goroutine. The watch is of the directory dir has open
// (through /proc/self/fd), not of a path that could be swapped.
func Watch(dir *os.File) (events <-chan struct{}, stop func(), err error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, nil, fmt.Errorf("watch the store dir: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, fmt.Sprintf("/proc/self/fd/%d", dir.Fd()), unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ONLYDIR); err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("watch the store dir: %w", err)
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: Close wakes the reader
	ch := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			for p := 0; p+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[p]))
				nameEnd := p + unix.SizeofInotifyEvent + int(ev.Len)
				if nameEnd > n {
					break
				}
				name := strings.TrimRight(string(buf[p+unix.SizeofInotifyEvent:nameEnd]), "\x00")
				if _, ok := ParseLogName(name); ok || ev.Mask&unix.IN_Q_OVERFLOW != 0 {
					select {
					case ch <- struct{}{}:
					default:
					}
				}
				p = nameEnd
			}
		}
	}()
	return ch, func() { f.Close(); <-done }, nil
}
