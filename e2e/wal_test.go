package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/client"
	cpebble "github.com/ckpt-io/ckpt/client/pebble"
)

// The WAL app: the e2e test binary run again as a Pebble app that writes
// a stream of synced batches, logs each acknowledged one, and checkpoints
// through the agent after a second and then every CKPT_E2E_WAL_EVERY (its
// WAL shipped between checkpoints by the agent). It runs until it is
// killed.
func init() {
	if os.Getenv("CKPT_E2E_WAL_APP") == "" {
		return
	}
	if err := walApp(); err != nil {
		fmt.Fprintln(os.Stderr, "wal app:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// walKey names write i; each write is a batch of two keys (a and b) with
// the same value, so a half-applied batch shows.
func walKey(i int, half string) []byte { return fmt.Appendf(nil, "w-%08d/%s", i, half) }

func walValue(i int) []byte {
	return fmt.Appendf(nil, "value of write %d;%s", i, strings.Repeat("x", 200))
}

func walApp() error {
	socket, dbDir, task := os.Getenv("CKPT_E2E_SOCKET"), os.Getenv("CKPT_E2E_DB"), os.Getenv("CKPT_E2E_TASK")
	every, err := time.ParseDuration(os.Getenv("CKPT_E2E_WAL_EVERY"))
	if err != nil {
		return err
	}
	acks, err := os.OpenFile(os.Getenv("CKPT_E2E_ACKS"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	db, err := pebble.Open(dbDir, &pebble.Options{MemTableSize: 1 << 20})
	if err != nil {
		return err
	}
	ctx := context.Background()
	c, err := client.Dial(ctx, socket, client.WithDialWait(20*time.Second))
	if err != nil {
		return err
	}
	next, n := time.Now().Add(time.Second), uint64(1) // the first checkpoint after a second, then every `every`
	pendings := make(chan *client.Pending, 16)
	go func() {
		for p := range pendings {
			p.Wait(ctx) // outcomes are the agent's to report; the test reads storage
		}
	}()
	for i := 0; ; i++ {
		b := db.NewBatch()
		b.Set(walKey(i, "a"), walValue(i), nil)
		b.Set(walKey(i, "b"), walValue(i), nil)
		if err := b.Commit(pebble.Sync); err != nil {
			return err
		}
		// The write is acknowledged: log it with the time it was.
		fmt.Fprintf(acks, "%d %d\n", i, time.Now().UnixNano())
		if time.Now().After(next) {
			p, err := cpebble.Checkpoint(ctx, c, db, dbDir, task, n)
			if err != nil {
				return fmt.Errorf("checkpoint %d: %w", n, err)
			}
			pendings <- p
			n++
			next = time.Now().Add(every)
		}
	}
}

type walAck struct {
	i  int
	at time.Time
}

func readAcks(t *testing.T, path string) []walAck {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []walAck
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var i int
		var ns int64
		if _, err := fmt.Sscanf(sc.Text(), "%d %d", &i, &ns); err != nil {
			continue // the last line, cut by the kill
		}
		out = append(out, walAck{i, time.Unix(0, ns)})
	}
	return out
}

// TestAKilledAppAndNodeLoseOnlyTheLastSecondsOfWrites is the RPO's
// end-to-end: a Pebble app writes synced batches (its 1 MiB memtable
// rotates the log every fraction of a second) and checkpoints once through
// an agent that ships its WAL every second; the app and the agent are
// SIGKILLed in the middle of the stream and the node's disks removed; a
// restore on another node brings back every write acknowledged more than
// the WAL interval plus one upload before the kill, key by key against the
// app's log of acknowledged writes, no batch half applied; the drill
// reports the RPO it would achieve.
func TestAKilledAppAndNodeLoseOnlyTheLastSecondsOfWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an app and an agent for seconds")
	}
	const (
		walInterval = time.Second
		// oneUpload bounds one WAL round's upload and commit to file://
		// storage on a loaded machine.
		oneUpload = 2 * time.Second
	)
	node := t.TempDir()
	storageDir := filepath.Join(t.TempDir(), "storage")
	sock := filepath.Join(shortDir(t), "ckpt.sock")
	dbDir := filepath.Join(node, "db")
	acksPath := filepath.Join(t.TempDir(), "acks")
	a := startAgent(t, "node-1", agentConfig{Socket: sock, StorageDir: storageDir, Job: "orders", LocalDir: filepath.Join(node, "local"),
		Extra: []string{"--wal-interval", walInterval.String()}})

	app := exec.Command(os.Args[0], "-test.run=^$")
	app.Env = append(os.Environ(), "CKPT_E2E_WAL_APP=1", "CKPT_E2E_SOCKET="+sock, "CKPT_E2E_DB="+dbDir,
		"CKPT_E2E_TASK=orders-0", "CKPT_E2E_WAL_EVERY=1m", "CKPT_E2E_ACKS="+acksPath)
	var appErr lockedBuffer
	app.Stderr = &appErr
	if err := app.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- app.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("the app exited early: %v\n%s", err, &appErr)
	case <-time.After(8500 * time.Millisecond): // a checkpoint at 1 s, then the WAL alone
	}
	killAt := time.Now()
	app.Process.Signal(syscall.SIGKILL)
	<-exited
	a.kill()
	if err := os.RemoveAll(node); err != nil { // the node is gone, disks and all
		t.Fatal(err)
	}

	acks := readAcks(t, acksPath)
	if len(acks) < 100 {
		t.Fatalf("the app acknowledged %d writes in 8 s; stderr:\n%s", len(acks), &appErr)
	}
	target := filepath.Join(t.TempDir(), "restored")
	var res struct {
		restoreResult
		WALPosition *struct {
			Checkpoint uint64 `json:"checkpoint"`
			Seq        uint64 `json:"seq"`
			Log        string `json:"log"`
			Offset     int64  `json:"offset"`
		} `json:"wal_position"`
		RecoveredWriteAgeMS int64 `json:"recovered_write_age_ms"`
	}
	ckptJSON(t, &res, "restore", "--storage", "file://"+storageDir, "--job", "orders", "--task", "orders-0", "--target", target, "--json")
	if !res.Restored || res.WALPosition == nil || res.WALPosition.Seq == 0 {
		t.Fatalf("restore: %+v, want a checkpoint and a WAL position", res)
	}
	db, err := pebble.Open(target, &pebble.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("open the restored store: %v", err)
	}
	defer db.Close()
	cutoff := killAt.Add(-walInterval - oneUpload)
	newest, missing := -1, 0
	for _, ack := range acks {
		va, errA := get(db, walKey(ack.i, "a"))
		vb, errB := get(db, walKey(ack.i, "b"))
		switch {
		case errA != nil && errB != nil:
			if ack.at.Before(cutoff) {
				missing++
				if missing <= 5 {
					t.Errorf("write %d, acknowledged %v before the kill, is not restored", ack.i, killAt.Sub(ack.at))
				}
			}
		case errA != nil || errB != nil:
			t.Errorf("write %d is half applied (a: %v, b: %v)", ack.i, errA, errB)
		case string(va) != string(walValue(ack.i)) || string(vb) != string(walValue(ack.i)):
			t.Errorf("write %d restored with another value", ack.i)
		default:
			newest = ack.i
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d writes acknowledged more than %v before the kill are missing", missing, len(acks), walInterval+oneUpload)
	}
	lost := killAt.Sub(acks[len(acks)-1].at)
	for _, ack := range acks {
		if ack.i == newest {
			lost = killAt.Sub(ack.at)
		}
	}
	t.Logf("%d writes acknowledged; restored checkpoint %d and WAL to seq %d; newest restored write acknowledged %v before the kill (recovered_write_age_ms %d at restore)",
		len(acks), res.Checkpoint, res.WALPosition.Seq, lost.Round(time.Millisecond), res.RecoveredWriteAgeMS)

	var drill struct {
		RPOMS      *int64 `json:"rpo_ms"`
		DurationMS int64  `json:"duration_ms"`
	}
	before := time.Since(killAt)
	ckptJSON(t, &drill, "drill", "--storage", "file://"+storageDir, "--job", "orders", "--task", "orders-0", "--json")
	after := time.Since(killAt)
	// Nothing was shipped after the kill, and what was shipped reaches to
	// within an interval and an upload of it: the RPO the drill reports
	// lies between.
	if drill.RPOMS == nil {
		t.Fatal("drill: no rpo_ms")
	}
	rpo := time.Duration(*drill.RPOMS) * time.Millisecond
	if rpo < before.Truncate(time.Millisecond) || rpo > after+walInterval+oneUpload {
		t.Fatalf("drill: rpo %v, want between %v (the kill) and %v (the kill, an interval and an upload)", rpo, before, after+walInterval+oneUpload)
	}
	t.Logf("drill: rpo %v, rto %v", rpo, time.Duration(drill.DurationMS)*time.Millisecond)
}

func get(db *pebble.DB, key []byte) ([]byte, error) {
	v, closer, err := db.Get(key)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	return append([]byte(nil), v...), nil
}
