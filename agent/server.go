package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"slices"
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

// Peer is who is at the other end of a connection: the credentials the
// kernel recorded when the peer connected (SO_PEERCRED), read once at
// accept. They say who may connect and appear on every request log line.
type Peer struct {
	UID, GID uint32
	PID      int32
}

// logAttrs are the peer's credentials as log attributes.
func (p Peer) logAttrs() []any {
	return []any{"peer_uid", p.UID, "peer_gid", p.GID, "peer_pid", p.PID}
}

// allowed reports whether the peer may connect: with no --allow-uid and
// no --allow-gid anyone who can open the socket may; otherwise its uid or
// its gid must be listed.
func (a *Agent) allowed(p Peer, credErr error) bool {
	if len(a.cfg.AllowUIDs) == 0 && len(a.cfg.AllowGIDs) == 0 {
		return true
	}
	if credErr != nil {
		return false
	}
	return slices.Contains(a.cfg.AllowUIDs, p.UID) || slices.Contains(a.cfg.AllowGIDs, p.GID)
}

// session is one client connection. Replies arrive from other goroutines
// (the async phase of a checkpoint, a restore), so writes are serialised.
type session struct {
	a    *Agent
	nc   net.Conn
	peer Peer
	log  *slog.Logger // the agent's, with the peer's credentials

	mu  sync.Mutex
	enc *json.Encoder
	// dead is set once a write failed: later events are dropped (the work
	// they report goes on; the app can ask for status).
	dead bool

	// pending counts requests not answered for good yet: a connection that
	// awaits a reply is not idle. idleSince is when it last dropped to 0.
	pendMu    sync.Mutex
	pending   int
	idleSince time.Time
	// stopped is set when the agent stops: no read deadline may then
	// replace the one that wakes the reader.
	stopped bool
}

func (s *session) write(ev protocol.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return
	}
	s.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := s.enc.Encode(ev); err != nil {
		s.dead = true
		s.log.Debug("client connection lost", "err", err)
	}
}

// conn is one request on a session: what its handler answers through.
// The first reply settles the request's outcome (counted and, when it is an
// error, logged); the last one (anything but synced) ends it.
type conn struct {
	s   *session
	op  string
	req protocol.Request
	log *slog.Logger

	mu       sync.Mutex
	answered bool
	ended    bool
}

// request opens a request on s: it is pending until its last reply.
func (s *session) request(op string, req protocol.Request) *conn {
	s.pendMu.Lock()
	s.pending++
	s.pendMu.Unlock()
	return &conn{s: s, op: op, req: req, log: s.log}
}

// peer is who sent the request (for decisions by credentials).
func (c *conn) peer() Peer { return c.s.peer }

func (c *conn) send(ev protocol.Event) {
	spec, _ := protocol.LookupOp(protocol.Op(c.op))
	final := spec.Interim == "" || ev.Event != spec.Interim
	c.mu.Lock()
	first := !c.answered
	c.answered = true
	last := final && !c.ended
	if final {
		c.ended = true
	}
	c.mu.Unlock()
	if first {
		c.s.a.requestEnded(c.op, c.req, ev.Error, c.peer())
	}
	c.s.write(ev)
	if last {
		c.s.pendMu.Lock()
		c.s.pending--
		if c.s.pending == 0 {
			c.s.idleSince = time.Now()
		}
		c.s.pendMu.Unlock()
	}
}

// metricOp is req's op as a label value of ckpt_requests_total: an op of
// the table, or "invalid", so that a peer cannot mint new series.
func metricOp(op protocol.Op) string {
	if op.Known() {
		return string(op)
	}
	return "invalid"
}

// requestEnded counts a request by its outcome and logs a refused one at
// warn with the peer's credentials.
func (a *Agent) requestEnded(op string, req protocol.Request, perr *protocol.Error, p Peer) {
	code := "ok"
	if perr != nil {
		code = perr.Code
	}
	a.cfg.Telemetry.RequestEnded(context.Background(), op, code)
	attrs := append([]any{"op", op, "code", code, "task", clip(req.Task)}, p.logAttrs()...)
	if req.Checkpoint != 0 {
		attrs = append(attrs, "checkpoint", req.Checkpoint)
	}
	if perr == nil {
		a.log.Debug("request", attrs...)
		return
	}
	a.log.Warn("request refused", append(attrs, "message", clip(perr.Message))...)
}

// clip shortens what a peer sent for a log line.
func clip(s string) string {
	const max = 256
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}

// lineReader reads lines of at most protocol.MaxLine bytes. A longer line
// is consumed up to its newline and reported with tooLong, so the
// connection stays usable after it. A read that fails (a deadline) keeps
// what it read of the line for the next call.
type lineReader struct {
	r       *bufio.Reader
	buf     []byte
	tooLong bool
}

func (l *lineReader) next() (line []byte, tooLong bool, err error) {
	for {
		chunk, err := l.r.ReadSlice('\n')
		if !l.tooLong {
			if len(l.buf)+len(chunk) > protocol.MaxLine+2 { // the content, then \r\n
				l.tooLong, l.buf = true, nil
			} else {
				l.buf = append(l.buf, chunk...)
			}
		}
		switch {
		case err == nil || (err == io.EOF && (len(l.buf) > 0 || l.tooLong)):
			line, tooLong = l.buf, l.tooLong
			l.buf, l.tooLong = nil, false
			line = bytes.TrimSuffix(line, []byte("\n"))
			line = bytes.TrimSuffix(line, []byte("\r"))
			if len(line) > protocol.MaxLine {
				line, tooLong = nil, true
			}
			return line, tooLong, nil
		case errors.Is(err, bufio.ErrBufferFull):
		default:
			return nil, false, err
		}
	}
}

// admit decides, once at accept, whether a connection is served: it reads
// the peer's credentials, refuses a peer --allow-uid/--allow-gid do not
// name, or in node-agent mode one that matches no tenant (forbidden), and
// a connection beyond --max-connections (unavailable). In node-agent mode
// the session is served by the core of the peer's tenant. A refused connection gets one error event and is closed.
func (a *Agent) admit(nc net.Conn) (*session, bool) {
	p, credErr := peerCred(nc)
	log := a.log.With(p.logAttrs()...)
	if credErr != nil {
		log = a.log.With("peer_cred_err", credErr.Error())
	}
	refuse := func(e *protocol.Error) (*session, bool) {
		a.cfg.Telemetry.RequestEnded(context.Background(), "connect", e.Code)
		log.Warn("connection refused", "op", "connect", "code", e.Code, "message", e.Message)
		nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		b, _ := json.Marshal(protocol.Event{Event: "error", Error: e})
		nc.Write(append(b, '\n'))
		nc.Close()
		return nil, false
	}
	core := a
	if a.cores != nil {
		var e *protocol.Error
		if core, e = a.tenantOf(p, credErr); e != nil {
			return refuse(e)
		}
		log = core.log.With(p.logAttrs()...)
	}
	if !a.allowed(p, credErr) {
		if credErr != nil {
			return refuse(errorf(protocol.CodeForbidden, "cannot read the peer's credentials (%v), and --allow-uid/--allow-gid restrict who may connect", credErr))
		}
		return refuse(errorf(protocol.CodeForbidden, "uid %d gid %d may not use this agent (--allow-uid, --allow-gid)", p.UID, p.GID))
	}
	if n := a.conns.Add(1); n > int64(a.cfg.MaxConnections) {
		a.conns.Add(-1)
		return refuse(errorf(protocol.CodeUnavailable, "too many connections: %d open (limit --max-connections %d); retry later", n-1, a.cfg.MaxConnections))
	}
	s := &session{a: core, nc: nc, peer: p, log: log, enc: json.NewEncoder(nc), idleSince: time.Now()}
	s.enc.SetEscapeHTML(false)
	return s, true
}

// setReadDeadline arms the next read's deadline unless the agent stops.
func (s *session) setReadDeadline(t time.Time) bool {
	s.pendMu.Lock()
	defer s.pendMu.Unlock()
	if s.stopped {
		return false
	}
	s.nc.SetReadDeadline(t)
	return true
}

// busyUntil says whether the connection is still in use after its read
// deadline passed, and until when it is not idle: a request awaiting its
// reply keeps it open, and the idle time counts from the last reply.
func (s *session) busyUntil(idle time.Duration) (time.Time, bool) {
	s.pendMu.Lock()
	defer s.pendMu.Unlock()
	now := time.Now()
	if s.pending > 0 {
		return now.Add(idle), true
	}
	if end := s.idleSince.Add(idle); end.After(now) {
		return end, true
	}
	return time.Time{}, false
}

// serveConn reads requests until the client hangs up, stays idle past the
// idle timeout, or the agent stops.
func (a *Agent) serveConn(ctx context.Context, s *session) {
	nc := s.nc
	defer nc.Close()
	lr := &lineReader{r: bufio.NewReaderSize(nc, 64<<10)}
	stop := context.AfterFunc(ctx, func() {
		s.pendMu.Lock()
		s.stopped = true
		nc.SetReadDeadline(time.Now())
		s.pendMu.Unlock()
	})
	defer stop()
	idle := a.cfg.IdleTimeout
	deadline := time.Time{} // none
	if idle > 0 {
		deadline = time.Now().Add(idle)
	}
	for {
		if !s.setReadDeadline(deadline) {
			return
		}
		line, tooLong, err := lr.next()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil && idle > 0 {
				if until, busy := s.busyUntil(idle); busy {
					deadline = until
					continue
				}
				s.log.Info("closing idle connection", "idle_timeout", idle.String())
				return
			}
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug("client read", "err", err)
			}
			return
		}
		if idle > 0 {
			deadline = time.Now().Add(idle)
		}
		if tooLong {
			s.request("invalid", protocol.Request{}).send(protocol.Event{Event: "error", Error: errorf(protocol.CodeBadRequest, "line exceeds the %d byte limit", protocol.MaxLine)})
			continue
		}
		if len(line) == 0 {
			continue // blank lines are keep-alives
		}
		req, perr := protocol.DecodeRequest(line)
		if perr != nil {
			s.request(metricOp(req.Op), req).send(protocol.Event{Event: "error", ID: req.ID, Error: perr})
			continue
		}
		a.handle(ctx, s.request(string(req.Op), req), req)
	}
}
