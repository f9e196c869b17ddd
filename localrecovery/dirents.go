package localrecovery

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// direntBuf is the getdents(2) buffer: a snapshot of 100,000 files is
// about 3 MB of entries, read in a dozen calls.
const direntBuf = 256 << 10

// Offsets in a linux_dirent64: d_ino u64, d_off s64, d_reclen u16,
// d_type u8, then the NUL-terminated name.
const (
	direntReclen = unsafe.Offsetof(unix.Dirent{}.Reclen)
	direntType   = unsafe.Offsetof(unix.Dirent{}.Type)
	direntName   = unsafe.Offsetof(unix.Dirent{}.Name)
)

// readDirents calls fn with the name (valid only during the call) and the
// d_type of every entry of the open directory fd but "." and "..", in the
// order the kernel returns them, from the directory's current offset. It
// allocates nothing per entry: what os.File.ReadDir costs per file (a
// DirEntry) is what a snapshot of 100,000 files cannot afford in the sync
// phase. fn may return an error to stop.
func readDirents(fd int, fn func(name []byte, typ uint8) error) error {
	buf := make([]byte, direntBuf)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n <= 0 {
			return nil
		}
		for b := buf[:n]; len(b) > 0; {
			if len(b) < int(direntName) {
				return fmt.Errorf("getdents: short entry")
			}
			reclen := int(binary.NativeEndian.Uint16(b[direntReclen:]))
			if reclen < int(direntName) || reclen > len(b) {
				return fmt.Errorf("getdents: bad entry length %d", reclen)
			}
			name := b[direntName:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			typ := b[direntType]
			b = b[reclen:]
			if string(name) == "." || string(name) == ".." {
				continue
			}
			if err := fn(name, typ); err != nil {
				return err
			}
		}
	}
}

// countDirents counts the entries of the open directory fd but "." and
// "..", from the directory's current offset.
func countDirents(fd int) (int, error) {
	n := 0
	err := readDirents(fd, func([]byte, uint8) error { n++; return nil })
	return n, err
}

// direntKind describes the d_type of an entry that is not a regular file
// (see describe); "" for a regular file.
func direntKind(typ uint8) string {
	switch typ {
	case unix.DT_REG:
		return ""
	case unix.DT_LNK:
		return "is a symlink"
	case unix.DT_DIR:
		return "is a directory"
	case unix.DT_BLK, unix.DT_CHR:
		return "is a device"
	case unix.DT_SOCK:
		return "is a socket"
	case unix.DT_FIFO:
		return "is a named pipe"
	}
	return "is not a regular file"
}

// modeKind is direntKind for the st_mode of an fstatat(2), for the
// filesystems that leave d_type unknown: on Linux a d_type is the file type
// bits of st_mode shifted down by 12 (DT_REG is S_IFREG>>12, and so on).
func modeKind(mode uint32) string {
	return direntKind(uint8((mode & unix.S_IFMT) >> 12))
}
