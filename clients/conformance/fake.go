package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"time"

	"github.com/ckpt-io/ckpt/protocol"
)

// stepTimeout bounds every wait of a scenario: a driver's answer, a
// connection, a request line. A JVM starting on a loaded machine fits.
const stepTimeout = 15 * time.Second

// run is one scenario in progress: the fake agent's socket and connection,
// and the driver that runs the client under test.
type run struct {
	socket string
	d      *driver
	mode   string // "" or "async": passed on every call

	l     *net.UnixListener
	conns chan net.Conn
	conn  net.Conn
	rd    *bufio.Reader
	ids   []any // every id the client sent in this scenario
	last  any   // the id of the latest request read
}

// listen starts serving the socket, as an agent starting does.
func (r *run) listen() error {
	os.Remove(r.socket)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: r.socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("fake agent: listen on %s: %w", r.socket, err)
	}
	r.l = l
	conns := make(chan net.Conn, 4)
	r.conns = conns
	go func() {
		defer close(conns)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	}()
	return nil
}

// unlisten stops serving and removes the socket, as an agent stopping does.
func (r *run) unlisten() {
	if r.l != nil {
		r.l.Close()
		r.l = nil
	}
}

// stale leaves a socket file nobody listens on (connections are refused),
// as an agent killed with SIGKILL does.
func (r *run) stale() error {
	os.Remove(r.socket)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: r.socket, Net: "unix"})
	if err != nil {
		return err
	}
	l.SetUnlinkOnClose(false)
	return l.Close()
}

// accept waits for the client's next connection; the one before is closed.
func (r *run) accept() error {
	r.hangup()
	select {
	case c, ok := <-r.conns:
		if !ok {
			return errors.New("fake agent: the listener stopped before the client connected")
		}
		r.conn, r.rd = c, bufio.NewReader(c)
		return nil
	case <-time.After(stepTimeout):
		return fmt.Errorf("the client did not connect to %s within %v", r.socket, stepTimeout)
	}
}

// hangup closes the current connection, as an agent that stops does.
func (r *run) hangup() {
	if r.conn != nil {
		r.conn.Close()
		r.conn, r.rd = nil, nil
	}
}

func (r *run) close() {
	r.hangup()
	r.unlisten()
	if r.conns != nil {
		for c := range r.conns {
			c.Close()
		}
	}
	os.Remove(r.socket)
}

// expect reads the client's next request and requires it to be want (op
// and arguments, compared as JSON values) plus an id, a string or a number
// that no earlier request of the scenario used.
func (r *run) expect(want map[string]any) error {
	if r.conn == nil {
		return errors.New("fake agent: no connection to read a request from")
	}
	r.conn.SetReadDeadline(time.Now().Add(stepTimeout))
	line, err := r.rd.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("waiting for the request %s: %w", show(want), err)
	}
	// The agent's own decoder must accept the line.
	req, perr := protocol.DecodeRequest(line)
	if perr != nil {
		return fmt.Errorf("request %s: the agent refuses it: %v", bytes.TrimSpace(line), perr)
	}
	var got map[string]any
	if err := json.Unmarshal(line, &got); err != nil {
		return fmt.Errorf("request %q: %v", line, err)
	}
	id := got["id"]
	switch id.(type) {
	case string, float64:
	default:
		return fmt.Errorf("request %s has no id (a string or a number): events could not be matched to it", bytes.TrimSpace(line))
	}
	for _, old := range r.ids {
		if old == id {
			return fmt.Errorf("request %s reuses the id %v of an earlier request", bytes.TrimSpace(line), id)
		}
	}
	r.ids = append(r.ids, id)
	r.last = req.ID
	delete(got, "id")
	if !reflect.DeepEqual(got, norm(want)) {
		return fmt.Errorf("the client sent %s, want %s (and an id)", show(got), show(want))
	}
	return nil
}

// reply writes events on the connection, one line each, in one write.
// An event whose ID is nil gets the id of the latest request; noID sends
// it without one.
func (r *run) reply(evs ...protocol.Event) error {
	var b []byte
	for _, ev := range evs {
		if ev.ID == nil {
			ev.ID = r.last
		} else if ev.ID == noID {
			ev.ID = nil
		}
		line, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		b = append(append(b, line...), '\n')
	}
	return r.write(b)
}

// noID marks an event sent without an id.
var noID = new(int)

func (r *run) write(b []byte) error {
	if r.conn == nil {
		return errors.New("fake agent: no connection to write to")
	}
	r.conn.SetWriteDeadline(time.Now().Add(stepTimeout))
	if _, err := r.conn.Write(b); err != nil {
		return fmt.Errorf("fake agent: write: %w", err)
	}
	return nil
}

// dribble writes events a few bytes at a time with pauses: the client
// must assemble lines from partial reads.
func (r *run) dribble(evs ...protocol.Event) error {
	var b []byte
	for _, ev := range evs {
		if ev.ID == nil {
			ev.ID = r.last
		}
		line, _ := json.Marshal(ev)
		b = append(append(b, line...), '\n')
	}
	for len(b) > 0 {
		n := min(len(b), 7)
		if err := r.write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
		time.Sleep(3 * time.Millisecond)
	}
	return nil
}

// call asks the driver to make one client call and returns nothing: the
// answer is read by result, after the fake agent did its part.
func (r *run) call(cmd map[string]any) error {
	if r.mode != "" {
		cmd["mode"] = r.mode
	}
	return r.d.send(cmd)
}

// result is the driver's answer to the latest call.
func (r *run) result() (map[string]any, error) { return r.d.recv() }

// wantEvent reads the call's result and requires it to be the event named
// with the fields given (others may be there too).
func (r *run) wantEvent(name string, fields map[string]any) error {
	res, err := r.result()
	if err != nil {
		return err
	}
	ev, ok := res["event"].(map[string]any)
	if !ok {
		return fmt.Errorf("the client returned %s, want the %s event", show(res), name)
	}
	if ev["event"] != name {
		return fmt.Errorf("the client returned the event %s, want a %s event", show(ev), name)
	}
	want, _ := norm(fields).(map[string]any) // nil fields: the name only
	for k, v := range want {
		if !reflect.DeepEqual(ev[k], v) {
			return fmt.Errorf("the client returned the event %s: %s is %s, want %s", show(ev), k, show(ev[k]), show(v))
		}
	}
	if r.last != nil && ev["id"] != nil && !reflect.DeepEqual(ev["id"], norm(r.last)) {
		return fmt.Errorf("the client returned the event %s, whose id is not its request's %v", show(ev), r.last)
	}
	return nil
}

// wantError reads the call's result and requires an error of kind (agent,
// aborted, connection, connect, timeout) and, for agent errors, code.
func (r *run) wantError(kind, code string) error {
	res, err := r.result()
	if err != nil {
		return err
	}
	e, ok := res["error"].(map[string]any)
	if !ok {
		return fmt.Errorf("the client returned %s, want an error of kind %s %s", show(res), kind, code)
	}
	if e["kind"] != kind || (code != "" && e["code"] != code) {
		return fmt.Errorf("the client raised %s, want kind %s code %q", show(e), kind, code)
	}
	return nil
}

// wantOK reads the result of a call that returns nothing (connect, close).
func (r *run) wantOK() error {
	res, err := r.result()
	if err != nil {
		return err
	}
	if res["ok"] != true {
		return fmt.Errorf("the client returned %s, want ok", show(res))
	}
	return nil
}

// connect asks the client to connect and waits for its connection.
func (r *run) connect() error {
	if err := r.call(map[string]any{"call": "connect", "socket": r.socket, "dial_wait_ms": 5000}); err != nil {
		return err
	}
	if err := r.accept(); err != nil {
		return err
	}
	return r.wantOK()
}

// norm is v as encoding/json decodes it into an any.
func norm(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out any
	json.Unmarshal(b, &out)
	return out
}

// show is v as one line of JSON with sorted keys.
func show(v any) string {
	b, _ := json.Marshal(norm(v))
	return string(b)
}
