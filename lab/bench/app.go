package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/client/pebble"
)

// appThroughput runs the workload in phases off, on, on, off (twice) of equal
// length; in the "on" phases it takes a checkpoint every interval the way an
// app does, from its own goroutine, with pebble.Checkpoint (a Pebble
// checkpoint with the WAL tail, handed off, until synced), while the agent
// uploads the previous ones in the background. The write rate is writes
// over wall-clock time. The pause figures are the checkpoint goroutine's
// wait (Pebble's checkpoint and the sync phase).
func (r *run) appThroughput(ctx context.Context) error {
	if err := r.ensureStore(ctx); err != nil {
		return err
	}
	fig, err := r.appRun(ctx, "app", appMode{url: r.storageURL()})
	if err != nil {
		return err
	}
	fig.Storage = r.tgt.desc
	r.rep.AppThroughput = fig
	r.logf("app throughput, storage %s: %.0f writes/s with checkpoints, %.0f without", r.tgt.kind, fig.WithWritesPerS, fig.WithoutWritesPerS)

	// The same run with the storage off the app's disk and cores: a file
	// store on tmpfs stands in for an object store on other machines, as it
	// is in production. The agent does all of its work (hashing, reading
	// every new file, writing it out); only the storage server's CPU and
	// disk writes, which a storage server on the app's node adds and a
	// remote one does not, are gone.
	shipped := fig.ShippedMBPerS
	tmp, why := tmpfsDir(r.o.StateBytes * 6)
	if why == "" {
		if tmp, err = os.MkdirTemp(tmp, "ckpt-bench-"); err != nil {
			why = err.Error()
		} else {
			defer os.RemoveAll(tmp)
		}
	}
	if why != "" {
		fig.OffNode = &AppThroughput{Reason: why}
	} else {
		dir := filepath.Join(tmp, "store")
		off, err := r.appRun(ctx, "app-offnode", appMode{url: "file://" + dir, env: []string{}})
		if err != nil {
			return fmt.Errorf("app throughput, storage off the node: %w", err)
		}
		// tmpfs is memory: the next runs get it back.
		os.RemoveAll(dir)
		off.Storage = "file store on tmpfs (" + dir + "), standing for storage on other machines"
		fig.OffNode = off
		shipped = off.ShippedMBPerS
		r.logf("app throughput, storage off the node: %.0f writes/s with checkpoints, %.0f without", off.WithWritesPerS, off.WithoutWritesPerS)
	}

	// Controls with no agent, the app taking Pebble's checkpoint every
	// interval as above. The first is what the app's own snapshots cost,
	// whoever ships them. The second adds, in the phases with checkpoints,
	// a process at the agent's priority hashing as many bytes a second as
	// the agent shipped: the least CPU an agent storing content-addressed
	// objects spends (no reading, no writing). The third ships each
	// checkpoint's new files to the same tmpfs as the agent off the node,
	// read once and written once, and does nothing else: the least work any
	// agent shipping those files there does.
	own, err := r.appRun(ctx, "app-own", appMode{})
	if err != nil {
		return fmt.Errorf("app throughput, Pebble's checkpoints alone: %w", err)
	}
	fig.OwnCheckpoints = own
	r.logf("app throughput, Pebble's checkpoints alone: %.0f writes/s with checkpoints, %.0f without", own.WithWritesPerS, own.WithoutWritesPerS)
	if shipped > 0 {
		hashed, err := r.appRun(ctx, "app-hashed", appMode{hashLoad: int64(shipped * 1e6)})
		if err != nil {
			return fmt.Errorf("app throughput, Pebble's checkpoints and hashing: %w", err)
		}
		fig.OwnCheckpointsHashing = hashed
		r.logf("app throughput, Pebble's checkpoints and hashing %.0f MB/s: %.0f writes/s with checkpoints, %.0f without", shipped, hashed.WithWritesPerS, hashed.WithoutWritesPerS)
	}
	if why == "" {
		copied, err := r.appRun(ctx, "app-copied", appMode{copyDir: filepath.Join(tmp, "copies")})
		if err != nil {
			return fmt.Errorf("app throughput, Pebble's checkpoints copied: %w", err)
		}
		fig.OwnCheckpointsCopying = copied
		r.logf("app throughput, Pebble's checkpoints copied to tmpfs (%.0f MB/s): %.0f writes/s with checkpoints, %.0f without", copied.ShippedMBPerS, copied.WithWritesPerS, copied.WithoutWritesPerS)
	}
	return nil
}

// startHashLoad starts `ckpt-bench --hash-load` (LoadExe) at the given nice
// value (the agent's) and returns its pid and a func that stops it.
func (r *run) startHashLoad(bytesPerS int64, nice int) (int, func(), error) {
	cmd := exec.Command(r.o.LoadExe, "--hash-load", strconv.FormatInt(bytesPerS, 10))
	if err := startNice(cmd, nice); err != nil {
		return 0, nil, fmt.Errorf("start %s --hash-load: %w", r.o.LoadExe, err)
	}
	return cmd.Process.Pid, func() { cmd.Process.Kill(); cmd.Wait() }, nil
}

// startNice starts cmd, killed if the bench dies, at the given nice value
// (0: the bench's own).
func startNice(cmd *exec.Cmd, nice int) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	if nice != 0 {
		syscall.Setpriority(syscall.PRIO_PROCESS, cmd.Process.Pid, nice)
	}
	return nil
}

// tmpfsDir returns a tmpfs directory with at least need bytes free, or why
// there is none.
func tmpfsDir(need int64) (string, string) {
	const tmpfsMagic = 0x01021994
	for _, d := range []string{"/dev/shm", "/run/user/" + strconv.Itoa(os.Getuid())} {
		var st syscall.Statfs_t
		if syscall.Statfs(d, &st) != nil || st.Type != tmpfsMagic {
			continue
		}
		if free := int64(st.Bavail) * st.Bsize; free < need {
			return "", fmt.Sprintf("%s has %d bytes free, the run needs about %d", d, free, need)
		}
		if syscall.Access(d, 2 /* W_OK */) != nil {
			continue
		}
		return d, ""
	}
	return "", "no writable tmpfs (/dev/shm) on this machine"
}

// appMode is what ships the app's checkpoints in an appRun.
type appMode struct {
	// url is the storage of an agent the checkpoints go to; "" runs no
	// agent: the app takes Pebble's checkpoints, and they are removed, or
	// shipped by a control below.
	url string
	// env is the agent's extra environment (nil: the bench target's).
	env []string
	// hashLoad > 0 runs, in the phases with checkpoints, a process at the
	// agent's priority that hashes hashLoad bytes a second (HashLoad); its
	// CPU is reported as the agent's.
	hashLoad int64
	// copyDir, if not "", hands each checkpoint to a process at the
	// agent's priority that copies its new files there (CopyLoad); its CPU
	// and bytes are reported as the agent's.
	copyDir string
}

// taken is a checkpoint the app took. syncMS is the agent's sync phase
// (0: no agent); wait, nil if nothing ships the checkpoint, blocks until it
// is shipped and returns the bytes written.
type taken struct {
	syncMS float64
	wait   func(context.Context) (int64, error)
}

// appRun measures the app's write rate without and with checkpoints,
// shipped as m says.
func (r *run) appRun(ctx context.Context, name string, m appMode) (*AppThroughput, error) {
	// Phases of 5 s vary by up to 20% from one to the next on a 2-core
	// machine (compactions come in bursts), with or without checkpoints:
	// full-size runs measure 10 s phases.
	phase, interval := 5*time.Second, r.o.AppInterval
	if r.o.StateBytes >= 256<<20 {
		phase = 10 * time.Second
	}
	// A phase holds at least five checkpoints.
	phase = max(phase, 5*interval)
	if r.o.Quick {
		phase, interval = 300*time.Millisecond, 100*time.Millisecond
	}
	// A warm-up phase (not counted) brings compactions to their steady
	// state; then off/on in ABBA order twice, so that a drift of the
	// store's speed over time weighs on both sides alike.
	fig := &AppThroughput{IntervalMS: ms(interval), PhaseMS: ms(phase), Phases: []string{"warmup", "off", "on", "on", "off", "off", "on", "on", "off"}}
	// The agent runs as a sidecar does: its own process, with a lower CPU
	// weight than the app (nice 10 here; a Kubernetes sidecar gets its
	// weight from its CPU request). Uploads then take spare CPU, not the
	// app's.
	const nice = 10
	// take takes checkpoint n and hands it to whatever ships it.
	var take func(n uint64) (*taken, error)
	var removing sync.WaitGroup
	defer removing.Wait()
	agentPID, storagePID := 0, 0
	switch {
	case m.url == "":
		// No agent: Pebble's checkpoint alone, removed in the background
		// (as the agent removes the copy a newer checkpoint replaces: the
		// next one does not wait for it), or handed to the copying control,
		// which removes it.
		fig.Agent = "no agent: Pebble's checkpoint every interval (pebble.Snapshot, as pebble.Checkpoint makes it)"
		var cp *copyLoadProc
		switch {
		case m.copyDir != "":
			var err error
			if cp, err = startCopyLoad(r.o.LoadExe, m.copyDir, nice); err != nil {
				return nil, err
			}
			defer cp.stop()
			agentPID = cp.pid
			fig.Agent += fmt.Sprintf(", and a process at nice %d copying its new files to %s (ckpt-bench --copy-load), then removing the checkpoint before it", nice, m.copyDir)
		case m.hashLoad > 0:
			fig.Agent += fmt.Sprintf(", removed at once; a process at nice %d hashing %.1f MB/s with SHA-256 in the phases with checkpoints", nice, float64(m.hashLoad)/1e6)
			fig.HashLoadBytesPerS = m.hashLoad
		default:
			fig.Agent += ", removed at once"
		}
		take = func(n uint64) (*taken, error) {
			dir, err := pebble.Snapshot(r.w.DB(), r.w.Dir(), n)
			if err != nil {
				return nil, err
			}
			if cp == nil {
				removing.Add(1)
				go func() { defer removing.Done(); os.RemoveAll(dir) }()
				return &taken{}, nil
			}
			ack, err := cp.send(dir)
			if err != nil {
				return nil, err
			}
			return &taken{wait: func(ctx context.Context) (int64, error) {
				select {
				case a := <-ack:
					return a.bytes, a.err
				case <-ctx.Done():
					return 0, ctx.Err()
				}
			}}, nil
		}
	default:
		sc, err := r.sidecarOn(ctx, name, nice, m.url, m.env)
		if err != nil {
			return nil, err
		}
		defer sc.stop()
		fig.Agent = fmt.Sprintf("separate ckpt agent process at nice %d", nice)
		agentPID = sc.pid
		if m.env == nil {
			storagePID = r.tgt.pid
		}
		take = func(n uint64) (*taken, error) {
			pend, err := pebble.Checkpoint(ctx, sc.client, r.w.DB(), r.w.Dir(), task, n, pebble.WithoutWAL()) // checkpoints alone: the wal section measures WAL shipping
			if err != nil {
				return nil, err
			}
			return &taken{syncMS: float64(pend.Synced.SyncMS), wait: func(ctx context.Context) (int64, error) {
				ev, err := pend.Wait(ctx)
				if err != nil {
					return 0, err
				}
				return ev.CheckpointSize, nil
			}}, nil
		}
	}
	// What ships the checkpoints ships the whole state first; that is done
	// (and waited for) before the measured phases, which see increments
	// only.
	first, err := take(1)
	if err != nil {
		return nil, fmt.Errorf("first checkpoint: %w", err)
	}
	if first.wait != nil {
		if _, err := first.wait(ctx); err != nil {
			return nil, fmt.Errorf("first checkpoint: %w", err)
		}
	}
	next := uint64(2)
	var pauses, snaps []float64
	var shipped atomic.Int64 // bytes the phase's checkpoints wrote to storage
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	var totals [2]struct {
		writes int64
		d      time.Duration
	}
	// checkpoints takes a checkpoint every interval until stop closes, from
	// its own goroutine, as a server's checkpoint timer would: Pebble's
	// Checkpoint does not block writers, so the writer loop goes on.
	checkpoints := func(stop <-chan struct{}) error {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
			n := next
			next++
			t0 := time.Now()
			tk, err := take(n)
			mu.Lock()
			pauses = append(pauses, ms(time.Since(t0)))
			if err == nil {
				snaps = append(snaps, ms(time.Since(t0))-tk.syncMS)
			}
			mu.Unlock()
			var ae *client.Error
			switch {
			case errors.As(err, &ae) && ae.Code == "unavailable":
				mu.Lock()
				fig.CheckpointsRefused++
				mu.Unlock()
				continue
			case err != nil:
				return fmt.Errorf("checkpoint %d: %w", n, err)
			}
			mu.Lock()
			fig.Checkpoints++
			mu.Unlock()
			if tk.wait == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, err := tk.wait(ctx)
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
					return
				}
				shipped.Add(n)
			}()
		}
	}
	fig.Cores = runtime.NumCPU()
	var cpuOn, cpuOff cpuTimes
	var shippedOn int64
	var durOn, durOff time.Duration
	var phaseWrites []int64
	var phaseDur []time.Duration
	prev := ""
	for _, p := range fig.Phases {
		on := p == "on"
		if on && prev != "on" && first.wait != nil {
			// The writes of the phase without checkpoints are shipped first,
			// untimed: an app that checkpoints every interval never carries
			// more than one interval of changes into a checkpoint. The app
			// goes on writing meanwhile (uncounted): idle, it would hand
			// Pebble's compactions a pause that only the phases with
			// checkpoints get.
			catchUp, err := take(next)
			if err != nil {
				return nil, fmt.Errorf("checkpoint %d: %w", next, err)
			}
			next++
			var waitErr error
			caughtUp := make(chan struct{})
			go func() { _, waitErr = catchUp.wait(ctx); close(caughtUp) }()
			if _, err := r.writeUntil(ctx, caughtUp); err != nil {
				return nil, err
			}
			if waitErr != nil {
				return nil, fmt.Errorf("checkpoint %d: %w", next-1, waitErr)
			}
		}
		prev = p
		stop := make(chan struct{})
		ckptErr := make(chan error, 1)
		if on {
			go func() { ckptErr <- checkpoints(stop) }()
		}
		var stopLoad func()
		if on && m.hashLoad > 0 {
			pid, stop, err := r.startHashLoad(m.hashLoad, nice)
			if err != nil {
				return nil, err
			}
			agentPID, stopLoad = pid, stop
		}
		cpu0 := cpuNow(agentPID, storagePID)
		_, stall0 := r.w.Stalls()
		lsm0 := r.w.LSM()
		shipped.Store(0)
		start := time.Now()
		var writes int64
		for time.Since(start) < phase {
			rs, err := r.w.Round(ctx)
			if err != nil {
				return nil, fmt.Errorf("workload round: %w", err)
			}
			writes += int64(rs.Writes())
		}
		if on {
			// No checkpoint is taken after the phase's time; the app goes on
			// writing, and the phase goes on being measured, until the last
			// of its uploads completed: all the agent's and the storage's
			// work for the phase is inside the measured time.
			close(stop)
			if err := <-ckptErr; err != nil {
				return nil, err
			}
			uploaded := make(chan struct{})
			go func() { wg.Wait(); close(uploaded) }()
			tail := time.Now()
			n, err := r.writeUntil(ctx, uploaded)
			if err != nil {
				return nil, err
			}
			writes += n
			fig.UploadLagMS = append(fig.UploadLagMS, ms(time.Since(tail)))
		}
		d := time.Since(start)
		used := cpuNow(agentPID, storagePID).sub(cpu0)
		if stopLoad != nil {
			stopLoad()
			agentPID = 0
		}
		_, stall1 := r.w.Stalls()
		lsm1 := r.w.LSM()
		fig.PhaseStallMS = append(fig.PhaseStallMS, ms(stall1-stall0))
		mbps := func(b int64) float64 { return round(float64(b)/1e6/d.Seconds(), 4) }
		fig.PhaseLSMWrittenMBPerS = append(fig.PhaseLSMWrittenMBPerS, mbps(int64(lsm1.FlushedBytes+lsm1.CompactedBytes-lsm0.FlushedBytes-lsm0.CompactedBytes)))
		fig.PhaseShippedMBPerS = append(fig.PhaseShippedMBPerS, mbps(shipped.Load()))
		fig.PhaseCores = append(fig.PhaseCores, used.cores(d))
		switch {
		case p == "warmup":
		case on:
			cpuOn, durOn = cpuOn.add(used), durOn+d
			shippedOn += shipped.Load()
		default:
			cpuOff, durOff = cpuOff.add(used), durOff+d
		}
		phaseWrites, phaseDur = append(phaseWrites, writes), append(phaseDur, d)
		if p != "warmup" {
			i := map[bool]int{false: 0, true: 1}[on]
			totals[i].writes += writes
			totals[i].d += d
		}
		fig.PhaseWritesPerS = append(fig.PhaseWritesPerS, round(float64(writes)/d.Seconds(), 5))
	}
	if failed != nil {
		return nil, fmt.Errorf("a checkpoint taken while measuring throughput failed: %w", failed)
	}
	fig.WithoutWritesPerS = round(float64(totals[0].writes)/totals[0].d.Seconds(), 5)
	fig.WithWritesPerS = round(float64(totals[1].writes)/totals[1].d.Seconds(), 5)
	if fig.WithoutWritesPerS > 0 {
		fig.Ratio = round(fig.WithWritesPerS/fig.WithoutWritesPerS, 5)
	}
	fig.OnCores, fig.OffCores = cpuOn.cores(durOn), cpuOff.cores(durOff)
	if durOn > 0 {
		fig.ShippedMBPerS = round(float64(shippedOn)/1e6/durOn.Seconds(), 4)
	}
	if shippedOn > 0 && cpuOn.agent > 0 {
		fig.AgentCPUSecondsPerGB = round(cpuOn.agent.Seconds()/(float64(shippedOn)/1e9), 4)
	}
	// Each off-on-on-off block on its own, to show the spread.
	for b := 1; b+4 <= len(fig.Phases); b += 4 {
		var rate [2]struct {
			w int64
			d time.Duration
		}
		for i := b; i < b+4; i++ {
			k := map[bool]int{false: 0, true: 1}[fig.Phases[i] == "on"]
			rate[k].w += phaseWrites[i]
			rate[k].d += phaseDur[i]
		}
		if rate[0].w > 0 && rate[1].d > 0 {
			fig.BlockRatios = append(fig.BlockRatios, round(float64(rate[1].w)/rate[1].d.Seconds()/(float64(rate[0].w)/rate[0].d.Seconds()), 4))
		}
	}
	fig.PauseP50MS, fig.PauseMaxMS = percentile(pauses, 50), percentile(pauses, 100)
	fig.SnapshotP50MS = percentile(snaps, 50)
	return fig, nil
}

// writeUntil runs workload rounds until done is closed (checked between
// rounds) and returns the writes they made.
func (r *run) writeUntil(ctx context.Context, done <-chan struct{}) (int64, error) {
	var writes int64
	for {
		select {
		case <-done:
			return writes, nil
		default:
		}
		rs, err := r.w.Round(ctx)
		if err != nil {
			return writes, fmt.Errorf("workload round: %w", err)
		}
		writes += int64(rs.Writes())
	}
}

// cpuTimes is the CPU time (user+system) of the bench process, the agent
// and the storage server.
type cpuTimes struct{ app, agent, storage time.Duration }

func cpuNow(agentPID, storagePID int) cpuTimes {
	return cpuTimes{app: procCPU(os.Getpid()), agent: procCPU(agentPID), storage: procCPU(storagePID)}
}

func (a cpuTimes) sub(b cpuTimes) cpuTimes {
	return cpuTimes{a.app - b.app, a.agent - b.agent, a.storage - b.storage}
}

func (a cpuTimes) add(b cpuTimes) cpuTimes {
	return cpuTimes{a.app + b.app, a.agent + b.agent, a.storage + b.storage}
}

func (a cpuTimes) cores(d time.Duration) CoreShare {
	if d <= 0 {
		return CoreShare{}
	}
	f := func(c time.Duration) float64 { return round(c.Seconds()/d.Seconds(), 3) }
	return CoreShare{App: f(a.app), Agent: f(a.agent), Storage: f(a.storage)}
}

// procCPU reads a process's user+system time from /proc (0 if pid is 0 or
// unreadable: the figure is then absent, not made up).
func procCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; fields after its ")" are
	// fixed: utime and stime are the 14th and 15th fields of the line.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(ut+st) * time.Second / clockTicks
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100
