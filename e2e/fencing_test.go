package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// checkpointEvent is the completed or failed event `ckpt trigger --json`
// prints.
type checkpointEvent struct {
	Event      string `json:"event"`
	Task       string `json:"task"`
	Checkpoint uint64 `json:"checkpoint"`
	DurationMS int64  `json:"duration_ms"`
	Error      *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// triggerOutcome is what one `ckpt trigger --json` ended with.
type triggerOutcome struct {
	ev            checkpointEvent
	code          int
	start, end    time.Time
	stdout, stder []byte
	err           error // the command could not be run or its output not read
}

// triggerAsync runs `ckpt trigger --json` without touching t, so that it
// can run on any goroutine, and reports its event whatever the exit code.
func triggerAsync(socket, task string, n uint64, dir string) triggerOutcome {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, ckptBin, "trigger", "--socket", socket, "--task", task, "--checkpoint", fmt.Sprint(n), "--dir", dir, "--json")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	o := triggerOutcome{start: time.Now()}
	err := cmd.Run()
	o.end = time.Now()
	o.stdout, o.stder = out.Bytes(), errb.Bytes()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		o.code = ee.ExitCode()
	default:
		o.err = err
		return o
	}
	if jerr := json.Unmarshal(o.stdout, &o.ev); jerr != nil {
		o.err = fmt.Errorf("stdout is not one JSON event: %v: %q (stderr %q)", jerr, o.stdout, o.stder)
	}
	return o
}

// writeFencingSnapshot writes a small store whose bytes depend only on
// seed.
func writeFencingSnapshot(t *testing.T, dir string, seed uint64) {
	t.Helper()
	for i := range uint64(3) {
		writeFile(t, filepath.Join(dir, fmt.Sprintf("%06d.sst", seed+i)), randomBytes(256<<10, seed*10+i))
	}
	writeFile(t, filepath.Join(dir, "CURRENT"), []byte("MANIFEST-000001\n"))
	writeFile(t, filepath.Join(dir, "MANIFEST-000001"), randomBytes(8<<10, seed*10+7))
	writeFile(t, filepath.Join(dir, "OPTIONS-000003"), []byte(fmt.Sprintf("[Options]\n  seed=%d\n", seed)))
}

func TestTwoAgentsCommittingTheSameCheckpointExactlyOneWinsOnEveryBackend(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		const job, task = "fence", "fence-0"
		const rounds = 4
		for round := 1; round <= rounds; round++ {
			n := uint64(round)
			same := round%2 == 1
			// Fresh agents every round: neither knows checkpoint n exists.
			var sockets, snaps [2]string
			for i := range 2 {
				root, local := t.TempDir(), t.TempDir()
				sockets[i] = filepath.Join(shortDir(t), "ckpt.sock")
				startAgent(t, fmt.Sprintf("round %d agent %d", round, i), b.agentConfig(sockets[i], job, local, []string{root}))
				snaps[i] = filepath.Join(root, fmt.Sprintf("snap-%d", n))
				seed := uint64(round * 100)
				if !same {
					seed += uint64(i * 10)
				}
				writeFencingSnapshot(t, snaps[i], seed)
			}

			var outs [2]triggerOutcome
			var wg sync.WaitGroup
			startGate := make(chan struct{})
			for i := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-startGate
					outs[i] = triggerAsync(sockets[i], task, n, snaps[i])
				}()
			}
			close(startGate)
			wg.Wait()

			winner, loser := -1, -1
			for i, o := range outs {
				if o.err != nil {
					t.Fatalf("round %d agent %d: %v", round, i, o.err)
				}
				switch {
				case o.ev.Event == "completed" && o.code == 0:
					if winner >= 0 {
						t.Fatalf("round %d (same content %v): both agents completed checkpoint %d", round, same, n)
					}
					winner = i
				case o.ev.Event == "failed" && o.ev.Error != nil && o.ev.Error.Code == "conflict" && o.code == 1:
					loser = i
				default:
					t.Fatalf("round %d agent %d: exit %d, event %+v, want completed or failed with code conflict\nstderr: %s", round, i, o.code, o.ev, o.stder)
				}
			}
			if winner < 0 || loser < 0 {
				t.Fatalf("round %d: winner %d, loser %d; want one of each", round, winner, loser)
			}
			overlap := outs[0].start.Before(outs[1].end) && outs[1].start.Before(outs[0].end)
			t.Logf("%s round %d (same content %v): agent %d completed in %v, agent %d failed (%s: %s) in %v; the triggers overlapped: %v",
				b.name, round, same, winner, outs[winner].end.Sub(outs[winner].start).Round(time.Millisecond),
				loser, outs[loser].ev.Error.Code, outs[loser].ev.Error.Message, outs[loser].end.Sub(outs[loser].start).Round(time.Millisecond), overlap)
			if !strings.Contains(outs[loser].ev.Error.Message, fmt.Sprint(n)) {
				t.Errorf("the conflict message does not name checkpoint %d: %s", n, outs[loser].ev.Error.Message)
			}

			// The stored checkpoint is the winner's.
			m := b.manifest(t, job, task, n)
			want := fileHashes(t, snaps[winner])
			if len(m.Files) != len(want) {
				t.Errorf("round %d: the stored manifest names %d files, the winner's snapshot has %d", round, len(m.Files), len(want))
			}
			for _, f := range m.Files {
				if want[f.Name] != f.ContentID() {
					t.Errorf("round %d: the stored manifest's %s is not the winner's", round, f.Name)
				}
			}
			target, _, _ := b.restoreFromStorage(t, job, task, "--checkpoint", fmt.Sprint(n))
			requireSameFiles(t, snaps[winner], target)
			b.verify(t, job, "--task", task, "--checkpoint", fmt.Sprint(n))
		}
		b.verify(t, job)
	})
}
