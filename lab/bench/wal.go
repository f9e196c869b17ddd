package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/client/pebble"
	"github.com/ckpt-io/ckpt/storage"
)

// WALShipping is the wal section: the app's write rate with WAL shipping
// (`ckpt agent --wal-interval`, default 1s) against without, on the same
// workload and agent, checkpoints every CheckpointEveryMS in both, phases
// interleaved (ABBA, twice); the bytes shipped per byte of WAL the store
// wrote while shipping; and the agent's CPU per GB of WAL shipped.
type WALShipping struct {
	Storage           string   `json:"storage"`
	WALIntervalMS     float64  `json:"wal_interval_ms"`
	CheckpointEveryMS float64  `json:"checkpoint_every_ms"`
	PhaseMS           float64  `json:"phase_ms"`
	Phases            []string `json:"phases"`
	// With and Without are the write rates (writes/s) of the phases with
	// and without WAL shipping, in the order run; Min, Median and Max sum
	// them up.
	With          []float64 `json:"with_writes_per_s"`
	Without       []float64 `json:"without_writes_per_s"`
	WithMedian    float64   `json:"with_median_writes_per_s"`
	WithoutMedian float64   `json:"without_median_writes_per_s"`
	WithMin       float64   `json:"with_min_writes_per_s"`
	WithMax       float64   `json:"with_max_writes_per_s"`
	WithoutMin    float64   `json:"without_min_writes_per_s"`
	WithoutMax    float64   `json:"without_max_writes_per_s"`
	// Ratio is WithMedian / WithoutMedian.
	Ratio float64 `json:"ratio"`
	// WALBytes is what Pebble wrote to its logs while shipping was on
	// (from the completion of the checkpoint that started it to that of
	// the one that stopped it); ShippedBytes the WAL segments in storage.
	WALBytes          int64   `json:"wal_bytes"`
	ShippedBytes      int64   `json:"shipped_bytes"`
	Segments          int     `json:"segments"`
	Manifests         int     `json:"manifests"`
	ShippedPerWALByte float64 `json:"shipped_per_wal_byte"`
	// AgentCPUSecondsOn and Off are the agent's CPU seconds per second of
	// the phases with and without shipping (checkpoints run in both);
	// AgentCPUSecondsPerGB is the difference over the GB shipped.
	AgentCPUSecondsOn    float64 `json:"agent_cpu_s_per_s_on"`
	AgentCPUSecondsOff   float64 `json:"agent_cpu_s_per_s_off"`
	AgentCPUSecondsPerGB float64 `json:"agent_cpu_s_per_gb_wal"`
	// Load is /proc/loadavg before and after the section, and Cores the
	// machine's: the machine is shared.
	Load  []string `json:"load"`
	Cores int      `json:"cores"`
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

// walShipping runs the wal section.
func (r *run) walShipping(ctx context.Context) error {
	if err := r.ensureStore(ctx); err != nil {
		return err
	}
	const nice = 10
	sc, err := r.sidecarOn(ctx, "wal", nice, r.storageURL(), nil)
	if err != nil {
		return err
	}
	defer sc.stop()
	every, phase := 5*time.Second, 10*time.Second
	if r.o.Quick {
		every, phase = 500*time.Millisecond, time.Second
	}
	fig := &WALShipping{Storage: r.tgt.desc, WALIntervalMS: 1000, CheckpointEveryMS: ms(every), PhaseMS: ms(phase),
		Phases: []string{"warmup", "off", "on", "on", "off", "off", "on", "on", "off"}, Load: []string{loadavg()}, Cores: runtime.NumCPU()}
	const task = "wal"
	next := uint64(1)
	take := func(wal bool) (*client.Pending, error) {
		var opts []pebble.Option
		if !wal {
			opts = append(opts, pebble.WithoutWAL())
		}
		n := next
		next++
		p, err := pebble.Checkpoint(ctx, sc.client, r.w.DB(), r.w.Dir(), task, n, opts...)
		if err != nil {
			return nil, fmt.Errorf("checkpoint %d: %w", n, err)
		}
		return p, nil
	}
	// checkpointNow takes a checkpoint and writes (uncounted) until it
	// completes: shipping starts or stops with its completion.
	checkpointNow := func(wal bool) error {
		p, err := take(wal)
		if err != nil {
			return err
		}
		done := make(chan struct{})
		var werr error
		go func() { _, werr = p.Wait(ctx); close(done) }()
		if _, err := r.writeUntil(ctx, done); err != nil {
			return err
		}
		return werr
	}
	walWritten := func() int64 { return int64(r.w.DB().Metrics().WAL.BytesWritten) }
	var walBytes, walFrom int64
	var cpuOn, cpuOff time.Duration
	var durOn, durOff time.Duration
	shipping := false
	for i, p := range fig.Phases {
		on := p == "on"
		if i == 0 || on != shipping {
			if err := checkpointNow(on); err != nil {
				return err
			}
			switch {
			case on && !shipping:
				walFrom = walWritten()
			case !on && shipping:
				walBytes += walWritten() - walFrom
			}
			shipping = on
		}
		// The phase: checkpoints every `every` from their own goroutine,
		// as an app's timer would, while the writer writes.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var ckErr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			var pending []*client.Pending
			defer func() {
				for _, pd := range pending {
					if _, err := pd.Wait(ctx); err != nil && ckErr == nil {
						ckErr = err
					}
				}
			}()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				pd, err := take(on)
				if err != nil {
					ckErr = err
					return
				}
				pending = append(pending, pd)
			}
		}()
		cpu0 := procCPU(sc.pid)
		start := time.Now()
		timer := time.AfterFunc(phase, func() { close(stop) })
		writes, err := r.writeUntil(ctx, stop)
		d := time.Since(start)
		timer.Stop()
		wg.Wait()
		cpu := procCPU(sc.pid) - cpu0
		if err != nil {
			return err
		}
		if ckErr != nil {
			return ckErr
		}
		rate := float64(writes) / d.Seconds()
		switch p {
		case "on":
			fig.With = append(fig.With, round(rate, 1))
			cpuOn += cpu
			durOn += d
		case "off":
			fig.Without = append(fig.Without, round(rate, 1))
			cpuOff += cpu
			durOff += d
		}
		r.logf("wal: phase %d (%s): %.0f writes/s, agent %.2f cores", i, p, rate, cpu.Seconds()/d.Seconds())
	}
	if shipping {
		if err := checkpointNow(false); err != nil {
			return err
		}
		walBytes += walWritten() - walFrom
	}
	// What was shipped: every WAL segment of the task in storage.
	st, err := r.tgt.open(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	prefix := "bench-" + r.id + "-wal/tasks/" + task + "/"
	err = st.List(ctx, prefix, func(o storage.ObjectInfo) error {
		switch {
		case strings.Contains(o.Key, "/seg/"):
			fig.ShippedBytes += o.Size
			fig.Segments++
		case strings.Contains(o.Key, "/wal.e") && strings.Contains(o.Key, "/m/"):
			fig.Manifests++
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("list the shipped WAL: %w", err)
	}
	fig.WALBytes = walBytes
	if walBytes > 0 {
		fig.ShippedPerWALByte = round(float64(fig.ShippedBytes)/float64(walBytes), 4)
	}
	fig.WithMin, fig.WithMedian, fig.WithMax = spread(fig.With)
	fig.WithoutMin, fig.WithoutMedian, fig.WithoutMax = spread(fig.Without)
	if fig.WithoutMedian > 0 {
		fig.Ratio = round(fig.WithMedian/fig.WithoutMedian, 4)
	}
	if durOn > 0 && durOff > 0 {
		fig.AgentCPUSecondsOn = round(cpuOn.Seconds()/durOn.Seconds(), 4)
		fig.AgentCPUSecondsOff = round(cpuOff.Seconds()/durOff.Seconds(), 4)
		if fig.ShippedBytes > 0 {
			extra := cpuOn.Seconds() - fig.AgentCPUSecondsOff*durOn.Seconds()
			fig.AgentCPUSecondsPerGB = round(extra/(float64(fig.ShippedBytes)/1e9), 4)
		}
	}
	fig.Load = append(fig.Load, loadavg())
	r.rep.WAL = fig
	r.logf("wal: %.0f writes/s with WAL shipping, %.0f without (median), %.4f bytes shipped per WAL byte, %.2f agent CPU-s per GB", fig.WithMedian, fig.WithoutMedian, fig.ShippedPerWALByte, fig.AgentCPUSecondsPerGB)
	return nil
}

// spread returns the min, median and max of v.
func spread(v []float64) (lo, med, hi float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med = s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[0], round(med, 1), s[len(s)-1]
}
