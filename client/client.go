// Package client talks to a ckpt agent over its Unix socket (protocol v1).
// A Client is safe for concurrent use: each request gets its own id, and a
// reader goroutine routes the agent's events to the request they answer.
//
// The package depends on the standard library and package protocol only,
// so an app can link it without storage, engines or telemetry. Package
// client/pebble adds the helpers for apps on Pebble.
package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ckpt-io/ckpt/protocol"
)

// Error is an error event from the agent: failed and error events are
// returned as an *Error (protocol.Error) carrying the agent's code and
// message; errors.As finds it.
type Error = protocol.Error

// Event is any event the agent sends (protocol.Event): fields absent from
// an event are zero, and Raw keeps the event as sent.
type Event = protocol.Event

// Request is a checkpoint request with every option of the protocol
// (protocol.Request). Send sets its Op and ID itself and sends no Target
// (a restore field).
type Request = protocol.Request

// Client is a connection to an agent, dialled again when it is lost. It
// is safe for concurrent use; requests on it are answered independently,
// each matched by its id. When the connection is lost, the calls waiting
// on it return an error wrapping ErrConnectionLost, and the next call dials
// again (waiting for the agent as Dial does): an agent that restarts costs
// the requests in flight, never the Client.
type Client struct {
	socket   string
	dialWait time.Duration

	wmu sync.Mutex // serialises writes and dials

	mu     sync.Mutex
	next   int
	cur    *session // the connection; a dead one is replaced at the next call
	closed bool
}

// session is one connection and the requests waiting on it.
type session struct {
	conn    net.Conn
	waiters map[string]chan Event // guarded by Client.mu
	err     error                 // set (under Client.mu) when the reader stopped
	// refused is the agent's refusal of the connection (an error event
	// without an id, sent before it closes), until a call returns it.
	refused *Error
	done    chan struct{}
}

// ErrConnectionLost is wrapped by the error of a request whose connection
// was lost before its answer: the agent stopped or restarted. The request
// may or may not have taken effect; ask Status.
var ErrConnectionLost = errors.New("connection to the ckpt agent lost")

// ErrConnect is wrapped by the error of a dial that failed: the socket
// stayed missing or refusing past the dial wait, or could not be used.
var ErrConnect = errors.New("cannot connect to the ckpt agent")

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = errors.New("ckpt client closed")

// DefaultDialWait is how long Dial waits, by default, for an agent whose
// socket does not exist yet or does not accept connections yet (an agent
// starting next to the app, or restarting).
const DefaultDialWait = 30 * time.Second

// DialOption changes how Dial connects.
type DialOption func(*dialConfig)

type dialConfig struct{ wait time.Duration }

// WithDialWait sets how long Dial, and each dial again after a lost
// connection, retries a socket that is missing or refuses connections
// (default DefaultDialWait; 0: one attempt).
func WithDialWait(d time.Duration) DialOption { return func(c *dialConfig) { c.wait = d } }

// Dial connects to the agent listening on the Unix socket at path socket.
// While the socket is missing or refuses connections it retries with
// backoff (10 ms doubling to 1 s) until the agent answers, ctx is done or
// the dial wait (WithDialWait) has passed; other errors (a permission
// denied) return at once. It sends nothing; the error of a failed
// connection wraps ErrConnect and says which socket was tried and for how
// long.
func Dial(ctx context.Context, socket string, opts ...DialOption) (*Client, error) {
	cfg := dialConfig{wait: DefaultDialWait}
	for _, o := range opts {
		o(&cfg)
	}
	c := &Client{socket: socket, dialWait: cfg.wait}
	s, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.cur = s
	return c, nil
}

// dial connects, retrying as Dial says, and starts the session's reader.
func (c *Client) dial(ctx context.Context) (*session, error) {
	socket := c.socket
	start := time.Now()
	deadline := start.Add(c.dialWait)
	backoff := 10 * time.Millisecond
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "unix", socket)
		if err == nil {
			s := &session{conn: conn, waiters: map[string]chan Event{}, done: make(chan struct{})}
			go c.read(s)
			return s, nil
		}
		waited := time.Since(start).Round(time.Millisecond)
		if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) || ctx.Err() != nil {
			return nil, fmt.Errorf("%w at %s (after %v): %w (is `ckpt agent --socket %s` running?)", ErrConnect, socket, waited, err, socket)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("%w at %s: %w after %v of retries (is `ckpt agent --socket %s` running, and is the socket's directory shared with this container?)", ErrConnect, socket, err, waited, socket)
		}
		t := time.NewTimer(min(backoff, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w at %s: %w after %v of retries: %w (is `ckpt agent --socket %s` running?)", ErrConnect, socket, err, waited, ctx.Err(), socket)
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// Close closes the connection and waits for its reader to stop; calls
// waiting for an answer return an error, and later calls ErrClosed.
// Checkpoints already past synced go on in the agent.
func (c *Client) Close() error {
	c.mu.Lock()
	s := c.cur
	c.closed, c.cur = true, nil
	c.mu.Unlock()
	if s == nil {
		return nil
	}
	err := s.conn.Close()
	<-s.done
	return err
}

func (c *Client) read(s *session) {
	defer close(s.done)
	r := bufio.NewReaderSize(s.conn, 64<<10)
	var err error
	for {
		var line []byte
		line, err = r.ReadBytes('\n')
		if err != nil {
			break
		}
		var ev Event
		if json.Unmarshal(line, &ev) != nil {
			continue
		}
		c.mu.Lock()
		if ev.ID == nil && ev.Event == "error" && ev.Error != nil && s.refused == nil {
			s.refused = ev.Error // the agent refuses this connection
		}
		ch := s.waiters[idKey(ev.ID)]
		c.mu.Unlock()
		if ch != nil {
			ch <- ev
		}
	}
	s.conn.Close()
	c.mu.Lock()
	s.err = fmt.Errorf("%w (it stopped or restarted; ask Status for the outcome): %w", ErrConnectionLost, err)
	if s.refused != nil {
		s.err = s.refused
		if len(s.waiters) > 0 {
			s.refused = nil // returned to the calls waiting: the next call dials again
		}
	}
	for id, ch := range s.waiters {
		close(ch)
		delete(s.waiters, id)
	}
	c.mu.Unlock()
}

// idKey is the waiter key of an event's id: the id as a string, numbers
// as written; "" for none.
func idKey(id any) string {
	switch v := id.(type) {
	case string:
		return v
	case json.Number:
		return v.String()
	}
	return ""
}

// session returns the live connection, dialling again when the last one
// was lost. A refusal the agent sent on the lost one is returned once.
// Called with wmu held.
func (c *Client) session(ctx context.Context) (*session, error) {
	c.mu.Lock()
	s, closed := c.cur, c.closed
	var refused *Error
	if s != nil && s.err != nil && s.refused != nil {
		refused, s.refused = s.refused, nil
	}
	c.mu.Unlock()
	switch {
	case closed:
		return nil, ErrClosed
	case refused != nil:
		return nil, refused
	case s != nil && s.err == nil:
		return s, nil
	}
	if s != nil {
		<-s.done
	}
	s, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		s.conn.Close()
		<-s.done
		return nil, ErrClosed
	}
	c.cur = s
	c.mu.Unlock()
	return s, nil
}

// send registers a waiter and writes the request with a fresh id.
func (c *Client) send(ctx context.Context, req protocol.Request) (*session, string, chan Event, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	s, err := c.session(ctx)
	if err != nil {
		return nil, "", nil, err
	}
	c.mu.Lock()
	if s.err != nil { // lost since session returned it
		err := s.err
		c.mu.Unlock()
		return nil, "", nil, err
	}
	c.next++
	id := "c" + strconv.Itoa(c.next)
	ch := make(chan Event, 4)
	s.waiters[id] = ch
	c.mu.Unlock()
	req.ID = id
	b, err := json.Marshal(req)
	if err != nil {
		c.forget(s, id)
		return nil, "", nil, err
	}
	if _, err := s.conn.Write(append(b, '\n')); err != nil {
		c.forget(s, id)
		s.conn.Close() // the reader stops, and the next call dials again
		<-s.done
		c.mu.Lock()
		refused := s.refused
		s.refused = nil
		c.mu.Unlock()
		if refused != nil { // the agent said why it closed
			return nil, "", nil, refused
		}
		return nil, "", nil, fmt.Errorf("send to the ckpt agent at %s: %w: %w", c.socket, ErrConnectionLost, err)
	}
	return s, id, ch, nil
}

func (c *Client) forget(s *session, id string) {
	c.mu.Lock()
	delete(s.waiters, id)
	c.mu.Unlock()
}

func (c *Client) wait(ctx context.Context, s *session, ch chan Event) (Event, error) {
	select {
	case ev, ok := <-ch:
		if !ok {
			c.mu.Lock()
			err := s.err
			c.mu.Unlock()
			return Event{}, err
		}
		return ev, nil
	case <-ctx.Done():
		return Event{}, ctx.Err()
	}
}

// call sends a request and returns its one reply, or the agent's error.
func (c *Client) call(ctx context.Context, req protocol.Request) (Event, error) {
	s, id, ch, err := c.send(ctx, req)
	if err != nil {
		return Event{}, err
	}
	defer c.forget(s, id)
	ev, err := c.wait(ctx, s, ch)
	if err != nil {
		return ev, err
	}
	if ev.Error != nil {
		return ev, ev.Error
	}
	return ev, nil
}

// Hello returns the agent's hello event: Protocol is its protocol version
// (protocol.ProtocolVersion for this package) and Version its version.
func (c *Client) Hello(ctx context.Context) (Event, error) {
	return c.call(ctx, protocol.Request{Op: protocol.OpHello})
}

// Status returns the agent's status event: Tasks holds the task named,
// or every task the agent knows when task is "". An error event (a
// bad_request for an invalid name) is returned as an *Error.
func (c *Client) Status(ctx context.Context, task string) (Event, error) {
	return c.call(ctx, protocol.Request{Op: protocol.OpStatus, Task: task})
}

// Abort asks the agent to stop checkpoint n of task, which must be in
// flight, and returns the aborted event once it stopped; the checkpoint's
// own Pending.Wait then returns ErrAborted. A checkpoint not in flight
// (not_found) or one that completed first (conflict) is returned as an
// *Error.
func (c *Client) Abort(ctx context.Context, task string, n uint64) (Event, error) {
	return c.call(ctx, protocol.Request{Op: protocol.OpAbort, Task: task, Checkpoint: n})
}

// Restore asks the agent to restore r.Task into r.Target (an absolute
// path, missing or empty): checkpoint r.Checkpoint (0: the newest complete
// one), or the newest job-complete one with r.JobConsistent; r.Job names
// the job to a node agent. It returns the restored event (Restored holds
// what was restored); a failure is returned as an *Error.
func (c *Client) Restore(ctx context.Context, r Request) (Event, error) {
	if !filepath.IsAbs(r.Target) {
		return Event{}, fmt.Errorf("restore target must be an absolute path, got %q", r.Target)
	}
	req := protocol.Request{Op: protocol.OpRestore, Task: r.Task, Target: r.Target, Checkpoint: r.Checkpoint,
		JobConsistent: r.JobConsistent, Job: r.Job}
	return c.call(ctx, req)
}

// Follow asks the agent to keep a warm standby copy of task, and returns
// the following event.
func (c *Client) Follow(ctx context.Context, task string) (Event, error) {
	return c.call(ctx, protocol.Request{Op: protocol.OpFollow, Task: task})
}

// ErrAborted is returned by Pending.Wait for a checkpoint that was aborted.
var ErrAborted = errors.New("checkpoint aborted")

// Pending is a checkpoint past its sync phase: the agent holds its own
// copy of the snapshot, and uploads it.
type Pending struct {
	// Synced is the agent's synced event; SyncMS is the sync phase's length.
	Synced Event
	c      *Client
	s      *session
	id     string
	ch     chan Event
}

// Checkpoint sends checkpoint n of task for the snapshot in dir and returns
// once the agent answers synced: from then on the app may delete dir. An
// error event (bad_request, conflict, unavailable, ...) is returned as an
// *Error. Wait for the end with Pending.Wait.
func (c *Client) Checkpoint(ctx context.Context, task string, n uint64, dir string, engine string) (*Pending, error) {
	return c.Send(ctx, Request{Task: task, Checkpoint: n, Dir: dir, Engine: engine})
}

// Send sends r as a checkpoint request and returns once the agent answers
// synced; see Checkpoint. With r.Handoff the agent takes r.Dir over.
func (c *Client) Send(ctx context.Context, r Request) (*Pending, error) {
	r.Op, r.Target = protocol.OpCheckpoint, ""
	s, id, ch, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	ev, err := c.wait(ctx, s, ch)
	if err != nil {
		c.forget(s, id)
		return nil, err
	}
	if ev.Event != "synced" {
		c.forget(s, id)
		if ev.Error != nil {
			return nil, ev.Error
		}
		return nil, fmt.Errorf("agent answered %q before synced", ev.Event)
	}
	return &Pending{Synced: ev, c: c, s: s, id: id, ch: ch}, nil
}

// Wait returns the completed event, or the failure as an *Error, or
// ErrAborted. Cancelling ctx stops waiting, not the checkpoint.
func (p *Pending) Wait(ctx context.Context) (Event, error) {
	ev, err := p.c.wait(ctx, p.s, p.ch)
	if err != nil {
		return ev, err
	}
	p.c.forget(p.s, p.id)
	switch {
	case ev.Event == "completed":
		return ev, nil
	case ev.Event == "aborted":
		return ev, ErrAborted
	case ev.Error != nil:
		return ev, ev.Error
	}
	return ev, fmt.Errorf("unexpected event %q", ev.Event)
}
