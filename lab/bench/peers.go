package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/internal/human"
	"github.com/ckpt-io/ckpt/restore"
)

const tputTask = "tput-0"

// xfer is the state the transfer and end-to-end sections share: the
// source dir (a Pebble checkpoint at a fixed path, so that restic finds
// its parent snapshot), ckpt's agent for it, and the peers' destinations.
type xfer struct {
	src    string
	agent  *inproc
	rclone string // remote, "" if unavailable
	restic string // repository, "" if unavailable
	env    []string
	why    map[string]string // tool -> why it is missing
}

// peerEnv is the environment for a peer: ours without AWS_CA_BUNDLE (the
// peers run against plain HTTP and some refuse a bundle they cannot use),
// plus extra.
func peerEnv(extra ...string) []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "AWS_CA_BUNDLE=") {
			env = append(env, e)
		}
	}
	return append(env, extra...)
}

// tool runs a peer command and returns how long it took.
func tool(ctx context.Context, env []string, name string, args ...string) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	err := cmd.Run()
	d := time.Since(t0)
	if err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 600 {
			msg = msg[len(msg)-600:]
		}
		return d, fmt.Errorf("%s %s: %v: %s", name, args[0], err, msg)
	}
	return d, nil
}

func toolVersion(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

func missing(name string) (string, bool) {
	if _, err := exec.LookPath(name); err != nil {
		return name + " is not installed (apt-get install -y --no-install-recommends restic rclone rocksdb-tools)", true
	}
	return "", false
}

// peers uploads and restores one Pebble checkpoint of the store with ckpt,
// rclone and restic on the same storage, and a RocksDB store of the same
// keys and values with ldb's BackupEngine (to a local directory).
func (r *run) peers(ctx context.Context) error {
	if err := r.ensureStore(ctx); err != nil {
		return err
	}
	x := &xfer{src: filepath.Join(r.root, "peer-src"), why: map[string]string{}}
	r.x = x
	// Settle the tree first (a manual compaction of every key, not timed):
	// otherwise compactions left over from earlier sections would rewrite
	// files between this copy and the end-to-end increment on top of it,
	// and that increment would be more than the 1.5% it stands for.
	if err := r.w.DB().Flush(); err != nil {
		return err
	}
	if err := r.w.DB().Compact(ctx, nil, []byte("\xff\xff\xff\xff"), true); err != nil {
		return fmt.Errorf("settle the store: %w", err)
	}
	files, err := r.snapshot(x.src)
	if err != nil {
		return err
	}
	tr := &Transfer{Files: len(files)}
	for _, f := range files {
		tr.Bytes += f.size
	}
	r.rep.Transfer = tr
	srcSum, err := dirDigest(x.src)
	if err != nil {
		return err
	}

	// ckpt and rclone, up and down, in alternating rounds on the same data:
	// the machine's noise (page cache, the server's disk, the other core)
	// weighs on both alike, and each reports its median round.
	if x.agent, err = r.startAgent(ctx, "tput"); err != nil {
		return err
	}
	ck := Tool{Tool: "ckpt", Version: "this build", Available: true, Where: "storage", Bytes: tr.Bytes, RestoreVerified: true}
	rc := Tool{Tool: "rclone", Where: "storage", Bytes: tr.Bytes, Note: "rclone copy, default transfers"}
	var rcEnv []string
	if why, miss := missing("rclone"); miss {
		rc.Reason = why
	} else {
		rc.Available, rc.Version = true, toolVersion("rclone", "version")
		cfg := filepath.Join(r.root, "rclone.conf")
		os.WriteFile(cfg, nil, 0o600)
		rcEnv = peerEnv("RCLONE_CONFIG=" + cfg)
		rc.RestoreVerified = true
	}
	rounds := 3
	if r.o.Quick {
		rounds = 1
	}
	var ckUp, ckDown, rcUp, rcDown []float64
	for i := range rounds {
		// ckpt: the first checkpoint of a new task uploads every file (the
		// first round's task is the one the end-to-end figure builds on).
		tsk := tputTask
		if i > 0 {
			tsk = fmt.Sprintf("tput-r%d", i)
		}
		s, err := send(ctx, x.agent, tsk, 1, x.src, false)
		if err != nil {
			return fmt.Errorf("ckpt upload: %w", err)
		}
		down := filepath.Join(r.root, "down-ckpt")
		t0 := time.Now()
		_, err = restore.Run(ctx, restore.Options{Store: x.agent.store, Job: x.agent.job, Task: tsk, Target: down, Checkpoint: 1})
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("ckpt restore: %w", err)
		}
		ckUp, ckDown = append(ckUp, ms(s.total)), append(ckDown, ms(d))
		ck.RestoreVerified = sameDigest(down, srcSum, &ck) && ck.RestoreVerified
		os.RemoveAll(down)

		if !rc.Available || rc.Reason != "" {
			continue
		}
		remote, err := r.tgt.rcloneRemote(fmt.Sprintf("bench-%s-peers/rclone-%d", r.id, i))
		if err != nil {
			rc.Reason = err.Error()
			continue
		}
		down = filepath.Join(r.root, "down-rclone")
		if d, err := tool(ctx, rcEnv, "rclone", "copy", x.src, remote); err != nil {
			rc.Reason = err.Error()
		} else if d2, err := tool(ctx, rcEnv, "rclone", "copy", remote, down); err != nil {
			rc.Reason = err.Error()
		} else {
			rcUp, rcDown = append(rcUp, ms(d)), append(rcDown, ms(d2))
			rc.RestoreVerified = sameDigest(down, srcSum, &rc) && rc.RestoreVerified
			if i == 0 {
				x.rclone = remote
			}
		}
		os.RemoveAll(down)
	}
	ck.UploadMS, ck.RestoreMS = percentile(ckUp, 50), percentile(ckDown, 50)
	rates(&ck)
	tr.Tools = append(tr.Tools, ck)
	r.logf("ckpt: up %s, down %s (median of %d rounds)", rate(ck.UploadBytesPerS), rate(ck.RestoreBytesPerS), len(ckUp))
	if rc.Reason == "" && len(rcUp) > 0 {
		rc.UploadMS, rc.RestoreMS = percentile(rcUp, 50), percentile(rcDown, 50)
		rc.Note += fmt.Sprintf("; median of %d rounds alternating with ckpt's", len(rcUp))
	} else if rc.Reason != "" {
		rc.RestoreVerified = false
	}
	rates(&rc)
	x.why["rclone"] = rc.Reason
	tr.Tools = append(tr.Tools, rc)
	r.logf("rclone: up %s, down %s %s", rate(rc.UploadBytesPerS), rate(rc.RestoreBytesPerS), rc.Reason)

	// restic backup and restore.
	rs := Tool{Tool: "restic", Where: "storage", Bytes: tr.Bytes, Note: "restic backup / restore latest"}
	if why, miss := missing("restic"); miss {
		rs.Reason = why
	} else if repo, renv, err := r.tgt.resticRepo("bench-" + r.id + "-peers/restic"); err != nil {
		rs.Reason = err.Error()
	} else {
		rs.Available, rs.Version = true, toolVersion("restic", "version")
		x.env = peerEnv(append(renv, "RESTIC_PASSWORD=bench", "RESTIC_CACHE_DIR="+filepath.Join(r.root, "restic-cache"))...)
		down := filepath.Join(r.root, "down-restic")
		if _, err := tool(ctx, x.env, "restic", "-r", repo, "init"); err != nil {
			rs.Reason = err.Error()
		} else if d, err := tool(ctx, x.env, "restic", "-r", repo, "backup", "-q", x.src); err != nil {
			rs.Reason = err.Error()
		} else if d2, err := tool(ctx, x.env, "restic", "-r", repo, "restore", "latest", "--target", down); err != nil {
			rs.UploadMS, rs.Reason = ms(d), err.Error()
		} else {
			rs.UploadMS, rs.RestoreMS = ms(d), ms(d2)
			rs.RestoreVerified = sameDigest(filepath.Join(down, x.src), srcSum, &rs)
			x.restic = repo
		}
		os.RemoveAll(down)
		rates(&rs)
	}
	x.why["restic"] = rs.Reason
	tr.Tools = append(tr.Tools, rs)
	r.logf("restic: up %s, down %s %s", rate(rs.UploadBytesPerS), rate(rs.RestoreBytesPerS), rs.Reason)

	tr.Tools = append(tr.Tools, r.ldb(ctx))

	if rc.Available && rc.UploadMS > 0 && rc.RestoreMS > 0 && ck.UploadBytesPerS > 0 {
		tr.UploadVsRclone = round(ck.UploadBytesPerS/rc.UploadBytesPerS, 4)
		tr.RestoreVsRclone = round(ck.RestoreBytesPerS/rc.RestoreBytesPerS, 4)
	}
	return nil
}

func rates(t *Tool) {
	if t.UploadMS > 0 {
		t.UploadBytesPerS = round(float64(t.Bytes)/(t.UploadMS/1000), 5)
	}
	if t.RestoreMS > 0 {
		t.RestoreBytesPerS = round(float64(t.Bytes)/(t.RestoreMS/1000), 5)
	}
}

// ldb makes a RocksDB store of the same keys and values (ldb load, not
// timed), then times ldb backup (BackupEngine) to a local directory and
// ldb restore from it.
func (r *run) ldb(ctx context.Context) Tool {
	t := Tool{Tool: "ldb (RocksDB BackupEngine)", Where: "local dir", Note: "same keys and values loaded into RocksDB; ldb cannot write to S3, so the backup goes to a local directory"}
	if why, miss := missing("ldb"); miss {
		t.Reason = why
		return t
	}
	t.Available = true
	t.Version = "rocksdb-tools"
	db := filepath.Join(r.root, "rocksdb")
	backup := filepath.Join(r.root, "rocksdb-backup")
	restored := filepath.Join(r.root, "rocksdb-restored")
	defer os.RemoveAll(db)
	defer os.RemoveAll(backup)
	defer os.RemoveAll(restored)
	if err := r.loadRocksDB(ctx, db); err != nil {
		t.Reason = err.Error()
		return t
	}
	size, err := dirBytes(db)
	if err != nil {
		t.Reason = err.Error()
		return t
	}
	t.Bytes = size
	env := peerEnv()
	d, err := tool(ctx, env, "ldb", "--db="+db, "backup", "--backup_dir="+backup)
	if err != nil {
		t.Reason = err.Error()
		return t
	}
	t.UploadMS = ms(d)
	if d, err = tool(ctx, env, "ldb", "--db="+restored, "restore", "--backup_dir="+backup); err != nil {
		t.Reason = err.Error()
		rates(&t)
		return t
	}
	t.RestoreMS = ms(d)
	a, _ := sstDigest(db)
	b, _ := sstDigest(restored)
	t.RestoreVerified = a != "" && a == b
	if !t.RestoreVerified {
		t.Reason = "restored SSTs differ from the store's"
	}
	rates(&t)
	r.logf("ldb: up %s, down %s (local dir)", rate(t.UploadBytesPerS), rate(t.RestoreBytesPerS))
	return t
}

// loadRocksDB pipes every key and value of the Pebble store into ldb load.
func (r *run) loadRocksDB(ctx context.Context, dir string) error {
	cmd := exec.CommandContext(ctx, "ldb", "--db="+dir, "--create_if_missing", "--key_hex", "--value_hex", "load")
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err
	}
	werr := func() error {
		defer in.Close()
		it, err := r.w.DB().NewIter(nil)
		if err != nil {
			return err
		}
		defer it.Close()
		bw := bufio.NewWriterSize(in, 1<<20)
		buf := make([]byte, 0, 4096)
		for it.First(); it.Valid(); it.Next() {
			buf = append(buf[:0], "0x"...)
			buf = hex.AppendEncode(buf, it.Key())
			buf = append(buf, " ==> 0x"...)
			buf = hex.AppendEncode(buf, it.Value())
			buf = append(buf, '\n')
			if _, err := bw.Write(buf); err != nil {
				return err
			}
		}
		if err := it.Error(); err != nil {
			return err
		}
		return bw.Flush()
	}()
	err = cmd.Wait()
	if werr != nil {
		return fmt.Errorf("feed ldb load: %w: %s", werr, out.String())
	}
	if err != nil {
		return fmt.Errorf("ldb load: %v: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// endToEnd adds 1.5% to the state and times the checkpoint that ships it,
// end to end, then the peers shipping the same increment on top of the
// peers section's copies.
func (r *run) endToEnd(ctx context.Context) error {
	if r.x == nil {
		if err := r.peers(ctx); err != nil {
			return err
		}
	}
	x := r.x
	if err := os.RemoveAll(x.src); err != nil {
		return err
	}
	added := int64(float64(r.o.StateBytes) * 0.015)
	if err := r.addState(added); err != nil {
		return err
	}
	e := &EndToEnd{StateBytes: r.o.StateBytes, AddedBytes: added, Scaled: r.o.StateBytes < 1<<30}
	// ckpt as the app runs it: flush, Pebble checkpoint, handoff, upload.
	dir := filepath.Join(r.root, "e2e-snap")
	t0 := time.Now()
	if err := r.w.DB().Flush(); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	e.FlushMS = ms(time.Since(t0))
	if _, err := r.checkpointTo(dir); err != nil {
		return err
	}
	e.SnapshotMS = ms(time.Since(t0))
	s, err := send(ctx, x.agent, tputTask, 2, dir, true)
	if err != nil {
		return err
	}
	e.CkptMS = ms(time.Since(t0))
	os.RemoveAll(dir)
	// The same state (nothing was written since) for the peers, at the
	// path they saw before.
	if _, err := r.snapshot(x.src); err != nil {
		return err
	}
	e.PauseMS, e.UploadMS = ms(s.pause), ms(s.total-s.pause)
	e.CheckpointSize, e.FilesUploaded = s.ev.CheckpointSize, s.ev.FilesUploaded
	r.logf("end to end: %.0f ms for %s added (%s shipped)", e.CkptMS, human.Bytes(added), human.Bytes(e.CheckpointSize))

	rc := PeerIncrement{Tool: "rclone copy", Reason: x.why["rclone"]}
	if x.rclone != "" {
		cfg := filepath.Join(r.root, "rclone.conf")
		d, err := tool(ctx, peerEnv("RCLONE_CONFIG="+cfg), "rclone", "copy", x.src, x.rclone)
		if err != nil {
			rc.Reason = err.Error()
		} else {
			rc.Available, rc.MS = true, ms(d)
		}
	}
	rs := PeerIncrement{Tool: "restic backup", Reason: x.why["restic"]}
	if x.restic != "" {
		d, err := tool(ctx, x.env, "restic", "-r", x.restic, "backup", "-q", x.src)
		if err != nil {
			rs.Reason = err.Error()
		} else {
			rs.Available, rs.MS = true, ms(d)
		}
	}
	e.Peers = []PeerIncrement{rc, rs}
	r.rep.EndToEnd = e
	return nil
}

// addState writes n bytes of new keys (1 KiB random values) to the store,
// outside the workload's key space.
func (r *run) addState(n int64) error {
	db := r.w.DB()
	rng := rand.NewChaCha8([32]byte{7})
	val := make([]byte, 1024)
	b := db.NewBatch()
	for i := int64(0); i*1024 < n; i++ {
		rng.Read(val)
		if err := b.Set(fmt.Appendf(nil, "~bench-added-%012d", i), val, nil); err != nil {
			return err
		}
		if b.Len() > 1<<20 {
			if err := b.Commit(pebble.NoSync); err != nil {
				return err
			}
			b = db.NewBatch()
		}
	}
	return b.Commit(pebble.NoSync)
}

// dirDigest hashes the names, sizes and contents of the regular files in
// dir, in name order.
func dirDigest(dir string) (string, error) {
	return digest(dir, func(string) bool { return true })
}

func sstDigest(dir string) (string, error) {
	return digest(dir, func(n string) bool { return strings.HasSuffix(n, ".sst") })
}

func digest(dir string, keep func(string) bool) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && keep(e.Name()) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00", n)
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// sameDigest reports whether dir holds the same files as the source,
// noting a mismatch on t.
func sameDigest(dir, want string, t *Tool) bool {
	got, err := dirDigest(dir)
	if err != nil || got != want {
		t.Reason = strings.TrimSpace(t.Reason + " restored files differ from the source")
		return false
	}
	return true
}

func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}
