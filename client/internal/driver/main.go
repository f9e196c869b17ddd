// Command driver is the conformance driver of the Go client (package
// client): it reads one call per line on stdin and answers each with one
// line on stdout, making the call through a client.Client, as
// clients/README.md describes:
//
//	go build -o /tmp/ckpt-go-driver ./client/internal/driver
//	go run ./clients/conformance -- /tmp/ckpt-go-driver
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ckpt-io/ckpt/client"
)

type call struct {
	Call       string `json:"call"`
	Socket     string `json:"socket"`
	DialWaitMS int64  `json:"dial_wait_ms"`
	WaitMS     int64  `json:"wait_ms"`
	Task       string `json:"task"`
	Checkpoint uint64 `json:"checkpoint"`
	Dir        string `json:"dir"`
	Engine     string `json:"engine"`
	Handoff    bool   `json:"handoff"`
	TimeoutMS  uint64 `json:"timeout_ms"`
	Target     string `json:"target"`
}

type failure struct {
	Kind    string `json:"kind"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
}

// kind is the suite's name for what err is.
func kind(err error) failure {
	f := failure{Message: err.Error()}
	var ae *client.Error
	switch {
	case errors.As(err, &ae):
		f.Kind, f.Code = "agent", ae.Code
	case errors.Is(err, client.ErrAborted):
		f.Kind = "aborted"
	case errors.Is(err, client.ErrConnect):
		f.Kind = "connect"
	case errors.Is(err, client.ErrConnectionLost), errors.Is(err, client.ErrClosed):
		f.Kind = "connection"
	case errors.Is(err, context.DeadlineExceeded):
		f.Kind = "timeout"
	default:
		f.Kind = "other"
	}
	return f
}

func do(c **client.Client, cl call) (any, error) {
	ctx := context.Background()
	if cl.WaitMS > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(cl.WaitMS)*time.Millisecond)
		defer cancel()
	}
	switch cl.Call {
	case "connect":
		nc, err := client.Dial(ctx, cl.Socket, client.WithDialWait(time.Duration(cl.DialWaitMS)*time.Millisecond))
		if err != nil {
			return nil, err
		}
		*c = nc
		return map[string]bool{"ok": true}, nil
	case "close":
		if *c != nil {
			(*c).Close()
			*c = nil
		}
		return map[string]bool{"ok": true}, nil
	}
	if *c == nil {
		return nil, errors.New("no connection: call connect first")
	}
	var ev client.Event
	var err error
	switch cl.Call {
	case "hello":
		ev, err = (*c).Hello(ctx)
	case "status":
		ev, err = (*c).Status(ctx, cl.Task)
	case "abort":
		ev, err = (*c).Abort(ctx, cl.Task, cl.Checkpoint)
	case "follow":
		ev, err = (*c).Follow(ctx, cl.Task)
	case "restore":
		ev, err = (*c).Restore(ctx, client.Request{Task: cl.Task, Target: cl.Target, Checkpoint: cl.Checkpoint})
	case "checkpoint":
		var p *client.Pending
		p, err = (*c).Send(ctx, client.Request{Task: cl.Task, Checkpoint: cl.Checkpoint, Dir: cl.Dir, Engine: cl.Engine,
			Handoff: cl.Handoff, TimeoutMS: cl.TimeoutMS})
		if err == nil {
			ev, err = p.Wait(ctx)
		}
	default:
		return nil, fmt.Errorf("unknown call %q", cl.Call)
	}
	if err != nil {
		return nil, err
	}
	return map[string]json.RawMessage{"event": ev.Raw}, nil
}

func main() {
	var c *client.Client
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var cl call
		if err := json.Unmarshal(in.Bytes(), &cl); err != nil {
			fmt.Fprintln(os.Stderr, "driver:", err)
			os.Exit(2)
		}
		res, err := do(&c, cl)
		if err != nil {
			res = map[string]failure{"error": kind(err)}
		}
		if err := out.Encode(res); err != nil {
			os.Exit(1)
		}
	}
}
