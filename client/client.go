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

// Client is one connection to an agent. It is safe for concurrent use;
// requests on it are answered independently, each matched by its id.
type Client struct {
	conn net.Conn
	wmu  sync.Mutex

	mu      sync.Mutex
	next    int
	waiters map[string]chan Event
	err     error // set when the reader stopped
	done    chan struct{}
}

// DefaultDialWait is how long Dial waits, by default, for an agent whose
// socket does not exist yet or does not accept connections yet (an agent
// starting next to the app, or restarting).
const DefaultDialWait = 30 * time.Second

// DialOption changes how Dial connects.
type DialOption func(*dialConfig)

type dialConfig struct{ wait time.Duration }

// WithDialWait sets how long Dial retries a socket that is missing or
// refuses connections (default DefaultDialWait; 0: one attempt).
func WithDialWait(d time.Duration) DialOption { return func(c *dialConfig) { c.wait = d } }

// Dial connects to the agent listening on the Unix socket at path socket.
// While the socket is missing or refuses connections it retries with
// backoff (10 ms doubling to 1 s) until the agent answers, ctx is done or
// the dial wait (WithDialWait) has passed; other errors (a permission
// denied) return at once. It sends nothing; the error of a failed
// connection says which socket was tried and for how long.
func Dial(ctx context.Context, socket string, opts ...DialOption) (*Client, error) {
	cfg := dialConfig{wait: DefaultDialWait}
	for _, o := range opts {
		o(&cfg)
	}
	start := time.Now()
	deadline := start.Add(cfg.wait)
	backoff := 10 * time.Millisecond
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "unix", socket)
		if err == nil {
			c := &Client{conn: conn, waiters: map[string]chan Event{}, done: make(chan struct{})}
			go c.read()
			return c, nil
		}
		waited := time.Since(start).Round(time.Millisecond)
		if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) || ctx.Err() != nil {
			return nil, fmt.Errorf("connect to the ckpt agent at %s (after %v): %w (is `ckpt agent --socket %s` running?)", socket, waited, err, socket)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("connect to the ckpt agent at %s: %w after %v of retries (is `ckpt agent --socket %s` running, and is the socket's directory shared with this container?)", socket, err, waited, socket)
		}
		t := time.NewTimer(min(backoff, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("connect to the ckpt agent at %s: %w after %v of retries: %w (is `ckpt agent --socket %s` running?)", socket, err, waited, ctx.Err(), socket)
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// Close closes the connection and waits for its reader to stop; calls
// waiting for an answer return an error. Checkpoints already past synced
// go on in the agent.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}

func (c *Client) read() {
	defer close(c.done)
	r := bufio.NewReaderSize(c.conn, 64<<10)
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
		ch := c.waiters[idKey(ev.ID)]
		c.mu.Unlock()
		if ch != nil {
			ch <- ev
		}
	}
	c.mu.Lock()
	c.err = fmt.Errorf("connection to the agent lost: %w", err)
	for id, ch := range c.waiters {
		close(ch)
		delete(c.waiters, id)
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

// send registers a waiter and writes the request with a fresh id.
func (c *Client) send(req protocol.Request) (string, chan Event, error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return "", nil, c.err
	}
	c.next++
	id := "c" + strconv.Itoa(c.next)
	ch := make(chan Event, 4)
	c.waiters[id] = ch
	c.mu.Unlock()
	req.ID = id
	b, err := json.Marshal(req)
	if err != nil {
		c.forget(id)
		return "", nil, err
	}
	c.wmu.Lock()
	_, err = c.conn.Write(append(b, '\n'))
	c.wmu.Unlock()
	if err != nil {
		c.forget(id)
		return "", nil, fmt.Errorf("send to the agent: %w", err)
	}
	return id, ch, nil
}

func (c *Client) forget(id string) {
	c.mu.Lock()
	delete(c.waiters, id)
	c.mu.Unlock()
}

func (c *Client) wait(ctx context.Context, ch chan Event) (Event, error) {
	select {
	case ev, ok := <-ch:
		if !ok {
			c.mu.Lock()
			err := c.err
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
	id, ch, err := c.send(req)
	if err != nil {
		return Event{}, err
	}
	defer c.forget(id)
	ev, err := c.wait(ctx, ch)
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

// ErrAborted is returned by Pending.Wait for a checkpoint that was aborted.
var ErrAborted = errors.New("checkpoint aborted")

// Pending is a checkpoint past its sync phase: the agent holds its own
// copy of the snapshot, and uploads it.
type Pending struct {
	// Synced is the agent's synced event; SyncMS is the sync phase's length.
	Synced Event
	c      *Client
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
	id, ch, err := c.send(r)
	if err != nil {
		return nil, err
	}
	ev, err := c.wait(ctx, ch)
	if err != nil {
		c.forget(id)
		return nil, err
	}
	if ev.Event != "synced" {
		c.forget(id)
		if ev.Error != nil {
			return nil, ev.Error
		}
		return nil, fmt.Errorf("agent answered %q before synced", ev.Event)
	}
	return &Pending{Synced: ev, c: c, id: id, ch: ch}, nil
}

// Wait returns the completed event, or the failure as an *Error, or
// ErrAborted. Cancelling ctx stops waiting, not the checkpoint.
func (p *Pending) Wait(ctx context.Context) (Event, error) {
	ev, err := p.c.wait(ctx, p.ch)
	if err != nil {
		return ev, err
	}
	p.c.forget(p.id)
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
