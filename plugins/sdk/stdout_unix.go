//go:build unix

package sdk

import (
	"os"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/plugins/internal/wire"
)

// handshakeOut is the host's end of stdout, kept for go-plugin's handshake
// line; file descriptor 1 points at stderr meanwhile, so that anything the
// plugin (or a library of it) prints before Serve cannot come first on the
// line the host reads.
var handshakeOut *os.File

func init() {
	if os.Getenv(wire.Handshake.MagicCookieKey) == "" {
		return // run by hand: go-plugin says so on stderr
	}
	fd, err := unix.Dup(1)
	if err != nil {
		return
	}
	unix.CloseOnExec(fd)
	if err := unix.Dup2(2, 1); err != nil {
		unix.Close(fd)
		return
	}
	handshakeOut = os.NewFile(uintptr(fd), "/dev/stdout")
}

// restoreStdout gives go-plugin the host's stdout for the handshake; it
// replaces os.Stdout with its own pipe right after.
func restoreStdout() {
	if handshakeOut != nil {
		os.Stdout = handshakeOut
	}
}
