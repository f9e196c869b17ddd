package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/protocol"
)

// fakeAgent accepts one connection on a socket and answers each request
// line with answer; it records the lines.
func fakeAgent(t *testing.T, answer func(req map[string]any) []string) (string, chan string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "a.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		c, err := l.Accept()
		l.Close()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewScanner(c)
		for r.Scan() {
			lines <- r.Text()
			var req map[string]any
			json.Unmarshal(r.Bytes(), &req)
			for _, ev := range answer(req) {
				c.Write([]byte(ev + "\n"))
			}
		}
	}()
	return sock, lines
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRequestsOnTheWire(t *testing.T) {
	sock, lines := fakeAgent(t, func(req map[string]any) []string {
		id, _ := json.Marshal(req["id"])
		switch req["op"] {
		case "hello":
			return []string{`{"event":"hello","id":` + string(id) + `,"protocol":1,"version":"v"}`}
		case "status":
			return []string{`{"event":"error","id":` + string(id) + `,"error":{"code":"bad_request","message":"bad task"}}`}
		case "checkpoint":
			return []string{
				`{"event":"synced","id":` + string(id) + `,"task":"t","checkpoint":2,"sync_ms":0}`,
				`{"event":"completed","id":` + string(id) + `,"task":"t","checkpoint":2,"checkpoint_size":5,"full_size":9,"files_uploaded":1,"files_reused":0,"duration_ms":3}`,
			}
		}
		return nil
	})
	c, err := Dial(ctxT(t), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ev, err := c.Hello(ctxT(t))
	if err != nil || ev.Protocol != protocol.ProtocolVersion || ev.Version != "v" || !strings.Contains(string(ev.Raw), `"version":"v"`) {
		t.Fatalf("hello: %+v %v", ev, err)
	}
	if got := <-lines; got != `{"op":"hello","id":"c1"}` {
		t.Errorf("hello request %s", got)
	}
	_, err = c.Status(ctxT(t), "-x")
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != protocol.CodeBadRequest || ce.Message != "bad task" {
		t.Fatalf("status error %v", err)
	}
	if got := <-lines; got != `{"op":"status","id":"c2","task":"-x"}` {
		t.Errorf("status request %s", got)
	}
	p, err := c.Send(ctxT(t), Request{Op: "ignored", Task: "t", Checkpoint: 2, Dir: "/d", Engine: "pebble", Handoff: true, Target: "/x", Traceparent: "tp"})
	if err != nil {
		t.Fatal(err)
	}
	if got := <-lines; got != `{"op":"checkpoint","id":"c3","task":"t","checkpoint":2,"dir":"/d","engine":"pebble","handoff":true,"traceparent":"tp"}` {
		t.Errorf("checkpoint request %s", got)
	}
	ev, err = p.Wait(ctxT(t))
	if err != nil || ev.Event != "completed" || ev.CheckpointSize != 5 || ev.FullSize != 9 || ev.FilesUploaded != 1 || ev.DurationMS != 3 || p.Synced.Event != "synced" {
		t.Fatalf("completed %+v %v", ev, err)
	}
}

func TestNumericIDsAreRouted(t *testing.T) {
	if got := idKey(json.Number("12")); got != "12" {
		t.Errorf("json.Number id: %q", got)
	}
	if got := idKey("c4"); got != "c4" {
		t.Errorf("string id: %q", got)
	}
	if got := idKey(nil); got != "" {
		t.Errorf("no id: %q", got)
	}
}

// The client links no engine: apps on other engines must not pay for Pebble.
func TestTheClientLinksNoEngine(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch dep {
		case "github.com/ckpt-io/ckpt/client", "github.com/ckpt-io/ckpt/protocol", "github.com/ckpt-io/ckpt/internal/names":
		default:
			t.Errorf("package client depends on %s: it may use the standard library and package protocol (with its name checks) only", dep)
		}
	}
}
