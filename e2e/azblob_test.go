package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/ckpt-io/ckpt/lab/testservers"
)

// TestCheckpointOnAzureBlobThroughThePlugin runs the agent, two
// checkpoints, list, restore and verify on az:// against Azurite. The ckpt
// binary has no Azure backend: every storage call goes through
// ckpt-plugin-azblob, found with --plugin-dir.
func TestCheckpointOnAzureBlobThroughThePlugin(t *testing.T) {
	srv := testservers.Azurite(t)
	const containerName = "ckpt-e2e"
	srv.CreateContainer(t, containerName)
	dir := buildPlugins(t)
	b := &backend{name: "az", url: srv.URL(containerName, testPrefix), env: srv.Env()}
	pd := []string{"--plugin-dir", dir}

	var found []pluginEntry
	ckptJSON(t, &found, "plugins", "--plugin-dir", dir, "--json")
	var az *pluginEntry
	for i := range found {
		if found[i].Name == "azblob" {
			az = &found[i]
		}
	}
	if az == nil || az.Kind != "storage" || strings.Join(az.Schemes, ",") != "az" {
		t.Fatalf("plugins --json: azblob is %+v in %+v", az, found)
	}
	if res := b.ckpt(t, "list", "--storage", b.url, "--job", "x"); res.Code == 0 || !strings.Contains(string(res.Stderr), "az") {
		t.Errorf("list on az:// without the plugin: exit %d\n%s", res.Code, res.Stderr)
	}

	root, localDir := t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	const job, task = "orders", "orders-3"
	startAgent(t, "A", b.agentConfig(socket, job, localDir, []string{root}, pd...))
	snap1 := filepath.Join(root, "snap-1")
	writeSnapshot1(t, snap1)
	ev := trigger(t, socket, task, 1, snap1)
	if ev.FullSize != treeSize(t, snap1) {
		t.Errorf("full_size %d, the snapshot holds %d B", ev.FullSize, treeSize(t, snap1))
	}
	snap2 := filepath.Join(root, "snap-2")
	newBytes := writeSnapshot2(t, snap1, snap2)
	ev2 := trigger(t, socket, task, 2, snap2)
	// checkpoint_size counts the manifest and bookkeeping too; a format 2
	// manifest holds the small private files compressed, so it may fall a
	// little below the new bytes (0.99x is the floor, as elsewhere).
	if float64(ev2.CheckpointSize) < 0.99*float64(newBytes) || ev2.CheckpointSize > newBytes+64<<10 || ev2.FilesReused != 10 {
		t.Errorf("checkpoint 2: %+v, want about %d new bytes and 10 reused files", ev2, newBytes)
	}

	// What is stored, seen straight on the emulator: a manifest per
	// checkpoint among the objects, nothing outside the prefix.
	blobs := listBlobs(t, srv.ConnectionString, containerName)
	manifests := 0
	for name, size := range blobs {
		if !strings.HasPrefix(name, testPrefix+"/") {
			t.Errorf("object %q outside the prefix %q", name, testPrefix)
		}
		if strings.Contains(name, "manifest") && size > 0 {
			manifests++
		}
	}
	if manifests < 2 {
		t.Errorf("%d manifests among the %d stored objects, want 2", manifests, len(blobs))
	}

	var list []listEntry
	b.ckptJSON(t, &list, append([]string{"list", "--storage", b.url, "--job", job, "--json"}, pd...)...)
	if len(list) != 2 || list[0].Checkpoint != 1 || list[1].Checkpoint != 2 {
		t.Errorf("list: %+v", list)
	}
	target, rr, _ := b.restoreFromStorage(t, job, task, pd...)
	if rr.Checkpoint != 2 {
		t.Errorf("restore: %+v", rr)
	}
	requireSameFiles(t, snap2, target)
	b.verify(t, job, pd...)
}

// listBlobs lists every blob in the container with its size, with the
// Azure SDK (not through ckpt).
func listBlobs(t *testing.T, conn, containerName string) map[string]int64 {
	t.Helper()
	c, err := container.NewClientFromConnectionString(conn, containerName, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := map[string]int64{}
	p := c.NewListBlobsFlatPager(nil)
	for p.More() {
		page, err := p.NextPage(ctx)
		if err != nil {
			t.Fatalf("list the container: %v", err)
		}
		for _, it := range page.Segment.BlobItems {
			out[*it.Name] = *it.Properties.ContentLength
		}
	}
	return out
}
