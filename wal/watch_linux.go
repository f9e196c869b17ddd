package wal

import (
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watch returns a channel that receives each log file that appears in dir
// (created, or renamed there to recycle an old one), opened at once
// through dir's handle without following a symlink (its Name is the log's
// name): the engine rotated its log, and a round now reads the sealed one
// to its end; the file, held open from its creation, is read to its end
// even if the engine deletes it first (Shipper.Adopt). The receiver
// closes the files. stop ends the watch, waits for its goroutine and
// closes the files not received. The watch is of the directory dir has
// open (through /proc/self/fd), not of a path that could be swapped.
func Watch(dir *os.File) (events <-chan *os.File, stop func(), err error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, nil, fmt.Errorf("watch the store dir: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, fmt.Sprintf("/proc/self/fd/%d", dir.Fd()), unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ONLYDIR); err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("watch the store dir: %w", err)
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: Close wakes the reader
	ch := make(chan *os.File, 4096)
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
				if _, ok := ParseLogName(name); ok {
					lfd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
					if err == nil {
						lf := os.NewFile(uintptr(lfd), name)
						select {
						case ch <- lf:
						default:
							lf.Close() // the tailer opens it by name
						}
					}
				}
				p = nameEnd
			}
		}
	}()
	return ch, func() {
		f.Close()
		<-done
		for {
			select {
			case lf := <-ch:
				lf.Close()
			default:
				return
			}
		}
	}, nil
}
