package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckpt-io/ckpt/client"
	"github.com/ckpt-io/ckpt/lab/testservers"
)

// backendNames are the storage backends every core scenario runs against,
// as subtests of these names.
var backendNames = []string{"file", "s3", "gs"}

// testBucket and testPrefix are where the server-backed backends keep a
// test's objects.
const (
	testBucket = "ckpt-e2e"
	testPrefix = "e2e/run"
)

// backend is one storage backend with a fresh, empty place to store into,
// and ways to look at what is stored that do not go through ckpt.
type backend struct {
	name string
	// url is the storage URL ckpt processes get.
	url string
	// env is added to the environment of ckpt processes.
	env []string
	// root is the directory the bytes end up in: the storage dir for
	// file://, the server's data directory for S3 and GCS.
	root string
	// s3 is the S3 server (s3 only).
	s3 *testservers.S3Server
	// gcs is the GCS emulator (gs only).
	gcs *testservers.GCSServer
}

// newBackend starts the named backend's server (if any) with a fresh data
// directory and a bucket; the server stops when the test ends.
func newBackend(t *testing.T, name string) *backend {
	t.Helper()
	switch name {
	case "file":
		dir := t.TempDir()
		return &backend{name: name, url: "file://" + dir, root: dir}
	case "s3":
		srv := testservers.S3(t)
		srv.CreateBucket(t, testBucket)
		return &backend{name: name, url: srv.URL(testBucket, testPrefix), env: srv.Env(), root: srv.DataDir, s3: srv}
	case "gs":
		srv := testservers.GCS(t)
		srv.CreateBucket(t, testBucket)
		return &backend{name: name, url: srv.URL(testBucket, testPrefix), env: srv.Env(), root: srv.DataDir, gcs: srv}
	}
	t.Fatalf("unknown backend %q", name)
	return nil
}

// forEachBackend runs fn as one subtest per backend, each with its own
// fresh backend.
func forEachBackend(t *testing.T, fn func(t *testing.T, b *backend)) {
	for _, name := range backendNames {
		t.Run(name, func(t *testing.T) { fn(t, newBackend(t, name)) })
	}
}

// ckpt runs a ckpt command with the backend's environment.
func (b *backend) ckpt(t *testing.T, args ...string) cliResult {
	t.Helper()
	return runCkptEnv(t, b.env, args...)
}

// ckptJSON runs a ckpt command that must succeed with the backend's
// environment and decodes its --json output into v.
func (b *backend) ckptJSON(t *testing.T, v any, args ...string) cliResult {
	t.Helper()
	return ckptJSONEnv(t, b.env, v, args...)
}

// agentConfig returns an agent command line on this backend.
func (b *backend) agentConfig(socket, job, localDir string, roots []string, extra ...string) agentConfig {
	return agentConfig{Socket: socket, Storage: b.url, Env: b.env, Job: job, LocalDir: localDir, AllowRoots: roots, Extra: extra}
}

// objects lists every object under the backend's prefix, by key relative to
// it, with its size: a directory walk for file:// (temporary files
// included), ListObjectsV2 straight to the S3 server, the JSON API of the
// GCS emulator.
func (b *backend) objects(t *testing.T) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	switch b.name {
	case "file":
		for rel, st := range listTree(t, b.root) {
			if st.Mode.IsRegular() {
				out[rel] = st.Size
			}
		}
	case "s3":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		p := s3.NewListObjectsV2Paginator(b.s3.Client(), &s3.ListObjectsV2Input{Bucket: aws.String(testBucket), Prefix: aws.String(testPrefix + "/")})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				t.Fatalf("list the S3 bucket: %v", err)
			}
			for _, o := range page.Contents {
				out[strings.TrimPrefix(aws.ToString(o.Key), testPrefix+"/")] = aws.ToInt64(o.Size)
			}
		}
	case "gs":
		token := ""
		for {
			q := url.Values{"prefix": {testPrefix + "/"}}
			if token != "" {
				q.Set("pageToken", token)
			}
			var page struct {
				Items []struct {
					Name string `json:"name"`
					Size string `json:"size"`
				} `json:"items"`
				NextPageToken string `json:"nextPageToken"`
			}
			gcsJSON(t, b.gcs.Endpoint+"/storage/v1/b/"+testBucket+"/o?"+q.Encode(), &page)
			for _, o := range page.Items {
				size, err := strconv.ParseInt(o.Size, 10, 64)
				if err != nil {
					t.Fatalf("GCS object %s: size %q", o.Name, o.Size)
				}
				out[strings.TrimPrefix(o.Name, testPrefix+"/")] = size
			}
			if token = page.NextPageToken; token == "" {
				break
			}
		}
	}
	return out
}

func gcsJSON(t *testing.T, rawURL string, v any) {
	t.Helper()
	resp, err := http.Get(rawURL)
	if err != nil {
		t.Fatalf("GCS emulator: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GCS emulator: GET %s: %s: %s", rawURL, resp.Status, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GCS emulator: GET %s: %v", rawURL, err)
	}
}

// get reads one object (key relative to the prefix) straight from storage;
// ok is false when it does not exist.
func (b *backend) get(t *testing.T, key string) (data []byte, ok bool) {
	t.Helper()
	switch b.name {
	case "file":
		data, err := os.ReadFile(filepath.Join(b.root, filepath.FromSlash(key)))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, false
		} else if err != nil {
			t.Fatal(err)
		}
		return data, true
	case "s3":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := b.s3.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(testBucket), Key: aws.String(testPrefix + "/" + key)})
		if err != nil {
			var re interface{ HTTPStatusCode() int }
			if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound {
				return nil, false
			}
			t.Fatalf("get %s from S3: %v", key, err)
		}
		defer out.Body.Close()
		data, err := io.ReadAll(out.Body)
		if err != nil {
			t.Fatalf("get %s from S3: %v", key, err)
		}
		return data, true
	case "gs":
		resp, err := http.Get(b.gcs.Endpoint + "/storage/v1/b/" + testBucket + "/o/" + url.PathEscape(testPrefix+"/"+key) + "?alt=media")
		if err != nil {
			t.Fatalf("get %s from GCS: %v", key, err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("get %s from GCS: %v", key, err)
		}
		switch resp.StatusCode {
		case http.StatusOK:
			return data, true
		case http.StatusNotFound:
			return nil, false
		}
		t.Fatalf("get %s from GCS: %s: %s", key, resp.Status, data)
	}
	return nil, false
}

// manifest reads and checks the manifest of checkpoint n straight from
// storage.
func (b *backend) manifest(t *testing.T, job, task string, n uint64) storedManifest {
	t.Helper()
	var keys []string
	for k := range b.objects(t) {
		keys = append(keys, k)
	}
	key := newestManifestKey(keys, job, task, n)
	data, ok := b.get(t, key)
	if !ok {
		t.Fatalf("%s: manifest %s is not in storage", b.name, key)
	}
	return parseManifest(t, key, data)
}

// hasManifest reports whether storage holds a manifest of checkpoint n.
func (b *backend) hasManifest(t *testing.T, job, task string, n uint64) bool {
	t.Helper()
	var keys []string
	for k := range b.objects(t) {
		keys = append(keys, k)
	}
	return newestManifestKey(keys, job, task, n) != ""
}

// multipartUploads counts the S3 multipart uploads in progress under the
// prefix (0 on other backends).
func (b *backend) multipartUploads(t *testing.T) int {
	t.Helper()
	if b.s3 == nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := b.s3.Client().ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String(testBucket), Prefix: aws.String(testPrefix + "/")})
	if err != nil {
		t.Fatalf("list multipart uploads: %v", err)
	}
	return len(out.Uploads)
}

// diskUsage is what a backend's server keeps on disk under its root:
// regular file bytes of objects (one file per object under
// <bucket>/<prefix>/ for both servers), the server's bookkeeping files
// (versitygw's .sgwtmp tree of multipart parts and its empty .vgwlocks,
// fake-gcs-server's <bucket>.bucketMetadata and its .metadata files when it
// cannot use xattrs, ckpt's own temporary files on file://: every file
// outside <bucket>/<prefix>/ or named like those), and the extended
// attributes both servers keep object metadata in. Bookkeeping and xattrs are reported, never silently dropped.
type diskUsage struct {
	Objects    int64    // bytes of object files
	Extra      int64    // bytes of bookkeeping files
	ExtraFiles int      // number of bookkeeping files
	ExtraList  []string // the non-empty bookkeeping files
	Xattrs     int64    // bytes of extended attribute values, on every entry
}

func (b *backend) disk(t *testing.T) diskUsage {
	t.Helper()
	var u diskUsage
	objectDir := "" // where the server keeps the prefix's objects, relative to root
	if b.name != "file" {
		objectDir = testBucket + "/" + testPrefix + "/"
	}
	for rel, st := range listTree(t, b.root) {
		u.Xattrs += xattrBytes(filepath.Join(b.root, filepath.FromSlash(rel)))
		if !st.Mode.IsRegular() {
			continue
		}
		if !strings.HasPrefix(rel, objectDir) || b.bookkeeping(rel) {
			u.Extra += st.Size
			u.ExtraFiles++
			if st.Size > 0 {
				u.ExtraList = append(u.ExtraList, fmt.Sprintf("%s (%d B)", rel, st.Size))
			}
		} else if !isOwnerRecord(rel) {
			u.Objects += st.Size
		}
	}
	sort.Strings(u.ExtraList)
	return u
}

// xattrBytes sums the sizes of a file's extended attribute values (0 when
// it has none or the filesystem keeps none).
func xattrBytes(p string) int64 {
	buf := make([]byte, 64<<10)
	n, err := syscall.Listxattr(p, buf)
	if err != nil || n <= 0 {
		return 0
	}
	var total int64
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		if m, err := syscall.Getxattr(p, name, nil); err == nil {
			total += int64(m)
		}
	}
	return total
}

func (b *backend) bookkeeping(rel string) bool {
	switch b.name {
	case "file":
		return strings.Contains(rel, ".ckpt-tmp-")
	case "s3":
		for _, seg := range strings.Split(rel, "/") {
			if strings.HasPrefix(seg, ".sgw") || strings.HasPrefix(seg, ".vgw") {
				return true
			}
		}
	case "gs":
		return strings.HasSuffix(rel, ".metadata")
	}
	return false
}

// requireOnlyLive requires storage to hold exactly the manifests given and
// the objects they name, with the sizes they name: no orphan, nothing
// missing.
func (b *backend) requireOnlyLive(t *testing.T, ms ...storedManifest) {
	t.Helper()
	want := map[string]int64{}
	for _, m := range ms {
		want[m.Key] = m.Size
		for _, f := range m.Files {
			if f.Key != "" {
				want[f.Key] = f.Size
			}
		}
	}
	got := b.objects(t)
	var d []string
	for k, size := range got {
		if isOwnerRecord(k) {
			continue
		}
		w, ok := want[k]
		switch {
		case !ok:
			d = append(d, fmt.Sprintf("orphan %s (%d B)", k, size))
		case w != size:
			d = append(d, fmt.Sprintf("%s holds %d B, its manifest says %d", k, size, w))
		}
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			d = append(d, "missing "+k)
		}
	}
	if len(d) > 0 {
		sort.Strings(d)
		t.Errorf("%s storage does not hold exactly the retained checkpoints:\n%s", b.name, strings.Join(d, "\n"))
	}
}

// requireObjectsOf requires every object a manifest names to be in storage
// with the size it names.
func (b *backend) requireObjectsOf(t *testing.T, m storedManifest) {
	t.Helper()
	got := b.objects(t)
	for _, f := range m.Files {
		if f.Key == "" {
			continue
		}
		if size, ok := got[f.Key]; !ok {
			t.Errorf("checkpoint %d of %s names %s (%s), which is not in storage", m.Checkpoint, m.Task, f.Key, f.Name)
		} else if size != f.Size {
			t.Errorf("checkpoint %d of %s names %s (%s) of %d B; storage holds %d B", m.Checkpoint, m.Task, f.Key, f.Name, f.Size, size)
		}
	}
}

// list runs `ckpt list --json` on the backend.
func (b *backend) list(t *testing.T, job string) []listEntry {
	t.Helper()
	var list []listEntry
	b.ckptJSON(t, &list, "list", "--storage", b.url, "--job", job, "--json")
	return list
}

// verify runs `ckpt verify` on the backend and requires it to pass.
func (b *backend) verify(t *testing.T, job string, args ...string) {
	t.Helper()
	args = append([]string{"verify", "--storage", b.url, "--job", job}, args...)
	if res := b.ckpt(t, args...); res.Code != 0 {
		t.Fatalf("%s: ckpt %s: exit %d\n%s%s", b.name, strings.Join(args, " "), res.Code, res.Stdout, res.Stderr)
	}
}

// restoreFromStorage restores a task from storage alone (no local dir)
// into a new directory and returns it.
func (b *backend) restoreFromStorage(t *testing.T, job, task string, args ...string) (string, restoreResult, cliResult) {
	t.Helper()
	target := filepath.Join(t.TempDir(), "restored")
	var rr restoreResult
	args = append([]string{"restore", "--storage", b.url, "--job", job, "--task", task, "--target", target, "--json"}, args...)
	res := b.ckptJSON(t, &rr, args...)
	if !rr.Restored || rr.BytesLocal != 0 || rr.BytesRemote != rr.Bytes {
		t.Fatalf("%s: restore from storage alone: %+v", b.name, rr)
	}
	return target, rr, res
}

// writeSnapshot2 writes the issue's second checkpoint: snap1's ten SSTs
// (hard links), one new 4 MiB SST and new private files; it returns the
// bytes an incremental checkpoint must ship (the new SST and the private
// files).
func writeSnapshot2(t *testing.T, snap1, snap2 string) (newBytes int64) {
	t.Helper()
	if err := os.MkdirAll(snap2, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 10; i++ {
		name := fmt.Sprintf("%06d.sst", i)
		if err := os.Link(filepath.Join(snap1, name), filepath.Join(snap2, name)); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string][]byte{
		"000011.sst":      randomBytes(4<<20, 11),
		"CURRENT":         []byte("MANIFEST-000001\n"),
		"MANIFEST-000001": randomBytes(100<<10+517, 101), // the LSM manifest grew
		"OPTIONS-000003":  []byte(strings.Repeat("[Options]\n  bytes_per_sync=524288\n", 40)),
	}
	for name, data := range files {
		writeFile(t, filepath.Join(snap2, name), data)
		newBytes += int64(len(data))
	}
	return newBytes
}

func TestTheIssuesDoneWhenScenarioHoldsOnEveryBackend(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		root, localDir := t.TempDir(), t.TempDir()
		socket := filepath.Join(shortDir(t), "ckpt.sock")
		const job, task = "orders", "orders-3"
		startAgent(t, "A", b.agentConfig(socket, job, localDir, []string{root}))

		// Checkpoint 1: ten 1 MiB SSTs and the small private files.
		snap1 := filepath.Join(root, "snap-1")
		writeSnapshot1(t, snap1)
		ev1 := trigger(t, socket, task, 1, snap1)
		disk1 := b.disk(t)
		if full := treeSize(t, snap1); ev1.FullSize != full || !within(ev1.CheckpointSize, full, 0.02) {
			t.Errorf("checkpoint 1: checkpoint_size %d, full_size %d; the snapshot holds %d B", ev1.CheckpointSize, ev1.FullSize, full)
		}

		// Checkpoint 2: the same ten SSTs, a new 4 MiB SST, new private files.
		snap2 := filepath.Join(root, "snap-2")
		newBytes := writeSnapshot2(t, snap1, snap2)
		ev2 := trigger(t, socket, task, 2, snap2)
		disk2 := b.disk(t)
		growth := disk2.Objects - disk1.Objects
		ratio := float64(growth) / float64(newBytes)
		xattrs := disk2.Xattrs - disk1.Xattrs
		t.Logf("%s checkpoint 2: new bytes %d, the server's data dir grew %d B of object files (%.4fx the new bytes; %.4fx with the %d B of xattr metadata it added); bookkeeping files: %d (%d B) -> %d (%d B) %v; reported checkpoint_size %d (%.4fx), full_size %d, uploaded %d, reused %d",
			b.name, newBytes, growth, ratio, float64(growth+xattrs)/float64(newBytes), xattrs, disk1.ExtraFiles, disk1.Extra, disk2.ExtraFiles, disk2.Extra, disk2.ExtraList,
			ev2.CheckpointSize, float64(ev2.CheckpointSize)/float64(newBytes), ev2.FullSize, ev2.FilesUploaded, ev2.FilesReused)
		// At least 0.99x: a format 2 manifest holds the small private files
		// compressed, so storage may grow a little less than the new bytes.
		if ratio < 0.99 || ratio > 1.02 {
			t.Errorf("%s: the server's data dir grew %d B for %d new bytes (%.4fx), want between 0.99x and 1.02x", b.name, growth, newBytes, ratio)
		}
		if r := float64(growth+xattrs) / float64(newBytes); r > 1.02 {
			t.Errorf("%s: object files and their xattr metadata grew %d B for %d new bytes (%.4fx), want at most 1.02x", b.name, growth+xattrs, newBytes, r)
		}
		if extra := disk2.Extra - disk1.Extra; extra != 0 {
			t.Errorf("%s: the server's bookkeeping files grew %d B during checkpoint 2: %v", b.name, extra, disk2.ExtraList)
		}
		if !within(ev2.CheckpointSize, growth, 0.02) {
			t.Errorf("reported checkpoint_size %d, storage grew by %d", ev2.CheckpointSize, growth)
		}
		if full := treeSize(t, snap2); ev2.FullSize != full {
			t.Errorf("reported full_size %d, the snapshot holds %d B", ev2.FullSize, full)
		}
		if ev2.FilesReused != 10 || ev2.FilesUploaded != 4 {
			t.Errorf("files uploaded %d, reused %d; want 4 and 10", ev2.FilesUploaded, ev2.FilesReused)
		}
		m2 := b.manifest(t, job, task, 2)
		if m2.CheckpointSize != ev2.CheckpointSize || m2.FullSize != ev2.FullSize || m2.Task != task || m2.Checkpoint != 2 {
			t.Errorf("manifest %s/%d sizes %d/%d differ from the completed event's %d/%d", m2.Task, m2.Checkpoint, m2.CheckpointSize, m2.FullSize, ev2.CheckpointSize, ev2.FullSize)
		}
		b.requireObjectsOf(t, m2)

		// A restore from storage alone is byte-identical to the snapshot.
		target, rr, res := b.restoreFromStorage(t, job, task)
		if rr.Checkpoint != 2 || rr.Bytes != ev2.FullSize {
			t.Errorf("restore from storage: %+v", rr)
		}
		t.Logf("%s restore from storage: %d files, %d B in %d ms (process %v)", b.name, rr.Files, rr.Bytes, rr.DurationMS, res.Elapsed)
		requireSameFiles(t, snap2, target)

		list := b.list(t, job)
		if len(list) != 2 || list[0].Checkpoint != 1 || list[1].Checkpoint != 2 || list[1].Task != task ||
			list[1].CheckpointSize != ev2.CheckpointSize || list[1].FullSize != ev2.FullSize {
			t.Errorf("list: %+v, want checkpoints 1 and 2 with the completed events' sizes", list)
		}
		b.verify(t, job)
	})
}

func TestAnAgentKilledMidUploadLeavesNothingOnceCollectedOnEveryBackend(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		root, localDir := t.TempDir(), t.TempDir()
		socket := filepath.Join(shortDir(t), "ckpt.sock")
		const job, task = "crash", "crash-0"
		// Two transfers at once, slowed down so that the kill lands while
		// the big SST is in flight (a multipart upload on S3, a resumable
		// one on GCS) and some small ones are done.
		cfg := b.agentConfig(socket, job, localDir, []string{root}, "--upload-concurrency", "2", "--upload-rate", "48000000")
		a := startAgent(t, "first", cfg)

		snap1 := filepath.Join(root, "snap-1")
		writeSnapshot1(t, snap1)
		trigger(t, socket, task, 1, snap1)
		m1 := b.manifest(t, job, task, 1)
		before := b.objects(t)
		disk1 := b.disk(t)

		big, files, bytes := bigSST(t)
		snap2 := filepath.Join(root, "snap-2")
		linkFiles(t, big, snap2)
		writeFile(t, filepath.Join(snap2, "000500.sst"), randomBytes(40<<20, 500)) // sorts first
		writeFile(t, filepath.Join(snap2, "CURRENT"), []byte("MANIFEST-000001\n"))
		writeFile(t, filepath.Join(snap2, "MANIFEST-000001"), randomBytes(120<<10, 102))
		files++
		bytes += 40 << 20

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c, err := client.Dial(ctx, socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Checkpoint(ctx, task, 2, snap2, ""); err != nil {
			t.Fatalf("checkpoint 2: %v", err)
		}
		newObjects := func() int {
			n := 0
			for k := range b.objects(t) {
				if _, ok := before[k]; !ok && !b.bookkeeping(k) {
					n++
				}
			}
			return n
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			if b.hasManifest(t, job, task, 2) {
				t.Fatalf("checkpoint 2 (%d files, %d B) completed before the test could kill the agent mid-upload", files, bytes)
			}
			if newObjects() >= 1 && (b.s3 == nil || b.multipartUploads(t) > 0) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("checkpoint 2 did not get under way in 60s (%d new objects, %d multipart uploads)", newObjects(), b.multipartUploads(t))
			}
			time.Sleep(5 * time.Millisecond)
		}
		a.kill()
		uploaded, multipart := newObjects(), b.multipartUploads(t)
		if b.hasManifest(t, job, task, 2) {
			t.Fatal("the manifest of checkpoint 2 was written before the kill took effect")
		}
		if uploaded >= files {
			t.Fatalf("all %d objects of checkpoint 2 were uploaded before the kill", files)
		}
		crashed := b.disk(t)
		t.Logf("%s: killed the agent with %d of %d new objects of checkpoint 2 in storage, %d multipart uploads in progress, %d bookkeeping bytes on the server's disk %v",
			b.name, uploaded, files, multipart, crashed.Extra, crashed.ExtraList)

		startAgent(t, "restarted", cfg)

		list := b.list(t, job)
		if len(list) != 1 || list[0].Checkpoint != 1 || list[0].Task != task {
			t.Fatalf("list shows %+v, want only checkpoint 1", list)
		}
		target, rr, _ := b.restoreFromStorage(t, job, task)
		if rr.Checkpoint != 1 {
			t.Fatalf("restore gave checkpoint %d, want 1", rr.Checkpoint)
		}
		requireSameFiles(t, snap1, target)
		b.verify(t, job)

		var gc gcReport
		// The first collection marks the orphans, the second deletes them.
		var mark gcReport
		gcEnv := append(b.env[:len(b.env):len(b.env)], unsafeGCGrace, unsafeGCMarkDelay)
		ckptJSONEnv(t, gcEnv, &mark, "gc", "--storage", b.url, "--job", job, "--grace", "0s", "--json")
		if mark.DeletedObjects != 0 {
			t.Errorf("the first gc deleted %d objects: it may only mark them", mark.DeletedObjects)
		}
		t.Logf("%s gc, marking: %+v", b.name, mark)
		ckptJSONEnv(t, gcEnv, &gc, "gc", "--storage", b.url, "--job", job, "--grace", "0s", "--json")
		t.Logf("%s gc: %+v", b.name, gc)
		// Ages and ripeness are the server's stored times against its own
		// clock probe: an emulator whose stored times are coarser than its
		// probe's can make a just-written orphan young for a moment. A few
		// more collections, a second apart, must finish the job.
		for round := 0; round < 3 && gc.DeletedObjects < uploaded; round++ {
			time.Sleep(time.Second)
			var more gcReport
			ckptJSONEnv(t, gcEnv, &more, "gc", "--storage", b.url, "--job", job, "--grace", "0s", "--json")
			t.Logf("%s gc, again: %+v", b.name, more)
			gc.DeletedObjects += more.DeletedObjects
			gc.RetainedCheckpoints = more.RetainedCheckpoints
		}
		if gc.DeletedObjects < uploaded {
			t.Errorf("gc deleted %d objects, want at least the %d orphans of checkpoint 2", gc.DeletedObjects, uploaded)
		}
		if gc.RetainedCheckpoints != 1 {
			t.Errorf("gc retained %d checkpoints, want 1", gc.RetainedCheckpoints)
		}
		b.requireOnlyLive(t, m1)
		if n := b.multipartUploads(t); n != 0 {
			t.Errorf("%d multipart uploads left after gc", n)
		}
		var live int64 = m1.Size
		for _, f := range m1.Files {
			if f.Key != "" {
				live += f.Size
			}
		}
		after := b.disk(t)
		t.Logf("%s after gc: %d B of object files (checkpoint 1 needs %d B), %d bookkeeping files (%d B) %v", b.name, after.Objects, live, after.ExtraFiles, after.Extra, after.ExtraList)
		if after.Objects != live {
			t.Errorf("%s: the server's disk holds %d B of object files after gc, the retained checkpoint accounts for %d B", b.name, after.Objects, live)
		}
		if after.Extra != disk1.Extra {
			t.Errorf("%s: the server's disk holds %d B of bookkeeping files after gc, %d B before checkpoint 2: %v", b.name, after.Extra, disk1.Extra, after.ExtraList)
		}
		b.verify(t, job)
	})
}

func TestRestoreOnAFreshNodeThenOneCheckpointUploadsOnlyNewFilesOnEveryBackend(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		const job, task = "nodes", "kv-2"

		// Node A: one checkpoint, then the node is gone.
		rootA, localA := t.TempDir(), t.TempDir()
		socketA := filepath.Join(shortDir(t), "a.sock")
		a := startAgent(t, "A", b.agentConfig(socketA, job, localA, []string{rootA}))
		snap7 := filepath.Join(rootA, "snap-7")
		writeSnapshot1(t, snap7)
		trigger(t, socketA, task, 7, snap7)
		a.stop()

		// Node B: fresh local and store dirs, restored from storage.
		rootB, localB := t.TempDir(), t.TempDir()
		storeB := filepath.Join(rootB, "store")
		var rr restoreResult
		b.ckptJSON(t, &rr, "restore", "--storage", b.url, "--job", job, "--task", task,
			"--target", storeB, "--local-dir", localB, "--if-not-exists", "--json")
		if !rr.Restored || rr.Checkpoint != 7 || rr.BytesLocal != 0 || rr.BytesRemote != rr.Bytes {
			t.Fatalf("restore on a fresh node: %+v", rr)
		}
		requireSameFiles(t, snap7, storeB)
		var again restoreResult
		b.ckptJSON(t, &again, "restore", "--storage", b.url, "--job", job, "--task", task,
			"--target", storeB, "--local-dir", localB, "--if-not-exists", "--json")
		if again.Restored {
			t.Errorf("a second restore with --if-not-exists restored again: %+v", again)
		}

		socketB := filepath.Join(shortDir(t), "b.sock")
		startAgent(t, "B", b.agentConfig(socketB, job, localB, []string{rootB}))
		// The store on node B keeps the ten restored SSTs and adds one.
		snap8 := filepath.Join(rootB, "snap-8")
		newBytes := writeSnapshot2(t, storeB, snap8)
		before := b.disk(t)
		ev := trigger(t, socketB, task, 8, snap8)
		growth := b.disk(t).Objects - before.Objects
		t.Logf("%s: first checkpoint on node B: new bytes %d, storage grew %d B (%.4fx); checkpoint_size %d, uploaded %d, reused %d",
			b.name, newBytes, growth, float64(growth)/float64(newBytes), ev.CheckpointSize, ev.FilesUploaded, ev.FilesReused)
		if float64(growth) < 0.99*float64(newBytes) || float64(growth) > 1.02*float64(newBytes) { // 0.99: see above
			t.Errorf("storage grew %d B, the new SST and private files are %d B", growth, newBytes)
		}
		if ev.FilesReused != 10 || ev.FilesUploaded != 4 {
			t.Errorf("files uploaded %d, reused %d; want 4 and the 10 restored SSTs", ev.FilesUploaded, ev.FilesReused)
		}
		m8 := b.manifest(t, job, task, 8)
		for _, f := range m8.Files {
			if f.Kind == "shared" && f.Uploaded != (f.Name == "000011.sst") {
				t.Errorf("checkpoint 8: %s uploaded=%v", f.Name, f.Uploaded)
			}
		}
		target, rr8, _ := b.restoreFromStorage(t, job, task)
		if rr8.Checkpoint != 8 {
			t.Errorf("restore gave checkpoint %d, want 8", rr8.Checkpoint)
		}
		requireSameFiles(t, snap8, target)
	})
}
