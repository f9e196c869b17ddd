package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/protocol"
)

// The fleet soak: two long-lived agents ("node-a", "node-b") share one
// job's storage with --retain 1 and GC every second. Two tasks, whose
// stores hold files with the same bytes, move back and forth between the
// agents by socket restores while the app left behind on the old node
// (a zombie) keeps sending checkpoints, one of them racing the takeover.
// A hostile peer hands its snapshot dirs off to node-a and, once synced,
// swaps every file for a symlink to a secret the agent must never read.
// A checker lists and restores each task's newest checkpoint from storage
// all along. Its length is CKPT_FLEET_SOAK (default fleetSoakDefault);
// CKPT_SOAK_SEED repeats a schedule.
//
// It holds, at every check and at the end:
//   - a task that has completed a checkpoint always lists one, and its newest
//     listed checkpoint restores to exactly the bytes the app sent for it
//     (no retirement by a zombie ever leaves a task with nothing: invariant 9);
//   - every restore of a move brings back a checkpoint at least as new as the
//     newest one the old owner reported completed before the move began;
//   - an agent whose task was taken away commits nothing once the takeover is
//     done, and takes the task back by a restore when it moves back;
//   - the secret never reaches storage, and a hostile peer's completed
//     checkpoints restore to the bytes it handed off;
//   - `ckpt verify` of the whole job passes at the end (GC deleted no object a
//     retained checkpoint of either task shares).
const (
	fleetSoakDefault = 40 * time.Second
	fleetSoakJob     = "fleetsoak"
	fleetSoakCheck   = 1500 * time.Millisecond
)

var fleetSoakTasks = []string{"kv-0", "kv-1"}

func fleetSoakDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv("CKPT_FLEET_SOAK")
	if v == "" {
		return fleetSoakDefault
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 10*time.Second {
		t.Fatalf("CKPT_FLEET_SOAK=%q: want a Go duration of at least 10s, such as 40s or 30m", v)
	}
	return d
}

// fleetFiles is the content of one snapshot: file name -> SHA-256.
type fleetFiles map[string][32]byte

// fleetSoak is the shared state of one run.
type fleetSoak struct {
	t       *testing.T
	base    string
	storage string // file:// URL
	nodes   [2]agentConfig
	secret  []byte // the marker no object may hold

	mu sync.Mutex
	// expected holds what was sent as each checkpoint of each task.
	expected map[string]map[uint64]fleetFiles
	// completed is the newest checkpoint each task's owner reported
	// completed (zombies' reports excluded).
	completed map[string]uint64
	problems  []string
	stats     map[string]int
}

func (s *fleetSoak) problem(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	if len(s.problems) < 50 {
		s.problems = append(s.problems, msg)
	}
}

func (s *fleetSoak) count(what string) {
	s.mu.Lock()
	s.stats[what]++
	s.mu.Unlock()
}

func (s *fleetSoak) expect(task string, n uint64, files fleetFiles) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.expected[task] == nil {
		s.expected[task] = map[uint64]fleetFiles{}
	}
	s.expected[task][n] = files
}

func (s *fleetSoak) expectedOf(task string, n uint64) fleetFiles {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expected[task][n]
}

func (s *fleetSoak) reportCompleted(task string, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.completed[task] = max(s.completed[task], n)
}

func (s *fleetSoak) newestCompleted(task string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.completed[task]
}

// writeFleetSnapshot writes checkpoint n of task into dir. Files named
// s-K.sst have the same bytes in every task (K is n/4 and its two
// neighbours), so the tasks share objects that GC must keep while either
// retains them; the rest is the task's own.
func writeFleetSnapshot(dir, task string, n uint64) (fleetFiles, error) {
	files := map[string][]byte{}
	for k := n / 4; k < n/4+3; k++ {
		files[fmt.Sprintf("s-%06d.sst", k)] = randomBytes(96<<10, 1_000_000+k)
	}
	seed := n*1000 + uint64(len(task))*7 + uint64(task[len(task)-1])
	files[fmt.Sprintf("%s-%06d.sst", task, n)] = randomBytes(48<<10, seed)
	files["CURRENT"] = []byte("MANIFEST-000001\n")
	files["MANIFEST-000001"] = randomBytes(2<<10, seed+1)
	files["OPTIONS-000003"] = []byte(fmt.Sprintf("[Options]\n  task=%s n=%d\n", task, n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	out := fleetFiles{}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return nil, err
		}
		out[name] = sha256.Sum256(b)
	}
	return out, nil
}

// compareFleetDir checks that dir holds exactly the files of want.
func compareFleetDir(dir string, want fleetFiles) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
		w, ok := want[e.Name()]
		if !ok {
			return fmt.Errorf("file %s was not in the snapshot", e.Name())
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		if sha256.Sum256(b) != w {
			return fmt.Errorf("file %s differs from the snapshot's (%d bytes)", e.Name(), len(b))
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("%d files, the snapshot had %d", len(got), len(want))
	}
	return nil
}

// checkpointOn sends one checkpoint and waits for its end.
func checkpointOn(ctx context.Context, socket string, r client.Request) error {
	c, err := client.Dial(ctx, socket)
	if err != nil {
		return err
	}
	defer c.Close()
	p, err := c.Send(ctx, r)
	if err != nil {
		return err
	}
	_, err = p.Wait(ctx)
	return err
}

func isConflict(err error) bool {
	var pe *protocol.Error
	return errors.As(err, &pe) && pe.Code == protocol.CodeConflict
}

// taskLoop runs one task's app: checkpoints on its owner, and every few
// of them a move to the other agent with a zombie racing the takeover.
func (s *fleetSoak) taskLoop(ctx context.Context, task string, rng *rand.Rand) {
	owner := 0
	if task == fleetSoakTasks[1] {
		owner = 1
	}
	next := uint64(1)
	sinceMove := 0
	moveAfter := 3 + rng.IntN(4)
	for i := 0; ctx.Err() == nil; i++ {
		node := s.nodes[owner]
		if sinceMove < moveAfter {
			dir := filepath.Join(filepath.Dir(node.LocalDir), "app", fmt.Sprintf("%s-%d", task, next))
			files, err := writeFleetSnapshot(dir, task, next)
			if err != nil {
				s.problem("%s: write snapshot %d: %v", task, next, err)
				return
			}
			s.expect(task, next, files)
			err = checkpointOn(ctx, node.Socket, client.Request{Task: task, Checkpoint: next, Dir: dir})
			os.RemoveAll(dir)
			switch {
			case err == nil:
				s.reportCompleted(task, next)
				s.count("completed")
			case ctx.Err() != nil:
				return
			default:
				s.problem("%s: checkpoint %d on its owner %s failed: %v", task, next, node.Extra[1], err)
				s.count("owner failures")
			}
			next++
			sinceMove++
			time.Sleep(25 * time.Millisecond) // an app's pace, which a checker's restore can keep up with
			continue
		}
		// Move: the other node restores (taking the task over) while the
		// zombie app on the old node sends one more checkpoint.
		to := 1 - owner
		before := s.newestCompleted(task)
		zombieN := next
		zdir := filepath.Join(filepath.Dir(node.LocalDir), "app", fmt.Sprintf("%s-%d", task, zombieN))
		zfiles, err := writeFleetSnapshot(zdir, task, zombieN)
		if err != nil {
			s.problem("%s: write snapshot %d: %v", task, zombieN, err)
			return
		}
		s.expect(task, zombieN, zfiles)
		zdone := make(chan error, 1)
		go func() {
			time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
			zdone <- checkpointOn(ctx, node.Socket, client.Request{Task: task, Checkpoint: zombieN, Dir: zdir})
		}()
		target := filepath.Join(filepath.Dir(s.nodes[to].LocalDir), "restored", fmt.Sprintf("%s-%d", task, i))
		r, rerr := socketRestore(ctx, s.nodes[to].Socket, task, target, false)
		zerr := <-zdone
		os.RemoveAll(zdir)
		if ctx.Err() != nil {
			return
		}
		if zerr == nil {
			s.count("zombie commits racing a takeover")
		} else if isConflict(zerr) {
			s.count("zombie checkpoints refused")
		} else {
			s.problem("%s: the zombie's racing checkpoint %d failed for a reason other than conflict: %v", task, zombieN, zerr)
		}
		if rerr != nil {
			s.problem("%s: move %s -> %s: restore failed: %v (newest completed before the move: %d)", task, s.nodes[owner].Extra[1], s.nodes[to].Extra[1], rerr, before)
			return
		}
		s.count("moves")
		if r.Checkpoint < before {
			s.problem("%s: move to %s restored checkpoint %d, older than %d which its old owner reported completed before the move", task, s.nodes[to].Extra[1], r.Checkpoint, before)
		}
		if want := s.expectedOf(task, r.Checkpoint); want == nil {
			s.problem("%s: move restored checkpoint %d, which the app never sent", task, r.Checkpoint)
		} else if err := compareFleetDir(target, want); err != nil {
			s.problem("%s: move restored checkpoint %d with other bytes than were sent: %v", task, r.Checkpoint, err)
		}
		os.RemoveAll(target)
		// Once the takeover is done, the zombie commits nothing more.
		lateN := zombieN + 1
		ldir := filepath.Join(filepath.Dir(node.LocalDir), "app", fmt.Sprintf("%s-%d", task, lateN))
		lfiles, err := writeFleetSnapshot(ldir, task, lateN)
		if err != nil {
			s.problem("%s: write snapshot %d: %v", task, lateN, err)
			return
		}
		s.expect(task, lateN, lfiles)
		lerr := checkpointOn(ctx, node.Socket, client.Request{Task: task, Checkpoint: lateN, Dir: ldir})
		os.RemoveAll(ldir)
		switch {
		case ctx.Err() != nil:
			return
		case lerr == nil:
			s.problem("%s: the old owner %s committed checkpoint %d after %s had taken the task over", task, node.Extra[1], lateN, s.nodes[to].Extra[1])
		case isConflict(lerr):
			s.count("zombie checkpoints refused")
		default:
			s.problem("%s: the zombie's checkpoint %d after the takeover failed for a reason other than conflict: %v", task, lateN, lerr)
		}
		s.reportCompleted(task, r.Checkpoint)
		owner, next = to, max(zombieN, r.Checkpoint)+10
		sinceMove, moveAfter = 0, 3+rng.IntN(4)
	}
}

// hostileLoop hands snapshot dirs off to node-a and swaps each file for a
// symlink to the secret once synced, through a handle it kept on the dir.
func (s *fleetSoak) hostileLoop(ctx context.Context, secretPath string) {
	const task = "hostile"
	node := s.nodes[0]
	for n := uint64(1); ctx.Err() == nil; n++ {
		dir := filepath.Join(filepath.Dir(node.LocalDir), "app", fmt.Sprintf("%s-%d", task, n))
		files := fleetFiles{}
		for i := range 3 {
			b := randomBytes(200<<10, 7_000_000+n*10+uint64(i))
			name := fmt.Sprintf("%06d.sst", n*10+uint64(i))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				s.problem("hostile: %v", err)
				return
			}
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				s.problem("hostile: %v", err)
				return
			}
			files[name] = sha256.Sum256(b)
		}
		s.expect(task, n, files)
		d, err := os.Open(dir)
		if err != nil {
			s.problem("hostile: %v", err)
			return
		}
		c, err := client.Dial(ctx, node.Socket)
		if err != nil {
			d.Close()
			return
		}
		p, err := c.Send(ctx, client.Request{Task: task, Checkpoint: n, Dir: dir, Handoff: true})
		if err == nil {
			for name := range files {
				unix.Unlinkat(int(d.Fd()), name, 0)
				unix.Symlinkat(secretPath, int(d.Fd()), name)
			}
			_, err = p.Wait(ctx)
			if err == nil {
				s.count("hostile checkpoints completed")
			} else {
				s.count("hostile checkpoints failed")
			}
		}
		c.Close()
		d.Close()
		os.RemoveAll(dir)
		select { // a peer that tries a few times a second
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// check lists task, then restores its newest checkpoint from storage
// (whatever is newest when the restore looks: checkpoints complete faster
// than a process starts) and compares it with what the app sent.
func (s *fleetSoak) check(ctx context.Context, task string) {
	floor := s.newestCompleted(task)
	out, err := ckptCtx(ctx, []string{unsafeGCGrace}, "list", "--storage", s.storage, "--job", fleetSoakJob, "--task", task, "--json")
	if err != nil {
		if ctx.Err() == nil {
			s.problem("check %s: %v", task, err)
		}
		return
	}
	var list []listEntry
	if err := json.Unmarshal(out, &list); err != nil {
		s.problem("check %s: ckpt list: %v: %s", task, err, out)
		return
	}
	if len(list) == 0 {
		if floor > 0 {
			s.problem("check %s: storage lists no checkpoint of the task, whose owner reported checkpoint %d completed", task, floor)
		}
		return
	}
	if top := list[len(list)-1].Checkpoint; top < floor && task != "hostile" {
		s.problem("check %s: the newest listed checkpoint is %d, older than %d which was reported completed", task, top, floor)
	}
	target := filepath.Join(s.base, "check", fmt.Sprintf("%s-%d", task, time.Now().UnixNano()))
	defer os.RemoveAll(target)
	rout, rerr := ckptCtx(ctx, []string{unsafeGCGrace}, "restore", "--storage", s.storage, "--job", fleetSoakJob, "--task", task,
		"--target", target, "--json")
	if rerr != nil {
		if ctx.Err() == nil {
			s.problem("check %s: the newest checkpoint does not restore (newest listed a moment before: %d): %v", task, list[len(list)-1].Checkpoint, rerr)
		}
		return
	}
	var r restoreResult
	if err := json.Unmarshal(rout, &r); err != nil || !r.Restored {
		s.problem("check %s: ckpt restore --json: %v: %s", task, err, rout)
		return
	}
	if r.Checkpoint < floor && task != "hostile" {
		s.problem("check %s: restore took checkpoint %d, older than %d which was reported completed before it looked", task, r.Checkpoint, floor)
	}
	if want := s.expectedOf(task, r.Checkpoint); want == nil {
		s.problem("check %s: storage holds checkpoint %d, which the app never sent", task, r.Checkpoint)
	} else if err := compareFleetDir(target, want); err != nil {
		s.problem("check %s: checkpoint %d restores other bytes than were sent: %v", task, r.Checkpoint, err)
	}
	s.count("checks")
}

// scanForSecret reads every file under root and reports one that holds
// the secret.
func scanForSecret(root string, secret []byte) (string, error) {
	var found string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || found != "" || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.Contains(b, secret) {
			found = p
		}
		return nil
	})
	return found, err
}

func TestSoakFleetTakeoversHostileHandoffSharedBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the fleet soak runs for CKPT_FLEET_SOAK (40s by default)")
	}
	dur := fleetSoakDuration(t)
	seed := soakSeed(t)
	t.Logf("fleet soak: %v, seed %d (CKPT_SOAK_SEED=%d repeats the schedule)", dur, seed, seed)
	base := t.TempDir()
	storageDir := filepath.Join(base, "storage")
	s := &fleetSoak{t: t, base: base, storage: "file://" + storageDir,
		expected: map[string]map[uint64]fleetFiles{}, completed: map[string]uint64{}, stats: map[string]int{}}
	for i, name := range []string{"node-a", "node-b"} {
		root := filepath.Join(base, name)
		for _, sub := range []string{"app", "restored"} {
			if err := os.MkdirAll(filepath.Join(root, sub), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		s.nodes[i] = agentConfig{Socket: filepath.Join(shortDir(t), "ckpt.sock"), StorageDir: storageDir, Job: fleetSoakJob,
			LocalDir: filepath.Join(root, "local"), AllowRoots: []string{root}, Env: []string{unsafeGCGrace},
			Extra: []string{"--node", name, "--retain", "1", "--gc-interval", "1s", "--gc-grace", "3s"}}
	}
	// The secret: root-only, outside every allowed root, large enough to
	// be uploaded as an object of its own were it ever read.
	s.secret = []byte(fmt.Sprintf("CKPT-FLEET-SOAK-SECRET-%d-", seed))
	secretPath := filepath.Join(base, "secret", "key.sst")
	writeFile(t, secretPath, bytes.Repeat(s.secret, (300<<10)/len(s.secret)))
	if err := os.Chmod(secretPath, 0o600); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"node-a", "node-b"} {
		startAgent(t, name, s.nodes[i])
	}

	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var wg sync.WaitGroup
	for i, task := range fleetSoakTasks {
		rng := rand.New(rand.NewPCG(seed, uint64(i)+1))
		wg.Add(1)
		go func() { defer wg.Done(); s.taskLoop(ctx, task, rng) }()
	}
	wg.Add(2)
	go func() { defer wg.Done(); s.hostileLoop(ctx, secretPath) }()
	go func() {
		defer wg.Done()
		tick := time.NewTicker(fleetSoakCheck)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				for _, task := range append(slices.Clone(fleetSoakTasks), "hostile") {
					s.check(ctx, task)
				}
			}
		}
	}()
	wg.Wait()

	// The end: every task's newest checkpoint restores, the whole job
	// verifies, and the secret is nowhere in storage.
	fctx, fcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer fcancel()
	for _, task := range append(slices.Clone(fleetSoakTasks), "hostile") {
		s.check(fctx, task)
	}
	if out, err := ckptCtx(fctx, []string{unsafeGCGrace}, "verify", "--storage", s.storage, "--job", fleetSoakJob); err != nil {
		s.problem("ckpt verify of the job: %v: %s", err, out)
	}
	if p, err := scanForSecret(storageDir, s.secret); err != nil {
		s.problem("scan storage: %v", err)
	} else if p != "" {
		s.problem("the secret a hostile peer linked after synced is in storage: %s", p)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	for k := range s.stats {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var summary []string
	for _, k := range keys {
		summary = append(summary, fmt.Sprintf("%s %d", k, s.stats[k]))
	}
	t.Logf("fleet soak: %s", strings.Join(summary, ", "))
	for _, p := range s.problems {
		t.Error(p)
	}
	// A soak that did not exercise what it is for proves nothing.
	if s.stats["moves"] < 4 || s.stats["completed"] < 20 || s.stats["checks"] < 5 {
		t.Errorf("the soak did too little to show anything: %v", s.stats)
	}
	if s.stats["hostile checkpoints completed"]+s.stats["hostile checkpoints failed"] < 3 {
		t.Errorf("the hostile peer made too few attempts: %v", s.stats)
	}
}
