package agent

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/storage"
)

// flakyListener fails every Accept with EMFILE while fail is set, as a
// process out of file descriptors does.
type flakyListener struct {
	net.Listener
	fail     atomic.Bool
	failures atomic.Int64
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fail.Load() {
		l.failures.Add(1)
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestAcceptErrorsAreRetriedAndMakeTheAgentUnready: running out of file
// descriptors does not stop the agent for good. Accepts are retried with
// backoff, /readyz fails meanwhile, and once descriptors are free again the
// agent serves the connection that waited and is ready again.
func TestAcceptErrorsAreRetriedAndMakeTheAgentUnready(t *testing.T) {
	fl := &flakyListener{}
	fl.fail.Store(true)
	logs := &logSink{}
	h := start(t, nil, func(c *Config) {
		c.Logger = logs.logger()
		c.wrapListener = func(l net.Listener) net.Listener { fl.Listener = l; return fl }
	})
	time.Sleep(300 * time.Millisecond)
	if n := fl.failures.Load(); n < 2 || n > 15 {
		t.Errorf("%d accepts in 300ms of EMFILE: want a few, retried with backoff from 5ms", n)
	}
	err := h.a.ReadyCheck(ctxT(t))
	if err == nil || !strings.Contains(err.Error(), "cannot accept connections") || !strings.Contains(err.Error(), "too many open files") {
		t.Errorf("ReadyCheck while accepts fail: %v", err)
	}
	if n := len(logs.records("accept failed: the socket takes no connections; retrying")); n != 1 {
		t.Errorf("%d accept failures logged in 300ms, want 1 (rate-limited):\n%s", n, logs)
	}

	r := h.raw() // waits in the backlog
	replied := make(chan map[string]any, 1)
	go func() { replied <- r.send(`{"op":"hello"}`) }()
	fl.fail.Store(false)
	select {
	case ev := <-replied:
		if ev["event"] != "hello" {
			t.Fatalf("hello after accepts recovered: %v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the agent does not serve after accepts stopped failing")
	}
	if err := h.a.ReadyCheck(ctxT(t)); err != nil {
		t.Errorf("ReadyCheck after accepts recovered: %v", err)
	}
	if len(logs.records("accepting connections again")) != 1 {
		t.Errorf("recovery not logged:\n%s", logs)
	}
}

// TestIdleConnectionsAreClosedButNotOnesAwaitingAReply: a connection that
// sends nothing is closed after the idle timeout; one whose checkpoint is
// still in its async phase is kept open until the checkpoint ends, then
// idles like any other.
func TestIdleConnectionsAreClosedButNotOnesAwaitingAReply(t *testing.T) {
	const idle = 200 * time.Millisecond
	var g *gate
	h := start(t, func(s storage.Store) storage.Store { g = newGate(s); return g }, func(c *Config) { c.IdleTimeout = idle })
	dir := h.snapshot("s", map[string]int{"000001.sst": 1000, "CURRENT": 10})

	quiet := h.raw()
	quiet.send(`{"op":"hello"}`)
	start := time.Now()
	quiet.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := quiet.r.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection: read %v, want EOF (closed by the agent)", err)
	}
	if el := time.Since(start); el < idle-20*time.Millisecond {
		t.Fatalf("idle connection closed after %v, before the %v idle timeout", el, idle)
	}

	busy := h.raw()
	if ev := busy.send(`{"op":"checkpoint","task":"t","checkpoint":1,"dir":"` + dir + `"}`); ev["event"] != "synced" {
		t.Fatalf("checkpoint: %v", ev)
	}
	<-g.entered
	time.Sleep(4 * idle)
	g.release()
	if ev := busy.next(); ev["event"] != "completed" {
		t.Fatalf("a connection awaiting its checkpoint: %v, want completed", ev)
	}
	busy.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := busy.r.ReadByte(); err != io.EOF {
		t.Fatalf("connection idle after its checkpoint: read %v, want EOF", err)
	}
}

// TestConnectionsBeyondTheLimitAreRefused: beyond MaxConnections a new
// connection gets one unavailable error and is closed; once one closes,
// a new one is served.
func TestConnectionsBeyondTheLimitAreRefused(t *testing.T) {
	h := start(t, nil, func(c *Config) { c.MaxConnections = 2 })
	r1, r2 := h.raw(), h.raw()
	r1.send(`{"op":"hello"}`)
	r2.send(`{"op":"hello"}`)
	r3 := h.raw()
	r3.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	ev := r3.next()
	msg, _ := ev["error"].(map[string]any)["message"].(string)
	if ev["event"] != "error" || code(ev) != "unavailable" || !strings.Contains(msg, "too many connections") {
		t.Fatalf("third connection of two allowed: %v", ev)
	}
	if _, err := r3.r.ReadByte(); err != io.EOF {
		t.Fatalf("refused connection: read %v, want EOF", err)
	}
	r1.c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		line, err := helloLine(h.socket)
		if err == nil && strings.Contains(line, `"event":"hello"`) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("after a connection closed, a new one still gets %q, %v", line, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPeersNotAllowedAreForbidden: with --allow-uid/--allow-gid only the
// listed users and groups may connect; another peer gets forbidden and is
// disconnected, and the refusal is logged with its credentials.
func TestPeersNotAllowedAreForbidden(t *testing.T) {
	other := uint32(os.Getuid()) + 1
	logs := &logSink{}
	h := start(t, nil, func(c *Config) {
		c.AllowUIDs, c.AllowGIDs, c.Logger = []uint32{other}, []uint32{uint32(os.Getgid()) + 1}, logs.logger()
	})
	r := h.raw()
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if ev := r.next(); ev["event"] != "error" || code(ev) != "forbidden" {
		t.Fatalf("a peer not allowed: %v, want forbidden", ev)
	}
	if _, err := r.r.ReadByte(); err != io.EOF {
		t.Fatalf("forbidden connection: read %v, want EOF", err)
	}
	recs := logs.records("connection refused")
	if len(recs) != 1 || recs[0]["code"] != "forbidden" || recs[0]["level"] != "WARN" {
		t.Fatalf("refusal logged as %v:\n%s", recs, logs)
	}
	requirePeer(t, recs[0])

	for _, allow := range []func(*Config){
		func(c *Config) { c.AllowUIDs = []uint32{other, uint32(os.Getuid())} },
		func(c *Config) { c.AllowUIDs, c.AllowGIDs = []uint32{other}, []uint32{uint32(os.Getgid())} },
	} {
		h := start(t, nil, allow)
		if ev := h.raw().send(`{"op":"hello"}`); ev["event"] != "hello" {
			t.Fatalf("an allowed peer: %v", ev)
		}
	}
}

// TestAStoppingAgentClosesIdleWaitingConnections: shutdown still wakes
// readers whose idle deadline is far away.
func TestAStoppingAgentClosesIdleWaitingConnections(t *testing.T) {
	h := start(t, nil, func(c *Config) { c.IdleTimeout = time.Hour })
	r := h.raw()
	r.send(`{"op":"hello"}`)
	stopped := make(chan struct{})
	go func() { h.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent does not stop while a connection idles")
	}
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.r.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("after stop: read %v, want EOF", err)
	}
}

// helloLine sends hello on a new connection and returns the reply line.
func helloLine(socket string) (string, error) {
	c, err := net.Dial("unix", socket)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, `{"op":"hello"}`+"\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return line, err
}
