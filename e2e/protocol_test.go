package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeSnapshot1 writes the issue's first checkpoint into dir: ten 1 MiB
// random SSTs and the small private files of an LSM store.
func writeSnapshot1(t *testing.T, dir string) {
	t.Helper()
	for i := 1; i <= 10; i++ {
		writeFile(t, filepath.Join(dir, fmt.Sprintf("%06d.sst", i)), randomBytes(1<<20, uint64(i)))
	}
	writeFile(t, filepath.Join(dir, "CURRENT"), []byte("MANIFEST-000001\n"))
	writeFile(t, filepath.Join(dir, "MANIFEST-000001"), randomBytes(100<<10, 100))
	writeFile(t, filepath.Join(dir, "OPTIONS-000003"), []byte(strings.Repeat("[Options]\n  bytes_per_sync=524288\n", 40)))
}

func TestTheIssuesDoneWhenScenarioHoldsOnFileStorage(t *testing.T) {
	root, storageDir, localDir := t.TempDir(), t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	const job, task = "orders", "orders-3"
	jobDir := filepath.Join(storageDir, job)
	startAgent(t, "A", agentConfig{Socket: socket, StorageDir: storageDir, Job: job, LocalDir: localDir, AllowRoots: []string{root}})

	snap1 := filepath.Join(root, "snap-1")
	writeSnapshot1(t, snap1)
	ev1 := trigger(t, socket, task, 1, snap1)
	size1 := treeSize(t, jobDir)
	if !within(ev1.CheckpointSize, size1, 0.02) {
		t.Errorf("checkpoint 1: reported checkpoint_size %d, storage holds %d", ev1.CheckpointSize, size1)
	}

	// Checkpoint 2: the same ten SSTs, one new 4 MiB SST, new private files.
	snap2 := filepath.Join(root, "snap-2")
	if err := os.MkdirAll(snap2, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 10; i++ {
		name := fmt.Sprintf("%06d.sst", i)
		if err := os.Link(filepath.Join(snap1, name), filepath.Join(snap2, name)); err != nil {
			t.Fatal(err)
		}
	}
	newSST := randomBytes(4<<20, 11)
	writeFile(t, filepath.Join(snap2, "000011.sst"), newSST)
	private := map[string][]byte{
		"CURRENT":         []byte("MANIFEST-000001\n"),
		"MANIFEST-000001": randomBytes(100<<10+517, 101), // the LSM manifest grew
		"OPTIONS-000003":  []byte(strings.Repeat("[Options]\n  bytes_per_sync=524288\n", 40)),
	}
	newBytes := int64(len(newSST))
	for name, data := range private {
		writeFile(t, filepath.Join(snap2, name), data)
		newBytes += int64(len(data))
	}
	ev2 := trigger(t, socket, task, 2, snap2)
	size2 := treeSize(t, jobDir)
	growth := size2 - size1
	ratio := float64(growth) / float64(newBytes)
	t.Logf("checkpoint 2: new bytes %d, storage growth %d (%.4fx), reported checkpoint_size %d, full_size %d, uploaded %d, reused %d",
		newBytes, growth, ratio, ev2.CheckpointSize, ev2.FullSize, ev2.FilesUploaded, ev2.FilesReused)
	// At least 0.99x: a format 2 manifest holds the small private files
	// compressed, so storage may grow a little less than the new bytes.
	if ratio < 0.99 || ratio > 1.02 {
		t.Errorf("storage grew by %d bytes for %d new bytes (%.4fx), want between 0.99x and 1.02x", growth, newBytes, ratio)
	}
	if !within(ev2.CheckpointSize, growth, 0.02) {
		t.Errorf("reported checkpoint_size %d, storage grew by %d", ev2.CheckpointSize, growth)
	}
	if full := treeSize(t, snap2); ev2.FullSize != full {
		t.Errorf("reported full_size %d, the snapshot holds %d bytes", ev2.FullSize, full)
	}
	if ev2.FilesReused != 10 || ev2.FilesUploaded != 4 {
		t.Errorf("files uploaded %d, reused %d; want 4 and 10", ev2.FilesUploaded, ev2.FilesReused)
	}
	m2 := readManifest(t, storageDir, job, task, 2)
	if m2.CheckpointSize != ev2.CheckpointSize || m2.FullSize != ev2.FullSize {
		t.Errorf("manifest sizes %d/%d differ from the completed event's %d/%d", m2.CheckpointSize, m2.FullSize, ev2.CheckpointSize, ev2.FullSize)
	}

	// A restore from storage alone is byte-identical to the snapshot.
	target := filepath.Join(t.TempDir(), "restored")
	var rr restoreResult
	res := ckptJSON(t, &rr, "restore", "--storage", "file://"+storageDir, "--job", job, "--task", task, "--target", target, "--json")
	if !rr.Restored || rr.Checkpoint != 2 || rr.BytesLocal != 0 || rr.BytesRemote != rr.Bytes || rr.Bytes != ev2.FullSize {
		t.Errorf("restore from storage: %+v", rr)
	}
	t.Logf("restore from storage: %d files, %d bytes in %d ms (process %v)", rr.Files, rr.Bytes, rr.DurationMS, res.Elapsed)
	requireSameFiles(t, snap2, target)

	// Bad input over one raw connection: each gets bad_request, the agent
	// keeps answering on the same connection, and nothing reaches storage.
	if err := os.Symlink("/etc", filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	withSymlink := filepath.Join(root, "snap-symlink")
	writeFile(t, filepath.Join(withSymlink, "000001.sst"), randomBytes(4096, 7))
	if err := os.Symlink("/etc/passwd", filepath.Join(withSymlink, "000002.sst")); err != nil {
		t.Fatal(err)
	}
	storageBefore := listTree(t, storageDir)
	localBefore := listTree(t, localDir)

	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReaderSize(conn, 64<<10)
	roundTrip := func(line string) map[string]any {
		t.Helper()
		conn.SetDeadline(time.Now().Add(15 * time.Second))
		if _, err := conn.Write([]byte(line + "\n")); err != nil {
			t.Fatalf("write: %v", err)
		}
		reply, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("no reply to %.80q: %v", line, err)
		}
		var ev map[string]any
		if err := json.Unmarshal(reply, &ev); err != nil {
			t.Fatalf("reply %q is not JSON: %v", reply, err)
		}
		return ev
	}
	checkpointReq := func(n int, dir string) string {
		b, _ := json.Marshal(map[string]any{"op": "checkpoint", "id": fmt.Sprint("bad-", n), "task": task, "checkpoint": n, "dir": dir})
		return string(b)
	}
	cases := []struct{ name, line string }{
		{"plain text", "this is not json"},
		{"a truncated object", `{"op":"checkpoint","task":`},
		{"a JSON array", `[1,2,3]`},
		{"two objects on a line", `{"op":"hello"} {"op":"hello"}`},
		{"an unknown op", `{"op":"explode"}`},
		{"no op", `{"task":"orders-3"}`},
		{"a task name with a slash", `{"op":"checkpoint","task":"../x","checkpoint":3,"dir":"/tmp"}`},
		{"checkpoint zero", `{"op":"checkpoint","task":"orders-3","checkpoint":0,"dir":"/tmp"}`},
		{"a relative dir", `{"op":"checkpoint","task":"orders-3","checkpoint":3,"dir":"snap-2"}`},
		{"binary garbage", "\x00\x01\x02\xff\xfe"},
		{"a line over 1 MiB", `{"op":"hello","pad":"` + strings.Repeat("a", 1<<20) + `"}`},
		{"a dir outside the allowed root", checkpointReq(3, "/etc")},
		{"a dir escaping the root through a symlink", checkpointReq(4, filepath.Join(root, "escape"))},
		{"a dir escaping the root through dot-dot", checkpointReq(5, root+"/../"+filepath.Base(storageDir))},
		{"a snapshot dir holding a symlink", checkpointReq(6, withSymlink)},
	}
	for _, c := range cases {
		t.Run("refuses "+c.name, func(t *testing.T) {
			ev := roundTrip(c.line)
			e, _ := ev["error"].(map[string]any)
			if e == nil || e["code"] != "bad_request" {
				t.Errorf("reply %v, want error code bad_request", ev)
			} else {
				t.Logf("%s: %v", ev["event"], e["message"])
			}
			if h := roundTrip(`{"op":"hello","id":"after"}`); h["event"] != "hello" || h["id"] != "after" {
				t.Errorf("hello after the bad request got %v", h)
			}
		})
	}
	time.Sleep(200 * time.Millisecond) // let any wrongly started upload show
	if d := diffTrees(storageBefore, listTree(t, storageDir)); d != "" {
		t.Errorf("refused requests changed storage:\n%s", d)
	}
	if d := diffTrees(localBefore, listTree(t, localDir)); d != "" {
		t.Errorf("refused requests changed the local dir:\n%s", d)
	}
}
