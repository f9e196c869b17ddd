// Package client talks to a ckpt agent over its Unix socket (protocol v1).
// A Client is safe for concurrent use: each request gets its own id, and a
// reader goroutine routes the agent's events to the request they answer.
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
)

// Error is an error event from the agent.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return fmt.Sprintf("agent: %s: %s", e.Code, e.Message) }

// Event is any event the agent sends; fields absent from an event are zero.
// Raw keeps the line as sent.
type Event struct {
	Event          string          `json:"event"`
	ID             string          `json:"id"`
	Protocol       int             `json:"protocol"`
	Version        string          `json:"version"`
	Task           string          `json:"task"`
	Checkpoint     uint64          `json:"checkpoint"`
	SyncMS         int64           `json:"sync_ms"`
	CheckpointSize int64           `json:"checkpoint_size"`
	FullSize       int64           `json:"full_size"`
	FilesUploaded  int             `json:"files_uploaded"`
	FilesReused    int             `json:"files_reused"`
	DurationMS     int64           `json:"duration_ms"`
	Error          *Error          `json:"error"`
	Raw            json.RawMessage `json:"-"`
}

// Client is a connection to an agent.
type Client struct {
	conn net.Conn
	wmu  sync.Mutex

	mu      sync.Mutex
	next    int
	waiters map[string]chan Event
	err     error // set when the reader stopped
	done    chan struct{}
}

// Dial connects to the agent's socket.
func Dial(ctx context.Context, socket string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("connect to the ckpt agent at %s: %w (is `ckpt agent --socket %s` running?)", socket, err, socket)
	}
	c := &Client{conn: conn, waiters: map[string]chan Event{}, done: make(chan struct{})}
	go c.read()
	return c, nil
}

// Close closes the connection; pending calls return an error.
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
		var idv struct {
			ID any `json:"id"`
		}
		if json.Unmarshal(line, &struct {
			*Event
			ID *any `json:"id"`
		}{&ev, &idv.ID}) != nil {
			continue
		}
		switch v := idv.ID.(type) {
		case string:
			ev.ID = v
		case float64:
			ev.ID = strconv.FormatFloat(v, 'f', -1, 64)
		}
		ev.Raw = append(json.RawMessage(nil), line...)
		c.mu.Lock()
		ch := c.waiters[ev.ID]
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

// send registers a waiter and writes the request with a fresh id.
func (c *Client) send(req map[string]any) (string, chan Event, error) {
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
	req["id"] = id
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
func (c *Client) call(ctx context.Context, req map[string]any) (Event, error) {
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

// Hello returns the agent's hello event (protocol and version).
func (c *Client) Hello(ctx context.Context) (Event, error) {
	return c.call(ctx, map[string]any{"op": "hello"})
}

// Status returns the agent's status event as sent.
func (c *Client) Status(ctx context.Context, task string) (Event, error) {
	req := map[string]any{"op": "status"}
	if task != "" {
		req["task"] = task
	}
	return c.call(ctx, req)
}

// Abort asks the agent to stop an in-flight checkpoint.
func (c *Client) Abort(ctx context.Context, task string, n uint64) (Event, error) {
	return c.call(ctx, map[string]any{"op": "abort", "task": task, "checkpoint": n})
}

// ErrAborted is returned by Pending.Wait for a checkpoint that was aborted.
var ErrAborted = errors.New("checkpoint aborted")

// Pending is a checkpoint past its sync phase.
type Pending struct {
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

// Request is a checkpoint request with every option of the protocol.
type Request struct {
	Task       string
	Checkpoint uint64
	Dir        string
	Engine     string
	// Handoff gives Dir to the agent, which moves it into its local store
	// in one rename instead of hard-linking each file: the app's pause no
	// longer grows with the number of files. Dir is gone after synced.
	Handoff bool
	// Traceparent makes the agent's checkpoint span a child of the app's.
	Traceparent string
}

// Send sends a checkpoint request and returns once the agent answers
// synced; see Checkpoint.
func (c *Client) Send(ctx context.Context, r Request) (*Pending, error) {
	req := map[string]any{"op": "checkpoint", "task": r.Task, "checkpoint": r.Checkpoint, "dir": r.Dir}
	if r.Engine != "" {
		req["engine"] = r.Engine
	}
	if r.Handoff {
		req["handoff"] = true
	}
	if r.Traceparent != "" {
		req["traceparent"] = r.Traceparent
	}
	id, ch, err := c.send(req)
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
