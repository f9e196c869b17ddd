package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/ckpt-io/ckpt/client"
)

// pause measures the app's pause, request sent to synced read, with
// snapshots of 1,000 and 10,000 small SSTs: each snapshot dir is made of
// hard links to a pool of files (as an engine checkpoint is), plus one new
// SST and the private files, and sent to an agent; the next is sent once
// the previous completed. Each size is measured with handoff (the agent
// renames the dir, as client/pebble's Checkpoint asks) and with links.
//
// The agent is a separate process at nice 10, as a sidecar with a lower
// CPU weight than its app is (the app section runs it the same way). In
// the bench's own process the client's reader goroutine shared the Go
// scheduler with the agent's upload workers, and waited for a P to read a
// synced event the agent had written long before: 0.6 ms in the agent, up
// to 4.7 ms at the client, the difference all between the agent's write
// and the client's read. At nice 0 the previous checkpoint's upload still
// delayed the app's wakeup by up to 4 ms; at nice 10, p99 1.6 to 3.2 ms.
func (r *run) pause(ctx context.Context) error {
	sc, err := r.sidecar(ctx, "pause", 10)
	if err != nil {
		return err
	}
	defer sc.stop()
	a := sc.client
	for _, c := range []struct{ files, samples int }{{1000, 100}, {10000, 30}} {
		if r.o.Quick {
			c.samples = 3
		}
		for _, handoff := range []bool{true, false} {
			p, err := r.pauseAt(ctx, a, c.files, c.samples, handoff)
			if err != nil {
				return err
			}
			r.rep.Pause = append(r.rep.Pause, *p)
			r.logf("pause at %d files, %s: p50 %.2f ms, p99 %.2f ms, max %.2f ms", p.Files, p.Mode, p.P50MS, p.P99MS, p.MaxMS)
		}
	}
	return nil
}

func (r *run) pauseAt(ctx context.Context, a *client.Client, files, samples int, handoff bool) (*Pause, error) {
	mode := map[bool]string{true: "handoff", false: "link"}[handoff]
	base := filepath.Join(r.root, fmt.Sprintf("pause-%d-%s", files, mode))
	pool := filepath.Join(base, "pool")
	if err := os.MkdirAll(pool, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(base)
	rng := rand.NewChaCha8([32]byte{byte(files), byte(files >> 8)})
	buf := make([]byte, 512)
	for i := range files {
		rng.Read(buf)
		if err := os.WriteFile(filepath.Join(pool, fmt.Sprintf("%06d.sst", i)), buf, 0o644); err != nil {
			return nil, err
		}
	}
	p := &Pause{Files: files, Mode: mode, Samples: samples}
	tsk := fmt.Sprintf("pause-%d-%s", files, mode)
	for k := 1; k <= samples; k++ {
		dir := filepath.Join(base, fmt.Sprintf("snap-%d", k))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, err
		}
		// One new flush per snapshot replaces the oldest pool file.
		for i := k; i < files; i++ {
			name := fmt.Sprintf("%06d.sst", i)
			if err := os.Link(filepath.Join(pool, name), filepath.Join(dir, name)); err != nil {
				return nil, err
			}
		}
		rng.Read(buf)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%06d.sst", files+k)), buf, 0o644); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(pool, fmt.Sprintf("%06d.sst", files+k)), buf, 0o644); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "MANIFEST-000001"), buf[:256], 0o644); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "CURRENT"), []byte("MANIFEST-000001\n"), 0o644); err != nil {
			return nil, err
		}
		t0 := time.Now()
		pend, err := a.Send(ctx, client.Request{Task: tsk, Checkpoint: uint64(k), Dir: dir, Engine: "pebble", Handoff: handoff})
		if err != nil {
			return nil, fmt.Errorf("checkpoint %d: %w", k, err)
		}
		p.RawMS = append(p.RawMS, ms(time.Since(t0)))
		if _, err := pend.Wait(ctx); err != nil {
			return nil, fmt.Errorf("checkpoint %d: %w", k, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
	}
	p.P50MS, p.P99MS, p.MaxMS = percentile(p.RawMS, 50), percentile(p.RawMS, 99), percentile(p.RawMS, 100)
	return p, nil
}
