package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/client"
	ckptpebble "github.com/ckpt-io/ckpt/client/pebble"
	"github.com/ckpt-io/ckpt/lab/testservers"
	"github.com/ckpt-io/ckpt/lab/workload"
)

// The soak: a Pebble app checkpoints every second through a real agent on
// S3, behind a proxy that fails about 5% of the requests, while the agent
// is SIGKILLed and restarted every 10 to 20 seconds. Its length is
// CKPT_SOAK (a Go duration, default soakDefault); CKPT_SOAK_SEED repeats a
// run's fault and kill schedule (timing still varies).
const (
	soakDefault  = 90 * time.Second
	soakRetain   = 2                // --retain of the agent
	soakGCGrace  = 30 * time.Second // --gc-grace: GC deletes during the soak
	soakGCEvery  = 5 * time.Second  // --gc-interval
	soakCheckGap = 5 * time.Second  // between two checks of storage
	soakKillMin  = 10 * time.Second
	soakKillMax  = 20 * time.Second
	soakQuiet    = 5 * time.Second // no kill this close to the end
	soakRounds   = 3               // workload rounds between two checkpoints
	// soakUploadRate (bytes/s) stretches the async phases to a few hundred
	// ms, as on a real link, so that kills land in them.
	soakUploadRate = 24_000_000
	soakTask       = "soak-0"
	soakJob        = "soak"
	soakSendLimit  = 15 * time.Second // a checkpoint request gets synced within this
)

// soakFaults fails 5% of the requests (SlowDown, 500, resets before and
// after the server applied the request) and delays 2% more by up to 200 ms.
var soakFaults = faultMix{SlowDown: 0.025, Internal: 0.005, ResetBefore: 0.01, ResetAfter: 0.01, Latency: 0.02, MaxDelay: 200 * time.Millisecond}

func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv("CKPT_SOAK")
	if v == "" {
		return soakDefault
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 10*time.Second {
		t.Fatalf("CKPT_SOAK=%q: want a Go duration of at least 10s, such as 90s or 30m", v)
	}
	return d
}

func soakSeed(t *testing.T) uint64 {
	t.Helper()
	v := os.Getenv("CKPT_SOAK_SEED")
	if v == "" {
		return uint64(time.Now().UnixNano())
	}
	s, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("CKPT_SOAK_SEED=%q: want an unsigned integer", v)
	}
	return s
}

// soakLedger is what the app knows of its checkpoints: each attempt's
// outcome as the agent reported it, and the expected state of those that
// may still be checked. It is shared by the app loop, the goroutines that
// wait for outcomes and the checker.
type soakLedger struct {
	mu        sync.Mutex
	attempted int
	// completed holds every checkpoint reported completed, ascending (the
	// agent commits one task's checkpoints in order).
	completed []uint64
	// failed counts the other outcomes by reason; agentFailed holds the
	// checkpoints the agent itself reported failed.
	failed      map[string]int
	agentFailed map[uint64]string
	// expected holds the state at checkpoints in flight and at the newest
	// reported completed ones: nothing older can still be checked.
	expected map[uint64]*workload.Expected
	inflight map[uint64]bool
	// durations are the async phases reported (duration_ms), uploaded the
	// bytes shipped (checkpoint_size).
	durations []time.Duration
	uploaded  int64

	lost     []string // checkpoints reported completed, later missing or bad
	phantoms []string // checkpoints reported failed, found complete in storage
	// unreported holds checkpoints storage listed that were never reported
	// completed nor failed by the agent: commits whose report a kill cut off.
	unreported map[uint64]bool
	checks     int // restore checks passed
	raced      int // restore checks of a checkpoint retired meanwhile
}

func newSoakLedger() *soakLedger {
	return &soakLedger{failed: map[string]int{}, agentFailed: map[uint64]string{},
		expected: map[uint64]*workload.Expected{}, inflight: map[uint64]bool{}, unreported: map[uint64]bool{}}
}

func (l *soakLedger) sent(n uint64, exp *workload.Expected) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempted++
	l.expected[n] = exp
	l.inflight[n] = true
}

// fail records a checkpoint that did not complete; agent is true when the
// agent reported the failure (not a lost connection or a refusal).
func (l *soakLedger) fail(n uint64, reason string, agentSaid bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failed[reason]++
	if agentSaid {
		l.agentFailed[n] = reason
	}
	delete(l.inflight, n)
	delete(l.expected, n)
}

func (l *soakLedger) complete(n uint64, ev client.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.inflight, n)
	i, _ := slices.BinarySearch(l.completed, n)
	l.completed = slices.Insert(l.completed, i, n)
	l.durations = append(l.durations, time.Duration(ev.DurationMS)*time.Millisecond)
	l.uploaded += ev.CheckpointSize
	// Keep the expected state of the newest few completed checkpoints and
	// of those in flight.
	keep := map[uint64]bool{}
	for _, c := range l.completed[max(0, len(l.completed)-soakRetain-1):] {
		keep[c] = true
	}
	for k := range l.expected {
		if !keep[k] && !l.inflight[k] {
			delete(l.expected, k)
		}
	}
}

func (l *soakLedger) addLost(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lost = append(l.lost, fmt.Sprintf(format, args...))
}

// view is a copy of what the checker needs.
func (l *soakLedger) view() (completed []uint64, expected map[uint64]*workload.Expected) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.completed), cloneMap(l.expected)
}

func cloneMap[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// newestRetained returns the checkpoints that must be listed: those
// reported completed that are among the soakRetain newest of every
// checkpoint known complete (reported, or listed by storage; a commit
// whose report a kill cut off counts too, and may push an older reported
// one out).
func newestRetained(completed []uint64, listed map[uint64]bool) []uint64 {
	all := map[uint64]bool{}
	for _, c := range completed {
		all[c] = true
	}
	for c := range listed {
		all[c] = true
	}
	nums := make([]uint64, 0, len(all))
	for c := range all {
		nums = append(nums, c)
	}
	slices.Sort(nums)
	top := nums[max(0, len(nums)-soakRetain):]
	var out []uint64
	for _, c := range top {
		if _, ok := slices.BinarySearch(completed, c); ok {
			out = append(out, c)
		}
	}
	return out
}

// soakRun is one soak: the servers, the agent and the ledger.
type soakRun struct {
	t       *testing.T
	direct  *backend // storage without the faults, for checks
	proxy   *faultProxy
	cfg     agentConfig
	ledger  *soakLedger
	scratch string // restore targets of the checker

	agent      *agentProc
	lives      int // agent processes started
	startFails int // agents that exited before serving
	stderrs    []*lockedBuffer
}

// startAgent starts an agent life and waits for it to serve. An agent
// that exits before serving (a start-up step that failed through the
// faults) is started again, up to five times in a row.
func (s *soakRun) startAgent() {
	t := s.t
	t.Helper()
	for attempt := 1; ; attempt++ {
		s.lives++
		a := launchAgent(t, fmt.Sprintf("life-%d", s.lives), s.cfg)
		s.stderrs = append(s.stderrs, a.stderr)
		err := waitServing(a, 30*time.Second)
		if err == nil {
			s.agent = a
			return
		}
		s.startFails++
		if attempt == 5 {
			t.Fatalf("the agent did not start in 5 attempts: %v", err)
		}
		t.Logf("agent life %d did not start (attempt %d), starting it again: %v", s.lives, attempt, err)
	}
}

// waitServing waits until a answers hello; an agent that exits first or
// does not answer in time is an error (and is killed).
func waitServing(a *agentProc, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-a.exited:
			return fmt.Errorf("exited before serving (%v): %s", a.state, tailLines(a.stderr.String(), 5))
		default:
		}
		if hello(a.cfg.Socket) == nil {
			return nil
		}
		if time.Now().After(deadline) {
			a.cmd.Process.Kill()
			<-a.exited
			return fmt.Errorf("no hello after %v: %s", limit, tailLines(a.stderr.String(), 5))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// ckptCtx runs a ckpt command off the test goroutine: no t.Fatal, the
// exit status is an error.
func ckptCtx(ctx context.Context, env []string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, ckptBin, args...)
	cmd.Env = childEnv(env)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("ckpt %s: %v: %s", args[0], err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// listed lists the task's complete checkpoints, straight from the server.
func (s *soakRun) listed(ctx context.Context) (map[uint64]bool, error) {
	out, err := ckptCtx(ctx, s.direct.env, "list", "--storage", s.direct.url, "--job", soakJob, "--task", soakTask, "--json")
	if err != nil {
		return nil, err
	}
	var list []listEntry
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, fmt.Errorf("ckpt list: %v: %s", err, out)
	}
	got := map[uint64]bool{}
	for _, e := range list {
		got[e.Checkpoint] = true
	}
	return got, nil
}

// check looks at storage the way a restore would. Every checkpoint
// reported completed that must still be retained is listed; one of them,
// picked at random, restores from storage alone into a store that holds
// exactly the state the app had at that checkpoint. A restore that fails
// counts as lost unless the checkpoint was retired meanwhile (newer ones
// completed). It returns an error only when it could not look.
func (s *soakRun) check(ctx context.Context, rng *rand.Rand) error {
	l := s.ledger
	completed, expected := l.view()
	listed, err := s.listed(ctx)
	if err != nil {
		return err
	}
	must := newestRetained(completed, listed)
	for _, c := range must {
		if !listed[c] {
			l.addLost("checkpoint %d was reported completed and is among the %d newest, but storage does not list it (listed: %v)", c, soakRetain, sortedKeys(listed))
		}
	}
	l.mu.Lock()
	for c := range listed {
		_, reported := slices.BinarySearch(l.completed, c)
		switch reason, failed := l.agentFailed[c]; {
		case failed:
			if !slices.ContainsFunc(l.phantoms, func(p string) bool { return strings.HasPrefix(p, fmt.Sprintf("checkpoint %d ", c)) }) {
				l.phantoms = append(l.phantoms, fmt.Sprintf("checkpoint %d was reported failed (%s) but storage lists it complete", c, reason))
			}
		case !reported && !l.inflight[c]:
			l.unreported[c] = true
		}
	}
	l.mu.Unlock()
	var candidates []uint64
	for _, c := range must {
		if listed[c] && expected[c] != nil {
			candidates = append(candidates, c)
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	c := candidates[rng.IntN(len(candidates))]
	target, err := os.MkdirTemp(s.scratch, "check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(target)
	target = filepath.Join(target, "store")
	_, rerr := ckptCtx(ctx, s.direct.env, "restore", "--storage", s.direct.url, "--job", soakJob, "--task", soakTask,
		"--checkpoint", strconv.FormatUint(c, 10), "--target", target, "--json")
	if rerr != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Retired meanwhile? Then newer checkpoints completed and push it
		// out of the retained ones.
		completed, _ = l.view()
		listed, err = s.listed(ctx)
		if err != nil {
			return err
		}
		if !slices.Contains(newestRetained(completed, listed), c) {
			l.mu.Lock()
			l.raced++
			l.mu.Unlock()
			return nil
		}
		l.addLost("checkpoint %d was reported completed, is retained (listed: %t), and does not restore from storage: %v", c, listed[c], rerr)
		return nil
	}
	if err := verifyRestored(ctx, target, expected[c]); err != nil {
		l.addLost("checkpoint %d was reported completed and restores from storage into a store that differs from the app's state at that checkpoint: %v", c, err)
		return nil
	}
	l.mu.Lock()
	l.checks++
	l.mu.Unlock()
	return nil
}

// verifyRestored opens a restored store and compares it key by key with
// the expected state.
func verifyRestored(ctx context.Context, dir string, exp *workload.Expected) error {
	db, err := pebble.Open(dir, workload.PebbleOptions(0))
	if err != nil {
		return fmt.Errorf("open the restored store: %w", err)
	}
	defer db.Close()
	return workload.Verify(ctx, db, exp)
}

func sortedKeys(m map[uint64]bool) []uint64 {
	out := make([]uint64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// failReason names why a checkpoint did not complete, and whether the
// agent said so.
func failReason(err error) (reason string, agentSaid bool) {
	var ce *client.Error
	switch {
	case errors.As(err, &ce):
		return "agent: " + ce.Code, true
	case errors.Is(err, client.ErrAborted):
		return "aborted", true
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out", false
	}
	return "connection lost", false
}

// gcSweeps sums the GC sweeps the agents logged.
func gcSweeps(stderrs []*lockedBuffer) (sweeps, deleted int, failed int) {
	for _, b := range stderrs {
		sc := bufio.NewScanner(strings.NewReader(b.String()))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var rec struct {
				Msg     string `json:"msg"`
				Level   string `json:"level"`
				Deleted int    `json:"deleted_objects"`
			}
			if json.Unmarshal(sc.Bytes(), &rec) != nil || rec.Msg != "gc" {
				continue
			}
			if rec.Level == "WARN" {
				failed++
				continue
			}
			sweeps++
			deleted += rec.Deleted
		}
	}
	return sweeps, deleted, failed
}

func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak runs for minutes; skipped with -short")
	}
	dur, seed := soakDuration(t), soakSeed(t)
	t.Logf("soak for %v, seed %d (CKPT_SOAK=%v CKPT_SOAK_SEED=%d repeats the fault and kill schedule)", dur, seed, dur, seed)
	rng := rand.New(rand.NewPCG(seed, 0x50a4))

	srv := testservers.S3(t)
	srv.CreateBucket(t, testBucket)
	proxy := startFaultProxyMix(t, srv.Endpoint, seed, soakFaults)
	storageURL, env := s3ViaProxy(srv.Env(), srv.Region, proxy)
	// GC marks, then deletes a mark delay later: both short, so collections
	// delete during the soak while checkpoints, retries and kills go on.
	env = append(env, "CKPT_UNSAFE_MIN_GC_GRACE="+soakGCGrace.String(), "CKPT_UNSAFE_GC_MARK_DELAY="+soakGCGrace.String())
	root, localDir := t.TempDir(), t.TempDir()
	s := &soakRun{
		t:       t,
		direct:  &backend{name: "s3", url: srv.URL(testBucket, testPrefix), env: srv.Env(), root: srv.DataDir, s3: srv},
		proxy:   proxy,
		ledger:  newSoakLedger(),
		scratch: t.TempDir(),
		cfg: agentConfig{Socket: filepath.Join(shortDir(t), "ckpt.sock"), Storage: storageURL, Env: env, Job: soakJob,
			LocalDir: localDir, AllowRoots: []string{root},
			Extra: []string{"--retain", strconv.Itoa(soakRetain), "--gc-grace", soakGCGrace.String(),
				"--gc-interval", soakGCEvery.String(), "--upload-rate", strconv.Itoa(soakUploadRate), "--log-level", "info"}},
	}
	proxy.set(true, nil) // every agent start goes through the faults too
	s.startAgent()

	storeDir := filepath.Join(root, "store")
	w, err := workload.Open(storeDir, workload.Options{Seed: seed, StateBytes: 8 << 20, MemTableSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The checker looks at storage every few seconds while the app runs,
	// and right after each restart of the agent (nudge).
	checkCtx, stopChecks := context.WithCancel(ctx)
	nudge := make(chan struct{}, 1)
	var checkErrs []string
	checkerDone := make(chan struct{})
	go func() {
		defer close(checkerDone)
		crng := rand.New(rand.NewPCG(seed, 0xc4ec))
		tick := time.NewTicker(soakCheckGap)
		defer tick.Stop()
		for {
			select {
			case <-checkCtx.Done():
				return
			case <-tick.C:
			case <-nudge:
			}
			if err := s.check(checkCtx, crng); err != nil && checkCtx.Err() == nil {
				checkErrs = append(checkErrs, err.Error())
			}
		}
	}()

	// The app: a few rounds of churn, then a checkpoint, every second. A
	// checkpoint that fails is not retried under its number: the next one
	// takes a new number.
	var (
		c       *client.Client
		waits   sync.WaitGroup
		kills   int
		start   = time.Now()
		end     = start.Add(dur)
		killGap = func() time.Duration { return soakKillMin + time.Duration(rng.Int64N(int64(soakKillMax-soakKillMin))) }
		nextKil = start.Add(killGap())
		n       uint64
	)
	closeClient := func() {
		if c != nil {
			c.Close()
			c = nil
		}
	}
	tick := time.NewTicker(time.Second)
	for time.Now().Before(end) {
		n++
		for range soakRounds {
			if _, err := w.Round(ctx); err != nil {
				t.Fatalf("workload round: %v", err)
			}
		}
		exp := w.Snapshot()
		s.ledger.sent(n, exp)
		if c == nil {
			if c, err = client.Dial(ctx, s.cfg.Socket); err != nil {
				c = nil
				s.ledger.fail(n, "no agent", false)
			}
		}
		if c != nil {
			sendCtx, sendDone := context.WithTimeout(ctx, soakSendLimit)
			p, err := ckptpebble.Checkpoint(sendCtx, c, w.DB(), storeDir, soakTask, n)
			sendDone()
			if err != nil {
				reason, agentSaid := failReason(err)
				s.ledger.fail(n, "refused: "+reason, agentSaid)
				if !agentSaid {
					closeClient()
				}
			} else {
				waits.Add(1)
				go func(n uint64) {
					defer waits.Done()
					ev, err := p.Wait(ctx)
					if err != nil {
						reason, agentSaid := failReason(err)
						s.ledger.fail(n, reason, agentSaid)
						return
					}
					s.ledger.complete(n, ev)
				}(n)
			}
		}

		if now := time.Now(); now.After(nextKil) && now.Before(end.Add(-soakQuiet)) {
			// Land the kill most often in the checkpoint's async phase
			// (a few hundred ms), sometimes after it.
			time.Sleep(time.Duration(rng.Int64N(int64(400 * time.Millisecond))))
			s.ledger.mu.Lock()
			inflight := sortedKeys(s.ledger.inflight)
			s.ledger.mu.Unlock()
			s.agent.kill()
			kills++
			closeClient()
			gap := killGap()
			t.Logf("%6.1fs: SIGKILL %d of agent life %d, checkpoints in flight %v; next kill in %v",
				time.Since(start).Seconds(), kills, s.lives, inflight, gap.Round(time.Millisecond))
			s.startAgent()
			nextKil = time.Now().Add(gap)
			select {
			case nudge <- struct{}{}:
			default:
			}
		}
		<-tick.C
	}
	tick.Stop()

	// Let the last checkpoints end, then a last look at storage.
	waited := make(chan struct{})
	go func() { waits.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(3 * time.Minute):
		t.Fatalf("checkpoints still in flight 3 minutes after the soak ended")
	}
	closeClient()
	stopChecks()
	<-checkerDone
	if err := s.check(ctx, rand.New(rand.NewPCG(seed, 0xf1))); err != nil {
		t.Fatalf("final check: %v", err)
	}
	s.agent.stop()
	requests, failedReqs, delayed := proxy.tally()
	proxy.set(false, nil)

	// The whole job verifies, and the newest checkpoint restores from
	// storage alone to exactly the app's state at that checkpoint.
	s.direct.verify(t, soakJob)
	l := s.ledger
	completed, expected := l.view()
	var final string
	if len(completed) > 0 {
		newest := completed[len(completed)-1]
		target, rr, _ := s.direct.restoreFromStorage(t, soakJob, soakTask)
		if rr.Checkpoint != newest {
			t.Errorf("restore from storage gave checkpoint %d; the newest reported completed is %d", rr.Checkpoint, newest)
		}
		if err := verifyRestored(ctx, target, expected[newest]); err != nil {
			l.addLost("checkpoint %d, the newest completed, restores into a store that differs from the app's state: %v", newest, err)
		} else {
			final = fmt.Sprintf("checkpoint %d restored from storage, %d keys match", newest, expected[newest].Keys())
		}
	}

	sweeps, deleted, gcFailed := gcSweeps(s.stderrs)
	l.mu.Lock()
	defer l.mu.Unlock()
	var reasons []string
	for r, k := range l.failed {
		reasons = append(reasons, fmt.Sprintf("%s: %d", r, k))
	}
	sort.Strings(reasons)
	nFailed := 0
	for _, k := range l.failed {
		nFailed += k
	}
	elapsed := time.Since(start).Round(time.Second)
	slices.Sort(l.durations)
	pct := func(p float64) time.Duration {
		if len(l.durations) == 0 {
			return 0
		}
		return l.durations[int(p*float64(len(l.durations)-1))]
	}
	t.Logf("checkpoints: %d attempted, %d completed, %d failed (%s), %d lost; async phase p50 %v, p90 %v, max %v; %.1f MiB uploaded (%.2f MiB per checkpoint)",
		l.attempted, len(l.completed), nFailed, strings.Join(reasons, ", "), len(l.lost), pct(0.5), pct(0.9), pct(1),
		float64(l.uploaded)/(1<<20), float64(l.uploaded)/(1<<20)/float64(max(1, len(l.completed))))
	t.Logf("storage: %d requests through the proxy, %d failed (%.2f%%), %d delayed: %s", requests, failedReqs, 100*float64(failedReqs)/float64(max(1, requests)), delayed, proxy.summary())
	t.Logf("agent: %d kills, %d lives, %d starts that failed; GC: %d sweeps deleted %d objects, %d sweeps failed", kills, s.lives, s.startFails, sweeps, deleted, gcFailed)
	t.Logf("checks: %d restores from storage matched the app's state, %d raced a retirement; %d commits unreported because of a kill %v; final: %s",
		l.checks, l.raced, len(l.unreported), sortedKeys(l.unreported), final)
	for _, p := range l.phantoms {
		t.Logf("phantom: %s", p)
	}
	for _, e := range checkErrs {
		t.Logf("check error: %s", e)
	}
	t.Logf("SOAK SUMMARY: %v seed=%d completed=%d failed=%d lost=%d kills=%d faults=%d/%d (%.1f%%) gc_deleted=%d restore_checks=%d verify=ok final_restore=%t",
		elapsed, seed, len(l.completed), nFailed, len(l.lost), kills, failedReqs, requests, 100*float64(failedReqs)/float64(max(1, requests)), deleted, l.checks, final != "")

	for _, lost := range l.lost {
		t.Errorf("LOST: %s", lost)
	}
	if len(l.lost) > 0 {
		t.Logf("newest injected faults:\n%s", tailLines(proxy.faultLog(), 200))
	}
	if len(l.completed) == 0 {
		t.Error("no checkpoint completed")
	}
	if want := min(3, max(1, int(dur/soakKillMax))); kills < want {
		t.Errorf("the agent was killed %d times, want at least %d", kills, want)
	}
	if len(checkErrs) > 0 {
		t.Errorf("%d checks of storage could not run", len(checkErrs))
	}
}
