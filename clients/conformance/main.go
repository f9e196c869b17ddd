// Command conformance checks that a ckpt client library speaks protocol v1
// as the agent does. It plays a scripted fake agent on a Unix socket and
// drives the client under test through a small driver program written in
// the client's language, which it starts once:
//
//	go run ./clients/conformance -- python3 clients/python/tests/driver.py
//	go run ./clients/conformance -- java -cp clients/java/build/test io.ckpt.client.ConformanceDriver
//
// The driver reads one call per line on stdin (a JSON object: "call" names
// the client method, the other fields its arguments) and answers each with
// one line on stdout: {"event": <the event returned>}, {"ok": true}, or
// {"error": {"kind": ..., "code": ..., "message": ...}}, where kind is
// agent (the agent's failed or error event: code is its code), aborted,
// connection (the connection was lost with the request unanswered),
// connect (the agent could not be reached before the dial deadline) or
// timeout (the caller's wait ran out). clients/README.md describes it.
//
// Each scenario checks both sides: the requests the client wrote (every
// field, and a fresh id on each), and what the client returned. The events
// are encoded by package protocol, as the agent encodes them.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"time"
)

func main() {
	runRE := flag.String("run", "", "run only the scenarios whose name matches this regular expression")
	mode := flag.String("mode", "", `passed to the driver on every call as "mode" (for example "async")`)
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: conformance [-run RE] [-mode M] -- driver-command [args...]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	failed, err := Run(flag.Args(), *mode, *runRE, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(2)
	}
	if failed > 0 {
		fmt.Printf("FAIL: %d scenarios failed\n", failed)
		os.Exit(1)
	}
	fmt.Println("PASS")
}

// Run starts the driver and runs every scenario matching runRE against it,
// writing one line per scenario to out. It returns the number that failed;
// an error means the suite could not run at all.
func Run(argv []string, mode, runRE string, out io.Writer) (int, error) {
	re, err := regexp.Compile(runRE)
	if err != nil {
		return 0, fmt.Errorf("-run: %w", err)
	}
	dir, err := os.MkdirTemp("", "ckpt-conf-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	d, err := startDriver(argv)
	if err != nil {
		return 0, err
	}
	defer d.stop()
	failed := 0
	for i, sc := range scenarios {
		if !re.MatchString(sc.name) {
			continue
		}
		r := &run{socket: filepath.Join(dir, fmt.Sprintf("s%d.sock", i)), d: d, mode: mode}
		start := time.Now()
		err := sc.play(r)
		if err == nil && !d.dead() {
			err = r.call(map[string]any{"call": "close"})
			if err == nil {
				err = r.wantOK()
			}
		}
		r.close()
		took := time.Since(start).Round(time.Millisecond)
		if err != nil {
			failed++
			fmt.Fprintf(out, "--- FAIL %s (%v): %v\n", sc.name, took, err)
			if d.dead() {
				return failed, fmt.Errorf("the driver exited: %s", d.stderr())
			}
			// The client may be stuck in the failed call: start afresh.
			d.stop()
			if d, err = startDriver(argv); err != nil {
				return failed, err
			}
			continue
		}
		fmt.Fprintf(out, "ok   %s (%v)\n", sc.name, took)
	}
	return failed, nil
}

// driver is the client's driver process.
type driver struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	lines  chan []byte
	errBuf *lockedBuf
	exited chan struct{}
}

func startDriver(argv []string) (*driver, error) {
	d := &driver{cmd: exec.Command(argv[0], argv[1:]...), lines: make(chan []byte, 1), errBuf: &lockedBuf{}, exited: make(chan struct{})}
	d.cmd.Stderr = d.errBuf
	var err error
	if d.in, err = d.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	outp, err := d.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the driver %v: %w", argv, err)
	}
	go func() {
		defer close(d.lines)
		sc := bufio.NewScanner(outp)
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			d.lines <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	go func() {
		d.cmd.Wait()
		close(d.exited)
	}()
	return d, nil
}

func (d *driver) send(cmd map[string]any) error {
	b, _ := json.Marshal(cmd)
	if _, err := d.in.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write to the driver: %w (stderr: %s)", err, d.stderr())
	}
	return nil
}

func (d *driver) recv() (map[string]any, error) {
	select {
	case line, ok := <-d.lines:
		if !ok {
			<-d.exited
			return nil, fmt.Errorf("the driver exited (%v): %s", d.cmd.ProcessState, d.stderr())
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, fmt.Errorf("the driver wrote %q, not a JSON object", line)
		}
		return m, nil
	case <-time.After(stepTimeout):
		return nil, fmt.Errorf("the client call did not return within %v", stepTimeout)
	}
}

func (d *driver) dead() bool {
	select {
	case <-d.exited:
		return true
	default:
		return false
	}
}

func (d *driver) stderr() string { return d.errBuf.String() }

// stop closes the driver's stdin (it exits at EOF) and kills it if it
// does not exit soon.
func (d *driver) stop() {
	d.in.Close()
	select {
	case <-d.exited:
	case <-time.After(5 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
	}
}

// lockedBuf collects the driver's stderr while it runs.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
