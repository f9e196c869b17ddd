package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// CopyLoad is the app-throughput section's shipping control, run as its own
// process beside the app. For each checkpoint directory named on in (an
// absolute path a line) it copies into dst the regular files it has not
// copied before with the same name and size (an engine names each new SST
// anew; the MANIFEST and the WAL tail grow), deletes the copies of files
// the directory no longer has (dst holds one checkpoint, not the history
// of every file the engine wrote: tmpfs is memory), removes the directory
// before it, as an agent removes the local copy a newer checkpoint
// replaces (the last one goes when in ends), and then writes "BYTES PATH"
// on out. Every byte a checkpoint adds is read once and written once, and
// nothing else is done: no hashing, no listing of storage, no manifest, no
// record. An agent shipping the same files to the same place does at least
// this.
//
// It stops at the end of in or of ctx, and at the first directory it cannot
// read or copy (the error names it).
func CopyLoad(ctx context.Context, dst string, in io.Reader, out io.Writer) error {
	if !filepath.IsAbs(dst) {
		return fmt.Errorf("copy load: destination %q: want an absolute path", dst)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("copy load: %w", err)
	}
	copied := map[string]int64{} // name -> size of the copy in dst
	prev := ""
	defer func() {
		if prev != "" {
			os.RemoveAll(prev)
		}
	}()
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		if err := ctx.Err(); err != nil {
			return err
		}
		dir := sc.Text()
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("copy load: checkpoint directory %q: want an absolute path", dir)
		}
		n, err := copyNew(ctx, dir, dst, copied)
		if err != nil {
			return fmt.Errorf("copy load: %s: %w", dir, err)
		}
		if prev != "" {
			if err := os.RemoveAll(prev); err != nil {
				return fmt.Errorf("copy load: %w", err)
			}
		}
		prev = dir
		// The answer comes last: once it is read, this directory's work is
		// done.
		if _, err := fmt.Fprintf(out, "%d %s\n", n, dir); err != nil {
			return fmt.Errorf("copy load: %w", err)
		}
	}
	return sc.Err()
}

// copyNew copies the regular files of dir that copied does not hold at
// their size into dst, records them, deletes from dst (and copied) what dir
// does not hold, and returns the bytes copied.
func copyNew(ctx context.Context, dir, dst string, copied map[string]int64) (int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var total int64
	keep := map[string]bool{}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		if !e.Type().IsRegular() {
			continue
		}
		keep[e.Name()] = true
		fi, err := e.Info()
		if err != nil {
			return total, err
		}
		if size, ok := copied[e.Name()]; ok && size == fi.Size() {
			continue
		}
		n, err := copyFile(filepath.Join(dir, e.Name()), filepath.Join(dst, e.Name()))
		if err != nil {
			return total, err
		}
		if n != fi.Size() {
			return total, fmt.Errorf("%s: copied %d bytes of %d: checkpoint files must not change", e.Name(), n, fi.Size())
		}
		copied[e.Name()] = n
		total += n
	}
	for name := range copied {
		if !keep[name] {
			if err := os.Remove(filepath.Join(dst, name)); err != nil {
				return total, err
			}
			delete(copied, name)
		}
	}
	return total, nil
}

func copyFile(src, dst string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	return n, errors.Join(err, out.Close())
}

// copyLoadProc is a running `ckpt-bench --copy-load`, started by the bench.
type copyLoadProc struct {
	pid   int
	stdin io.WriteCloser
	stop  func()

	mu      sync.Mutex
	waiting []chan copyAck // in the order the directories were sent
	err     error          // why the process ended, once it has
}

type copyAck struct {
	bytes int64
	err   error
}

// startCopyLoad starts `exe --copy-load dst` (exe: ckpt-bench) at the
// given nice value.
func startCopyLoad(exe, dst string, nice int) (*copyLoadProc, error) {
	cmd := exec.Command(exe, "--copy-load", dst)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := startNice(cmd, nice); err != nil {
		return nil, fmt.Errorf("start %s --copy-load: %w", exe, err)
	}
	p := &copyLoadProc{pid: cmd.Process.Pid, stdin: stdin}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ack copyAck
			if _, err := fmt.Sscanf(sc.Text(), "%d ", &ack.bytes); err != nil {
				ack.err = fmt.Errorf("copy load: unexpected answer %q", sc.Text())
			}
			p.mu.Lock()
			if len(p.waiting) == 0 {
				p.mu.Unlock()
				continue
			}
			ch := p.waiting[0]
			p.waiting = p.waiting[1:]
			p.mu.Unlock()
			ch <- ack
		}
		// Its output ended: the process did. Whoever still waits learns why.
		err := cmd.Wait()
		p.mu.Lock()
		defer p.mu.Unlock()
		p.err = errors.New("copy load: ended")
		if err != nil {
			p.err = fmt.Errorf("copy load: %w: %s", err, strings.TrimSpace(stderr.String()))
		}
		for _, ch := range p.waiting {
			ch <- copyAck{err: p.err}
		}
		p.waiting = nil
	}()
	// stop ends the process (the end of its input) and waits for it.
	p.stop = func() {
		stdin.Close()
		<-read
	}
	return p, nil
}

// send hands dir to the process; the channel receives its answer.
func (p *copyLoadProc) send(dir string) (<-chan copyAck, error) {
	ch := make(chan copyAck, 1)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return nil, p.err
	}
	if _, err := fmt.Fprintln(p.stdin, dir); err != nil {
		return nil, fmt.Errorf("copy load: %w", err)
	}
	p.waiting = append(p.waiting, ch)
	return ch, nil
}
