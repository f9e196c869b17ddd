package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/ckpt-io/ckpt/protocol"
)

// listen creates the agent's Unix socket with mode 0660. A live socket of
// another agent at path is an error; a stale one (nobody answers) is
// replaced; any other file there is left alone and is an error.
func listen(path string) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("socket %s: a file that is not a socket is in the way; remove it or choose another --socket", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s: another agent is listening on it; stop it or choose another --socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("socket %s: remove stale socket: %w", path, err)
		}
	}
	old := syscall.Umask(0o117) // the socket is born 0660: no window with wider access
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	l.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return l, nil
}

// conn is one client connection. Replies to a checkpoint arrive from other
// goroutines, so writes are serialised.
type conn struct {
	c   net.Conn
	log *slog.Logger
	mu  sync.Mutex
	enc *json.Encoder
	// dead is set once a write failed: later events are dropped (the work
	// they report goes on; the app can ask for status).
	dead bool
}

func (c *conn) send(ev protocol.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return
	}
	c.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := c.enc.Encode(ev); err != nil {
		c.dead = true
		c.log.Debug("client connection lost", "err", err)
	}
}

// readLine reads one line of at most protocol.MaxLine bytes. A longer line is
// consumed up to its newline and reported with tooLong, so the connection
// stays usable after it.
func readLine(r *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		chunk, isPrefix, err := r.ReadLine()
		if err != nil {
			if err == io.EOF && len(line) > 0 {
				return line, tooLong, nil
			}
			return nil, false, err
		}
		if !tooLong {
			if len(line)+len(chunk) > protocol.MaxLine {
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if !isPrefix {
			return line, tooLong, nil
		}
	}
}

// serveConn reads requests until the client hangs up or the agent stops.
func (a *Agent) serveConn(ctx context.Context, nc net.Conn) {
	defer nc.Close()
	c := &conn{c: nc, log: a.log, enc: json.NewEncoder(nc)}
	c.enc.SetEscapeHTML(false)
	r := bufio.NewReaderSize(nc, 64<<10)
	stop := context.AfterFunc(ctx, func() { nc.SetReadDeadline(time.Now()) })
	defer stop()
	for {
		line, tooLong, err := readLine(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, net.ErrClosed) {
				a.log.Debug("client read", "err", err)
			}
			return
		}
		if tooLong {
			c.send(protocol.Event{Event: "error", Error: errorf(protocol.CodeBadRequest, "line exceeds the %d byte limit", protocol.MaxLine)})
			continue
		}
		if len(line) == 0 {
			continue // blank lines are keep-alives
		}
		req, perr := protocol.DecodeRequest(line)
		if perr != nil {
			c.send(protocol.Event{Event: "error", ID: req.ID, Error: perr})
			continue
		}
		a.handle(ctx, c, req)
	}
}
