package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/internal/human"
)

// memory runs `ckpt agent` as its own process and has it upload a large
// checkpoint (StateBytes in files of up to 64 MiB, the size production LSM
// stores write, of incompressible bytes), sampling the process's RSS and
// reading its peak (VmHWM) from /proc before stopping it.
func (r *run) memory(ctx context.Context) error {
	total := r.o.StateBytes
	fileSize := min(int64(64<<20), max(int64(1<<20), total/8))
	src := filepath.Join(r.root, "rss-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(src)
	fig := &Memory{CheckpointBytes: total, FileBytes: fileSize, Scaled: total < 4<<30}
	rng := rand.NewChaCha8([32]byte{42})
	buf := make([]byte, 1<<20)
	for i := 0; int64(i)*fileSize < total; i++ {
		n := min(fileSize, total-int64(i)*fileSize)
		f, err := os.Create(filepath.Join(src, fmt.Sprintf("%06d.sst", i+1)))
		if err != nil {
			return err
		}
		for w := int64(0); w < n; {
			c := buf[:min(int64(len(buf)), n-w)]
			rng.Read(c)
			if _, err := f.Write(c); err != nil {
				f.Close()
				return err
			}
			w += int64(len(c))
		}
		if err := f.Close(); err != nil {
			return err
		}
		fig.Files++
	}
	os.WriteFile(filepath.Join(src, "MANIFEST-000001"), buf[:4096], 0o644)
	os.WriteFile(filepath.Join(src, "CURRENT"), []byte("MANIFEST-000001\n"), 0o644)
	fig.Files += 2
	fig.CheckpointBytes += 4096 + 16

	sc, err := r.sidecar(ctx, "rss", 0)
	if err != nil {
		return err
	}
	defer sc.stop()
	c, pid, agentLog := sc.client, sc.pid, sc.log

	fig.BaselineRSS, _ = procStatus(pid, "VmRSS")

	var mu sync.Mutex
	var peak int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if v, err := procStatus(pid, "VmRSS"); err == nil {
				mu.Lock()
				peak = max(peak, v)
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	t0 := time.Now()
	p, err := c.Checkpoint(ctx, "rss-0", 1, src, "pebble")
	if err == nil {
		_, err = p.Wait(ctx)
	}
	d := time.Since(t0)
	close(stop)
	wg.Wait()
	if err != nil {
		return fmt.Errorf("large checkpoint: %w (agent log: %s)", err, agentLog())
	}
	hwm, herr := procStatus(pid, "VmHWM")
	if herr != nil {
		return herr
	}
	fig.PeakRSSBytes = max(hwm, peak)
	fig.UploadMS = ms(d)
	fig.UploadBytesPerS = round(float64(fig.CheckpointBytes)/d.Seconds(), 5)
	r.rep.Memory = fig
	r.logf("memory: peak RSS %s uploading %s (%s)", human.Bytes(fig.PeakRSSBytes), human.Bytes(total), rate(fig.UploadBytesPerS))
	return nil
}

// procStatus reads a "kB" field of /proc/<pid>/status, in bytes.
func procStatus(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && k == field {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no " + field + " in /proc status")
}

// rssPeaks samples a process's memory every 20 ms until stop is first
// called, and stop returns the peaks: VmHWM (the kernel's high-water mark of its RSS) and
// the highest RssAnon seen, its own memory without the file pages it maps.
// Those file pages are mostly the ckpt binary's (86 MB), shared with every
// other ckpt process and reclaimable: an idle agent's RSS here is 37 to 56
// MB of them and 6.5 MB of its own.
func rssPeaks(pid int) (stop func() (hwm, anon int64)) {
	var peakHWM, peakAnon atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	sample := func() {
		if v, err := procStatus(pid, "VmHWM"); err == nil {
			peakHWM.Store(max(peakHWM.Load(), v))
		}
		if v, err := procStatus(pid, "RssAnon"); err == nil {
			peakAnon.Store(max(peakAnon.Load(), v))
		}
	}
	wg.Go(func() {
		for {
			sample()
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	var once sync.Once
	return func() (int64, int64) {
		once.Do(func() {
			sample()
			close(done)
			wg.Wait()
		})
		return peakHWM.Load(), peakAnon.Load()
	}
}

// sidecarAgent is a `ckpt agent` run as its own process, as it is deployed.
type sidecarAgent struct {
	client *client.Client
	pid    int
	log    func() string
	stop   func()
}

// sidecar starts `ckpt agent` as a separate process on the bench's storage,
// at the given nice value (0: the app's priority), and connects to it.
func (r *run) sidecar(ctx context.Context, name string, nice int) (*sidecarAgent, error) {
	return r.sidecarOn(ctx, name, nice, r.storageURL(), nil)
}

// storageURL is the bench's storage for child processes.
func (r *run) storageURL() string {
	if r.tgt.url != "" {
		return r.tgt.url
	}
	return r.o.Storage
}

// sidecarOn is sidecar on storage url, with env (nil: the target's) added
// to the agent's environment.
func (r *run) sidecarOn(ctx context.Context, name string, nice int, url string, env []string) (*sidecarAgent, error) {
	dir := filepath.Join(r.root, "agents", name)
	if err := os.MkdirAll(filepath.Join(dir, "local"), 0o755); err != nil {
		return nil, err
	}
	sock, err := shortSocket(dir)
	if err != nil {
		return nil, err
	}
	if env == nil {
		env = r.tgt.env
	}
	args := []string{"agent", "--socket", sock, "--storage", url, "--job", "bench-" + r.id + "-" + name,
		"--local-dir", filepath.Join(dir, "local"), "--allow-root", r.root, "--log-level", "warn"}
	if strings.HasPrefix(url, "file://") {
		args = append(args, "--create-storage") // the bench's file store may not exist yet
	}
	if r.o.AgentMetricsAddr != "" && (name == "rss" || strings.HasPrefix(name, "scale-")) {
		args = append(args, "--metrics-addr", r.o.AgentMetricsAddr, "--pprof")
	}
	exe, err := r.ckptExe(ctx)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), env...)
	logPath := filepath.Join(r.root, "agent-"+name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := startNice(cmd, nice); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s agent: %w", exe, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	agentLog := func() string { b, _ := os.ReadFile(logPath); return strings.TrimSpace(string(b)) }
	sc := &sidecarAgent{pid: cmd.Process.Pid, log: agentLog}
	sc.stop = func() {
		if sc.client != nil {
			sc.client.Close()
		}
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if sc.client, err = client.Dial(ctx, sock); err == nil {
			break
		}
		select {
		case <-exited:
			sc.stop()
			return nil, fmt.Errorf("ckpt agent exited at start: %s", agentLog())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			sc.stop()
			return nil, fmt.Errorf("ckpt agent not serving after 30s: %s", agentLog())
		}
	}
	if _, err := sc.client.Hello(ctx); err != nil {
		sc.stop()
		return nil, err
	}
	return sc, nil
}
