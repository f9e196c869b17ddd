package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/gc"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// ScaleObjects is one job size of the listing curve: a job of Objects
// shared objects on S3, of which Live are referenced by the retained
// checkpoints of Tasks tasks (two each; neighbouring checkpoints of a task
// share most of their objects) and the rest are garbage older than the
// grace period. GC, `ckpt list` and `ckpt verify` run against it as child
// processes, through a proxy that counts their requests.
type ScaleObjects struct {
	Objects     int   `json:"objects"`
	Live        int   `json:"live"`
	Garbage     int   `json:"garbage"`
	Tasks       int   `json:"tasks"`
	Checkpoints int   `json:"checkpoints"`
	ObjectBytes int64 `json:"object_bytes"`
	// References is the files the retained manifests name (shared objects
	// counted once per manifest).
	References int `json:"references"`
	// Seed says how the objects were stored, SeedMS how long it took.
	Seed   string  `json:"seed"`
	SeedMS float64 `json:"seed_ms"`
	// ListingMS is the control: one listing of the job's shared objects by
	// this process, through the same proxy (ListingRequests requests).
	ListingMS       float64 `json:"listing_ms"`
	ListingRequests int64   `json:"listing_requests"`
	// Commands are the ckpt commands run against the job, in order.
	Commands []ScaleCommand `json:"commands"`
	// Agent is a `ckpt agent` process of the job (after the collections:
	// Live objects in it) taking two checkpoints of a small task of its
	// own, then its job-wide GC sweep.
	Agent *ScaleAgent `json:"agent"`
}

// ScaleAgent is an agent's cost in a large job.
type ScaleAgent struct {
	// CheckpointMS is the end-to-end time of each checkpoint.
	CheckpointMS []float64 `json:"checkpoint_ms"`
	// SweepMS is the time from the last checkpoint's completion to the end
	// of the agent's GC sweep (0 when the sweep was not seen).
	SweepMS float64 `json:"sweep_ms"`
	// PeakRSSBytes is the agent's RSS high-water mark (VmHWM) at the end;
	// PeakAnonBytes the highest RssAnon read every 20 ms from its start (its
	// own memory, without the pages of the binary: see rssPeaks).
	PeakRSSBytes  int64 `json:"peak_rss_bytes"`
	PeakAnonBytes int64 `json:"peak_anon_bytes"`
}

// ScaleCommand is one ckpt command run against a scale job.
type ScaleCommand struct {
	// Name is "list", "verify", "gc (marks)" or "gc (deletes)".
	Name string   `json:"name"`
	Args []string `json:"args"`
	MS   float64  `json:"ms"`
	// Requests counts the requests it sent, by kind (GET, HEAD, PUT,
	// DELETE, LIST, POST, ...), and RequestsTotal all of them.
	Requests      map[string]int64 `json:"requests"`
	RequestsTotal int64            `json:"requests_total"`
	// MaxRSSBytes is the process's peak RSS (VmHWM, read every 20 ms: a
	// peak in the last 20 ms of its life can be missed).
	MaxRSSBytes int64 `json:"max_rss_bytes"`
	// MaxAnonBytes is the highest RssAnon seen in those reads: the
	// process's own memory, without the pages of the ckpt binary it maps
	// from the page cache (see rssPeaks).
	MaxAnonBytes int64 `json:"max_anon_bytes"`
	// Result is the command's --json output.
	Result json.RawMessage `json:"result"`
}

// scaleObjectBytes is the size of every object of a scale job: small, so
// that a million fit, and distinct.
const scaleObjectBytes = 512

// scaleTasks is the tasks of a scale job.
const scaleTasks = 4

// scaleObjects builds a job of n objects and runs GC, list and verify on it.
func (r *run) scaleObjects(ctx context.Context, n int) (*ScaleObjects, error) {
	live := n * 9 / 10
	fig := &ScaleObjects{Objects: n, Live: live, Garbage: n - live, Tasks: scaleTasks, Checkpoints: 2 * scaleTasks, ObjectBytes: scaleObjectBytes, Commands: []ScaleCommand{}}
	job := r.jobName(fmt.Sprintf("objects-%d", n))
	st, err := r.tgt.open(ctx)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	t0 := time.Now()
	if err := r.seedObjects(ctx, st, job, fig); err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	fig.SeedMS = ms(time.Since(t0))
	r.logf("scale: job of %d objects (%d live in %d checkpoints, %d references) seeded in %.1f s (%s)", n, live, fig.Checkpoints, fig.References, fig.SeedMS/1000, fig.Seed)

	px, err := startCountingProxy(r.tgt.endpoint)
	if err != nil {
		return nil, err
	}
	defer px.close()
	u, err := url.Parse(r.storageURL())
	if err != nil {
		return nil, err
	}
	q := u.Query()
	q.Set("endpoint", px.url)
	u.RawQuery = q.Encode()
	storageURL := u.String()

	// The control: one listing of the shared objects, through the proxy.
	pst, err := openS3At(ctx, r.tgt, px.url)
	if err != nil {
		return nil, err
	}
	px.reset()
	t0 = time.Now()
	listed := 0
	err = pst.List(ctx, manifests.SharedPrefix(job), func(storage.ObjectInfo) error { listed++; return nil })
	fig.ListingMS = ms(time.Since(t0))
	pst.Close()
	if err != nil {
		return nil, fmt.Errorf("list the shared objects: %w", err)
	}
	_, fig.ListingRequests = px.counts()
	if listed != n {
		return nil, fmt.Errorf("listing found %d shared objects, seeded %d", listed, n)
	}
	r.logf("scale: %d objects listed in %.1f s (%d requests)", listed, fig.ListingMS/1000, fig.ListingRequests)

	common := []string{"--storage", storageURL, "--job", job, "--json"}
	// GC marks the garbage in one collection and deletes it in the next
	// (the mark delay is lowered to 0 for the bench, as tests do).
	gcEnv := []string{gc.UnsafeMarkDelayEnv + "=0s"}
	for _, c := range []struct {
		name string
		args []string
		env  []string
	}{
		{"list", append([]string{"list"}, common...), nil},
		{"verify", append([]string{"verify", "--parallelism", "8"}, common...), nil},
		{"gc (marks)", append([]string{"gc", "--grace", "1h"}, common...), gcEnv},
		{"gc (deletes)", append([]string{"gc", "--grace", "1h"}, common...), gcEnv},
	} {
		if c.name == "verify" && r.o.ScaleNoVerify {
			continue
		}
		cmd, err := r.runCounted(ctx, px, c.name, c.args, c.env)
		if err != nil {
			return nil, err
		}
		fig.Commands = append(fig.Commands, *cmd)
		r.logf("scale: %d objects: ckpt %s: %.1f s, %d requests %v, max RSS %.1f MiB (anon %.1f MiB)", n, c.name, cmd.MS/1000, cmd.RequestsTotal, cmd.Requests, float64(cmd.MaxRSSBytes)/(1<<20), float64(cmd.MaxAnonBytes)/(1<<20))
	}
	if err := checkScaleResults(fig); err != nil {
		return nil, err
	}
	if fig.Agent, err = r.scaleAgent(ctx, st, n, job); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	r.logf("scale: %d objects: agent checkpoints %v ms, GC sweep %.1f s, peak RSS %.1f MiB (anon %.1f MiB)", n, fig.Agent.CheckpointMS, fig.Agent.SweepMS/1000, float64(fig.Agent.PeakRSSBytes)/(1<<20), float64(fig.Agent.PeakAnonBytes)/(1<<20))
	return fig, nil
}

// scaleAgent runs a `ckpt agent` process on the scale job: two checkpoints
// of a task of ten small files (the second reusing the first's), each
// followed by nothing the app waits for but the agent's job-wide GC sweep,
// whose end it waits for (the sweep deletes its clock probe when done).
func (r *run) scaleAgent(ctx context.Context, st storage.Store, n int, job string) (*ScaleAgent, error) {
	fig := &ScaleAgent{CheckpointMS: []float64{}}
	sc, err := r.sidecar(ctx, fmt.Sprintf("objects-%d", n), 10)
	if err != nil {
		return nil, err
	}
	defer sc.stop()
	peaks := rssPeaks(sc.pid)
	defer func() { peaks() }()
	if r.jobName(fmt.Sprintf("objects-%d", n)) != job {
		return nil, fmt.Errorf("the agent's job is not %s", job)
	}
	src := filepath.Join(r.root, fmt.Sprintf("objects-%d-src", n))
	if err := os.MkdirAll(src, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(src)
	buf := make([]byte, 4096)
	rng := rand.NewChaCha8([32]byte{'a', byte(n), byte(n >> 8), byte(n >> 16)})
	clock := gc.Prefix(job) + "clock"
	var done time.Time
	for k := 1; k <= 2; k++ {
		dir := filepath.Join(src, fmt.Sprintf("snap-%d", k))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		for i := range 10 {
			rng.Read(buf)
			if k == 2 && i < 9 { // the second checkpoint adds one file
				b, err := os.ReadFile(filepath.Join(src, "snap-1", fmt.Sprintf("%06d.sst", i)))
				if err != nil {
					return nil, err
				}
				copy(buf, b)
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%06d.sst", i)), buf, 0o644); err != nil {
				return nil, err
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "CURRENT"), []byte("MANIFEST-000001\n"), 0o644); err != nil {
			return nil, err
		}
		t0 := time.Now()
		p, err := sc.client.Checkpoint(ctx, "agent-task", uint64(k), dir, "pebble")
		if err == nil {
			_, err = p.Wait(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("checkpoint %d: %w (agent log: %s)", k, err, sc.log())
		}
		fig.CheckpointMS = append(fig.CheckpointMS, ms(time.Since(t0)))
		done = time.Now()
	}
	// The sweep started with the first completion; wait for its probe to go.
	seen := false
	for deadline := time.Now().Add(30 * time.Minute); time.Now().Before(deadline); {
		_, err := st.Stat(ctx, clock)
		switch {
		case err == nil:
			seen = true
		case errors.Is(err, storage.ErrNotFound):
			if seen || time.Since(done) > 10*time.Second {
				deadline = time.Time{}
				continue
			}
		default:
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	if seen {
		fig.SweepMS = ms(time.Since(done))
	}
	if fig.PeakRSSBytes, fig.PeakAnonBytes = peaks(); fig.PeakRSSBytes == 0 {
		return nil, fmt.Errorf("the agent's memory could not be read from /proc")
	}
	return fig, nil
}

// checkScaleResults checks what the commands reported against the job.
func checkScaleResults(fig *ScaleObjects) error {
	for _, c := range fig.Commands {
		switch c.Name {
		case "list":
			var out []json.RawMessage
			if err := json.Unmarshal(c.Result, &out); err != nil || len(out) != fig.Checkpoints {
				return fmt.Errorf("ckpt list listed %d checkpoints (%v), want %d", len(out), err, fig.Checkpoints)
			}
		case "verify":
			var out struct {
				Objects int  `json:"objects"`
				OK      bool `json:"ok"`
			}
			if err := json.Unmarshal(c.Result, &out); err != nil || !out.OK || out.Objects != fig.Live {
				return fmt.Errorf("ckpt verify: ok %v, %d objects read (%v), want ok and %d", out.OK, out.Objects, err, fig.Live)
			}
		case "gc (marks)", "gc (deletes)":
			var out gc.Report
			if err := json.Unmarshal(c.Result, &out); err != nil {
				return fmt.Errorf("ckpt %s: %w", c.Name, err)
			}
			want := gc.Report{LiveObjects: fig.Live, MarkedObjects: fig.Garbage}
			if c.Name == "gc (deletes)" {
				// A collection sends deletes for at most 5 minutes after it
				// takes the lock; what it could not delete is pending for
				// the next one.
				want = gc.Report{LiveObjects: fig.Live, DeletedObjects: fig.Garbage - out.PendingObjects}
			}
			if out.LiveObjects != want.LiveObjects || out.MarkedObjects != want.MarkedObjects || out.DeletedObjects != want.DeletedObjects ||
				(c.Name == "gc (deletes)" && out.DeletedObjects == 0) {
				return fmt.Errorf("ckpt %s: %d live, %d marked, %d deleted, %d pending; want %d live, %d marked, %d deleted", c.Name,
					out.LiveObjects, out.MarkedObjects, out.DeletedObjects, out.PendingObjects, want.LiveObjects, want.MarkedObjects, want.DeletedObjects)
			}
		}
	}
	return nil
}

// runCounted runs `ckpt args...` with env added, counting its requests.
func (r *run) runCounted(ctx context.Context, px *countingProxy, name string, args, env []string) (*ScaleCommand, error) {
	exe, err := r.ckptExe(ctx)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(append(os.Environ(), r.tgt.env...), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	px.reset()
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("ckpt %s: %w", name, err)
	}
	// The peak RSS is the child's VmHWM, read every 20 ms until it exits.
	// Not getrusage's maxrss: Linux carries the high-water mark of the
	// address space a child is exec'd from (Go starts children with
	// CLONE_VM, so the bench's own) into the child's maxrss.
	stop := rssPeaks(cmd.Process.Pid)
	err = cmd.Wait()
	d := time.Since(t0)
	hwm, anon := stop()
	if err != nil {
		return nil, fmt.Errorf("ckpt %s: %v: %s", name, err, strings.TrimSpace(stderr.String()))
	}
	c := &ScaleCommand{Name: name, Args: args, MS: ms(d), Result: json.RawMessage(bytes.TrimSpace(stdout.Bytes()))}
	c.Requests, c.RequestsTotal = px.counts()
	c.MaxRSSBytes, c.MaxAnonBytes = hwm, anon
	return c, nil
}

// seedObjects stores the job's objects and commits its manifests. With the
// bench's own versitygw the objects are written as files into its posix
// directory (as versitygw stores them: one file per key; the etag it keeps
// in an extended attribute is not needed to read, list or delete them),
// else by PUTs, 16 at a time. The garbage objects are made two days old.
func (r *run) seedObjects(ctx context.Context, st storage.Store, job string, fig *ScaleObjects) error {
	posix := ""
	if r.tgt.pid != 0 && r.tgt.dataDir != "" {
		posix = filepath.Join(r.tgt.dataDir, r.tgt.bucket)
		fig.Seed = "files written into versitygw's posix directory"
	} else {
		fig.Seed = "PUTs, 16 at a time"
	}
	old := time.Now().Add(-48 * time.Hour)
	// content returns object i: its index, then bytes from a stream seeded by it.
	content := func(i int, buf []byte) {
		var seed [32]byte
		binary.LittleEndian.PutUint64(seed[:], uint64(i))
		copy(seed[8:], job)
		rand.NewChaCha8(seed).Read(buf)
		binary.LittleEndian.PutUint64(buf, uint64(i))
	}
	// write stores objects [lo, hi) and returns their SHA-256s.
	write := func(lo, hi int, garbage bool) ([]string, error) {
		shas := make([]string, hi-lo)
		g, gctx := errgroup.WithContext(ctx)
		workers := 16
		if posix != "" {
			workers = 4
		}
		var next atomic.Int64
		next.Store(int64(lo))
		for range workers {
			g.Go(func() error {
				buf := make([]byte, scaleObjectBytes)
				for {
					i := int(next.Add(1) - 1)
					if i >= hi || gctx.Err() != nil {
						return gctx.Err()
					}
					content(i, buf)
					sum := sha256.Sum256(buf)
					sha := hex.EncodeToString(sum[:])
					shas[i-lo] = sha
					key := manifests.SharedKey(job, sha, scaleObjectBytes)
					if posix == "" {
						if err := st.Put(gctx, key, bytes.NewReader(buf), scaleObjectBytes); err != nil {
							return err
						}
						continue
					}
					p := filepath.Join(posix, filepath.FromSlash(key))
					if err := os.WriteFile(p, buf, 0o644); err != nil {
						if !errors.Is(err, os.ErrNotExist) {
							return err
						}
						if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
							return err
						}
						if err := os.WriteFile(p, buf, 0o644); err != nil {
							return err
						}
					}
					if garbage {
						if err := os.Chtimes(p, old, old); err != nil {
							return err
						}
					}
				}
			})
		}
		return shas, g.Wait()
	}
	if posix == "" && fig.Garbage > 0 {
		fig.Seed += "; the garbage is young (PUTs set the time), so GC keeps it"
	}
	// Garbage first: objects no manifest names.
	if _, err := write(fig.Live, fig.Objects, true); err != nil {
		return err
	}
	per := fig.Live / scaleTasks
	for t := range scaleTasks {
		lo, hi := t*per, (t+1)*per
		if t == scaleTasks-1 {
			hi = fig.Live
		}
		shas, err := write(lo, hi, false)
		if err != nil {
			return err
		}
		// Checkpoint 1 names the first 90% of the task's objects,
		// checkpoint 2 the last 90%: they share 80%.
		cut := (hi - lo) / 10
		task := fmt.Sprintf("task-%d", t)
		for c, span := range [][2]int{{0, hi - lo - cut}, {cut, hi - lo}} {
			m := &manifests.Manifest{Job: job, Task: task, Checkpoint: uint64(c + 1), Created: time.Now().UTC(), Engine: "pebble", AgentID: "bench"}
			if c == 1 {
				m.Parent = 1
			}
			for i := span[0]; i < span[1]; i++ {
				m.Files = append(m.Files, manifests.File{Name: fmt.Sprintf("%07d.sst", i+1), Kind: manifests.Shared, Size: scaleObjectBytes,
					SHA256: shas[i], Key: manifests.SharedKey(job, shas[i], scaleObjectBytes), Uploaded: c == 0 || i >= hi-lo-cut})
				m.FullSize += scaleObjectBytes
				if m.Files[len(m.Files)-1].Uploaded {
					m.FilesUploaded++
				} else {
					m.FilesReused++
				}
			}
			sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Name < m.Files[j].Name })
			enc, err := m.Encode(int64(m.FilesUploaded) * scaleObjectBytes)
			if err != nil {
				return err
			}
			if err := manifests.Commit(ctx, st, m, enc); err != nil {
				return err
			}
			fig.References += len(m.Files)
		}
	}
	return nil
}

// countingProxy is a reverse proxy on 127.0.0.1 in front of an S3
// endpoint that counts the requests through it by kind. The Host header is
// passed on unchanged, so signatures made for the proxy's address verify.
type countingProxy struct {
	url string
	srv *http.Server
	mu  sync.Mutex
	n   map[string]int64
}

func startCountingProxy(endpoint string) (*countingProxy, error) {
	target, err := url.Parse(endpoint)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	px := &countingProxy{url: "http://" + ln.Addr().String(), n: map[string]int64{}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
		},
		Transport: &http.Transport{MaxIdleConnsPerHost: 64},
	}
	px.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		kind := req.Method
		if req.Method == http.MethodGet && (req.URL.Query().Has("list-type") || req.URL.Query().Has("prefix") || strings.Count(strings.Trim(req.URL.Path, "/"), "/") == 0) {
			kind = "LIST"
		}
		px.mu.Lock()
		px.n[kind]++
		px.mu.Unlock()
		rp.ServeHTTP(w, req)
	}), ReadHeaderTimeout: time.Minute}
	go px.srv.Serve(ln)
	return px, nil
}

func (px *countingProxy) reset() {
	px.mu.Lock()
	px.n = map[string]int64{}
	px.mu.Unlock()
}

func (px *countingProxy) counts() (map[string]int64, int64) {
	px.mu.Lock()
	defer px.mu.Unlock()
	out := make(map[string]int64, len(px.n))
	var total int64
	for k, v := range px.n {
		out[k] = v
		total += v
	}
	return out, total
}

func (px *countingProxy) close() { px.srv.Close() }
