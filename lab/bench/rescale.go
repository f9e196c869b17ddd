package bench

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/client"
	ckptpebble "github.com/ckpt-io/ckpt/client/pebble"
	"github.com/ckpt-io/ckpt/internal/human"
	"github.com/ckpt-io/ckpt/restore"
)

// Rescale is the rescale section: a job of rescaleOld Pebble tasks, each
// owning a contiguous quarter of a keyed state, checkpointed job-wide, then
// rebuilt as 3 and as 6 tasks by rescale restores, against plain restores
// of the same checkpoints.
type Rescale struct {
	StateBytes int64 `json:"state_bytes"`
	Scaled     bool  `json:"scaled"`
	Keys       int64 `json:"keys"`
	// CheckpointBytes is the full size of the old tasks' checkpoints.
	CheckpointBytes int64 `json:"checkpoint_bytes"`
	// PlainMS and PlainBytes: the old tasks restored one after another by
	// plain restores from storage alone.
	PlainMS    float64           `json:"plain_ms"`
	PlainBytes int64             `json:"plain_bytes"`
	Scenarios  []RescaleScenario `json:"scenarios"`
}

// RescaleScenario is one rescale, from From tasks to To, each new task's
// store built by one rescale restore, one after another.
type RescaleScenario struct {
	From int `json:"from"`
	To   int `json:"to"`
	// MS sums the rescale restores' times; MaxTaskMS is the slowest one.
	MS        float64 `json:"ms"`
	MaxTaskMS float64 `json:"max_task_ms"`
	// Bytes sums the bytes fetched; BytesInRange the old stores' bytes in
	// the new tasks' ranges (Pebble's estimate, see restore.RescaleTask).
	Bytes        int64   `json:"bytes"`
	BytesInRange int64   `json:"bytes_in_range"`
	BytesRatio   float64 `json:"bytes_ratio"`
	// PlainSameStateMS is the plain restores' time for BytesInRange bytes
	// (at their throughput); TimeRatio is MS over it.
	PlainSameStateMS float64 `json:"plain_same_state_ms"`
	TimeRatio        float64 `json:"time_ratio"`
	Keys             int64   `json:"keys"`
	Verified         bool    `json:"verified"`
	// BytesIngested is the old tables ingested unchanged (of
	// TablesIngested), DeltaKeys the keys written above them, and
	// TasksRewritten the old tasks' contributions rewritten key by key.
	TablesIngested int   `json:"tables_ingested"`
	BytesIngested  int64 `json:"bytes_ingested"`
	DeltaKeys      int64 `json:"delta_keys"`
	TasksRewritten int   `json:"tasks_rewritten"`
	// FetchMS, BuildMS and VerifyMS split MS: fetching the old files,
	// building the new store, checking it.
	// BytesPrivate is the old tasks' private files among Bytes (every new
	// task fetches every old task's MANIFEST, OPTIONS and WAL whole);
	// TableBytesRatio is (Bytes - BytesPrivate) / BytesInRange.
	BytesPrivate    int64   `json:"bytes_private"`
	TableBytesRatio float64 `json:"table_bytes_ratio"`
	FetchMS         float64 `json:"fetch_ms"`
	BuildMS         float64 `json:"build_ms"`
	VerifyMS        float64 `json:"verify_ms"`
}

// rescaleOld is the number of old tasks.
const rescaleOld = 4

// rescaleValueBytes is each value's size; values are random (they do not
// compress), keys 8-byte big-endian ids.
const rescaleValueBytes = 1000

func (r *run) rescale(ctx context.Context) error {
	state := r.o.RescaleBytes
	fig := &Rescale{StateBytes: state, Scaled: state < 1<<30}
	r.rep.Rescale = fig
	dir := filepath.Join(r.root, "rescale")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ids := state / (8 + rescaleValueBytes)
	fig.Keys = ids
	tasks := make([]string, rescaleOld)
	for i := range tasks {
		tasks[i] = fmt.Sprintf("old-%d", i)
	}
	a, err := r.startAgent(ctx, "rescale")
	if err != nil {
		return err
	}
	defer a.stop()
	start := time.Now()
	for i, task := range tasks {
		lo, hi := int64(i)*ids/rescaleOld, int64(i+1)*ids/rescaleOld
		n, err := r.rescaleOldTask(ctx, a.client, filepath.Join(dir, task), task, tasks, lo, hi)
		if err != nil {
			return fmt.Errorf("old task %s: %w", task, err)
		}
		fig.CheckpointBytes += n
	}
	r.logf("rescale: %d tasks, %s of state, checkpointed in %s", rescaleOld, human.Bytes(state), time.Since(start).Round(time.Millisecond))
	st := a.store
	for i, task := range tasks {
		t0 := time.Now()
		res, err := restore.Run(ctx, restore.Options{Store: st, Job: a.job, Task: task, Target: filepath.Join(dir, fmt.Sprintf("plain-%d", i)), Checkpoint: 1})
		if err != nil {
			return fmt.Errorf("plain restore of %s: %w", task, err)
		}
		fig.PlainMS += ms(time.Since(t0))
		fig.PlainBytes += res.Bytes
		os.RemoveAll(filepath.Join(dir, fmt.Sprintf("plain-%d", i)))
	}
	r.logf("rescale: plain restores of %s in %.0f ms", human.Bytes(fig.PlainBytes), fig.PlainMS)
	bound := func(id int64) []byte {
		if id <= 0 || id >= ids {
			return nil
		}
		return binary.BigEndian.AppendUint64(nil, uint64(id))
	}
	for _, to := range []int{3, 6} {
		sc := RescaleScenario{From: rescaleOld, To: to, Verified: true}
		for j := range to {
			o := restore.RescaleOptions{Store: st, Job: a.job, From: tasks, Engine: "pebble", Checkpoint: 1,
				Start: bound(int64(j) * ids / int64(to)), End: bound(int64(j+1) * ids / int64(to)),
				Target: filepath.Join(dir, fmt.Sprintf("new%d-%d", to, j))}
			t0 := time.Now()
			res, err := restore.Rescale(ctx, o)
			if err != nil {
				return fmt.Errorf("rescale %d->%d, task %d [%s, %s): %w", rescaleOld, to, j, hex.EncodeToString(o.Start), hex.EncodeToString(o.End), err)
			}
			d := ms(time.Since(t0))
			sc.MS += d
			sc.MaxTaskMS = max(sc.MaxTaskMS, d)
			sc.Bytes += res.Bytes
			sc.BytesInRange += res.BytesInRange
			sc.Keys += res.Keys
			sc.Verified = sc.Verified && res.Verified
			sc.BytesPrivate += res.BytesPrivate
			sc.FetchMS += float64(res.FetchMS)
			sc.BuildMS += float64(res.BuildMS)
			sc.VerifyMS += float64(res.VerifyMS)
			sc.TablesIngested += res.TablesIngested
			sc.BytesIngested += res.BytesIngested
			sc.DeltaKeys += res.DeltaKeys
			for _, tk := range res.Tasks {
				if tk.Rewritten != "" && tk.Keys > 0 {
					sc.TasksRewritten++
					r.logf("rescale %d->%d, task %d: %s rewritten: %s", rescaleOld, to, j, tk.Task, tk.Rewritten)
				}
			}
			os.RemoveAll(o.Target)
		}
		if sc.BytesInRange > 0 {
			sc.BytesRatio = round(float64(sc.Bytes)/float64(sc.BytesInRange), 4)
			sc.TableBytesRatio = round(float64(sc.Bytes-sc.BytesPrivate)/float64(sc.BytesInRange), 4)
		}
		if fig.PlainBytes > 0 {
			sc.PlainSameStateMS = round(fig.PlainMS*float64(sc.BytesInRange)/float64(fig.PlainBytes), 4)
		}
		if sc.PlainSameStateMS > 0 {
			sc.TimeRatio = round(sc.MS/sc.PlainSameStateMS, 4)
		}
		r.logf("rescale %d->%d: %.0f ms, %s fetched for %s in range (%.2fx), %.2fx a plain restore of that state; %d tables (%s) ingested unchanged, %d keys in overlays, %d contributions rewritten; %s private, tables %.2fx the range; fetch %.0f ms, build %.0f ms, verify %.0f ms",
			rescaleOld, to, sc.MS, human.Bytes(sc.Bytes), human.Bytes(sc.BytesInRange), sc.BytesRatio, sc.TimeRatio,
			sc.TablesIngested, human.Bytes(sc.BytesIngested), sc.DeltaKeys, sc.TasksRewritten, human.Bytes(sc.BytesPrivate), sc.TableBytesRatio, sc.FetchMS, sc.BuildMS, sc.VerifyMS)
		fig.Scenarios = append(fig.Scenarios, sc)
	}
	return nil
}

// rescaleOldTask writes the ids [lo, hi), in a random order, into a new
// Pebble store in dir, compacts them (then overwrites a tenth and deletes a thirtieth of them,
// flushed, and a last few writes left in the WAL), checkpoints it as job-wide checkpoint
// 1 of tasks, and returns the checkpoint's full size.
func (r *run) rescaleOldTask(ctx context.Context, c *client.Client, dir, task string, tasks []string, lo, hi int64) (int64, error) {
	db, err := pebble.Open(dir, &pebble.Options{MemTableSize: 16 << 20, Logger: quietPebble{}})
	if err != nil {
		return 0, err
	}
	defer db.Close()
	src := rand.NewChaCha8([32]byte{byte(lo), byte(lo >> 8), byte(lo >> 16), byte(lo >> 24)})
	rng := rand.New(src)
	val := make([]byte, rescaleValueBytes)
	b := db.NewBatch()
	put := func(id int64, del bool) error {
		k := binary.BigEndian.AppendUint64(nil, uint64(id))
		var err error
		if del {
			err = b.Delete(k, nil)
		} else {
			src.Read(val)
			err = b.Set(k, val, nil)
		}
		if err != nil {
			return err
		}
		if b.Len() >= 1<<20 {
			if err := b.Commit(pebble.NoSync); err != nil {
				return err
			}
			b = db.NewBatch()
		}
		return ctx.Err()
	}
	// Keyed state arrives in no key order: the ids in a random order.
	for _, i := range rng.Perm(int(hi - lo)) {
		if err := put(lo+int64(i), false); err != nil {
			return 0, err
		}
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return 0, err
	}
	b = db.NewBatch()
	// The loaded state settles at the bottom of the LSM (sequence numbers
	// zeroed), as a store that has run for a while keeps most of its bytes;
	// the overwrites and deletions below stay above it.
	if err := db.Compact(ctx, binary.BigEndian.AppendUint64(nil, uint64(lo)), binary.BigEndian.AppendUint64(nil, uint64(hi)), true); err != nil {
		return 0, err
	}
	n := hi - lo
	for range n / 10 {
		if err := put(lo+rng.Int64N(n), false); err != nil {
			return 0, err
		}
	}
	for range n / 30 {
		if err := put(lo+rng.Int64N(n), true); err != nil {
			return 0, err
		}
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return 0, err
	}
	if err := db.Flush(); err != nil {
		return 0, err
	}
	b = db.NewBatch()
	for range min(n, 1000) {
		if err := put(lo+rng.Int64N(n), false); err != nil {
			return 0, err
		}
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return 0, err
	}
	snap, err := ckptpebble.Snapshot(db, dir, 1)
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(snap)
	p, err := c.Send(ctx, client.Request{Task: task, Checkpoint: 1, Dir: snap, Tasks: tasks, Engine: "pebble", Handoff: true})
	if err != nil {
		return 0, err
	}
	ev, err := p.Wait(ctx)
	if err != nil {
		return 0, err
	}
	return ev.FullSize, nil
}

// quietPebble drops Pebble's log lines; a fatal error panics.
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
