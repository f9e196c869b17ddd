package uploader_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/localrecovery"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/uploader"
)

// Every way a shared file is decided, side by side: known by its inode or
// hashed, confirmed or not, alone or with a twin of the same bytes. Each
// object is written once, only confirmed objects are reused without a
// write, and every key is the content address the manifest must name.
func TestKnownAndHashedFilesAreDecidedAlike(t *testing.T) {
	twin := strings.Repeat("t", 5000)
	sn, st := snapshot(t, map[string]string{
		"000001.sst": "known, confirmed",
		"000002.sst": "known, not confirmed",
		"000003.sst": twin, "000004.sst": twin, // known twins, not confirmed
		"000005.sst": "hashed, confirmed",
		"000006.sst": "hashed, not confirmed",
		"CURRENT":    "c",
	})
	ctx := context.Background()
	first, err := uploader.Upload(ctx, uploader.Request{Store: st, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn})
	if err != nil {
		t.Fatal(err)
	}
	confirmed := uploader.NewConfirmed()
	hashes := map[localrecovery.Identity]string{}
	for i, f := range first.Files {
		switch f.Name {
		case "000001.sst", "000005.sst":
			confirmed.Add(&first.Files[i])
		}
		switch f.Name {
		case "000001.sst", "000002.sst", "000003.sst", "000004.sst":
			hashes[sn.Files[i].ID()] = f.Digest()
		}
	}
	c := &counting{Store: st}
	res, err := uploader.Upload(ctx, uploader.Request{Store: c, Job: "job", Task: "t", Checkpoint: 2, Snapshot: sn, Confirmed: confirmed, Hashes: hashes})
	if err != nil {
		t.Fatal(err)
	}
	// 000002, one of the twins, 000006: written again (existing objects
	// that no retained manifest names are not trusted); CURRENT inline.
	if c.puts.Load() != 3 || res.FilesUploaded != 4 || res.FilesReused != 3 || res.HashesReused != 4 || res.BytesHashed != int64(len("hashed, confirmed")+len("hashed, not confirmed")) {
		t.Fatalf("%d puts, %d uploaded, %d reused, %d hashes known, %d bytes hashed", c.puts.Load(), res.FilesUploaded, res.FilesReused, res.HashesReused, res.BytesHashed)
	}
	m := &manifests.Manifest{Job: "job", Task: "t", Checkpoint: 2, Files: res.Files}
	for i, f := range res.Files {
		m.FullSize += f.Size
		if f.Name != sn.Files[i].Name || f.Digest() != first.Files[i].Digest() {
			t.Fatalf("file %d is %s %s, want %s %s", i, f.Name, f.Digest(), sn.Files[i].Name, first.Files[i].Digest())
		}
		if want := map[string]bool{"000002.sst": true, "000006.sst": true, "CURRENT": true}[f.Name]; f.Uploaded != want && f.Name != "000003.sst" && f.Name != "000004.sst" {
			t.Fatalf("%s uploaded = %v, want %v", f.Name, f.Uploaded, want)
		}
	}
	if res.Files[2].Uploaded == res.Files[3].Uploaded || res.Files[2].Key != res.Files[3].Key {
		t.Fatalf("twins: uploaded %v and %v, keys %q and %q; want one upload, one key", res.Files[2].Uploaded, res.Files[3].Uploaded, res.Files[2].Key, res.Files[3].Key)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("the upload's files make an invalid manifest: %v", err)
	}
	if _, err := m.Encode(0); err != nil {
		t.Fatal(err)
	}
}

func TestConfirmedKnowsAContentByItsHashAlgorithmAndSize(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	sha := manifests.File{Kind: manifests.Shared, Size: 10, SHA256: hex, Key: "job/shared/ab/sha"}
	b3 := manifests.File{Kind: manifests.Shared, Size: 10, BLAKE3: hex, Key: "job/shared/ab/b3"}
	c := uploader.NewConfirmed()
	c.Add(&sha)
	if key, ok := c.Key(&sha); !ok || key != sha.Key {
		t.Fatalf("a confirmed content: %q %v", key, ok)
	}
	for name, f := range map[string]manifests.File{
		"another algorithm":   b3,
		"another size":        {Kind: manifests.Shared, Size: 11, SHA256: hex},
		"another hash":        {Kind: manifests.Shared, Size: 10, SHA256: strings.Repeat("ac", 32)},
		"the same first half": {Kind: manifests.Shared, Size: 10, SHA256: hex[:32] + strings.Repeat("cd", 16)},
		"no hash":             {Kind: manifests.Shared, Size: 10},
		"upper-case hex":      {Kind: manifests.Shared, Size: 10, SHA256: strings.ToUpper(hex)},
		"a hash cut short":    {Kind: manifests.Shared, Size: 10, SHA256: hex[:62]},
		"a private, added":    {Kind: manifests.Private, Size: 10, SHA256: hex},
		"a hash of non-hex!":  {Kind: manifests.Shared, Size: 10, SHA256: strings.Repeat("zz", 32)},
	} {
		if name == "a private, added" {
			c.Add(&f) // not an object to reuse: ignored
			f.Kind = manifests.Shared
			f.Size = 12
		}
		if key, ok := c.Key(&f); ok {
			t.Fatalf("%s: found %q", name, key)
		}
	}
	if !c.AddID(b3.ContentID(), b3.Key) {
		t.Fatalf("AddID of %s failed", b3.ContentID())
	}
	if key, ok := c.Key(&sha); !ok || key != sha.Key {
		t.Fatalf("the same hex of another algorithm took the place of a content: %q %v", key, ok)
	}
	if key, ok := c.Key(&b3); !ok || key != b3.Key {
		t.Fatalf("a content added by id: %q %v", key, ok)
	}
	for _, bad := range []string{"", "nodash", hex + "-x", "b3-" + hex[:10] + "-10"} {
		if c.AddID(bad, "k") {
			t.Fatalf("AddID(%q) took a malformed content id", bad)
		}
	}
	var none *uploader.Confirmed
	if _, ok := none.Key(&sha); ok {
		t.Fatal("a nil set holds something")
	}
}

// Previous decides a file only by the same name and the same inode
// identity, reuses its object only when its manifest is confirmed, and
// gives a hash only of an algorithm the upload may use.
func TestPreviousDecidesUnchangedFilesByNameAndInode(t *testing.T) {
	sn, st := snapshot(t, map[string]string{"000001.sst": "one", "000002.sst": "two", "000003.sst": "three", "CURRENT": "c"})
	ctx := context.Background()
	first, err := uploader.Upload(ctx, uploader.Request{Store: st, Job: "job", Task: "t", Checkpoint: 1, Snapshot: sn})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]localrecovery.Identity, len(sn.Files))
	for i, f := range sn.Files {
		ids[i] = f.ID()
	}
	ids[1].ModTime++ // 000002.sst: written since, as far as the record goes
	for _, tc := range []struct {
		name      string
		prev      uploader.Previous
		alg       manifests.Alg
		puts      int64
		reused    int
		hashed    int64
		hashKnown int
	}{
		{"confirmed", uploader.Previous{Files: first.Files, IDs: ids, Confirmed: true}, 0, 1, 2, 3, 2},
		{"not confirmed", uploader.Previous{Files: first.Files, IDs: ids}, 0, 3, 0, 3, 2},
		{"of another algorithm", uploader.Previous{Files: first.Files, IDs: ids, Confirmed: true}, manifests.SHA256, 3, 0, 11, 0},
		{"with fewer identities than files", uploader.Previous{Files: first.Files, IDs: ids[:1], Confirmed: true}, 0, 2, 1, 8, 1},
		{"of other files", uploader.Previous{Files: first.Files[1:], IDs: ids[:3], Confirmed: true}, 0, 3, 0, 11, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &counting{Store: st}
			res, err := uploader.Upload(ctx, uploader.Request{Store: c, Job: "job", Task: "t", Checkpoint: 2, Snapshot: sn, Previous: &tc.prev, Alg: tc.alg})
			if err != nil {
				t.Fatal(err)
			}
			if c.puts.Load() != tc.puts || res.FilesReused != tc.reused || res.BytesHashed != tc.hashed || res.HashesReused != tc.hashKnown {
				t.Fatalf("%d puts, %d reused, %d bytes hashed, %d hashes known; want %d, %d, %d, %d",
					c.puts.Load(), res.FilesReused, res.BytesHashed, res.HashesReused, tc.puts, tc.reused, tc.hashed, tc.hashKnown)
			}
			m := &manifests.Manifest{Job: "job", Task: "t", Checkpoint: 2, Files: res.Files}
			for _, f := range res.Files {
				m.FullSize += f.Size
			}
			if err := m.Validate(); err != nil {
				t.Fatalf("the upload's files make an invalid manifest: %v", err)
			}
		})
	}
}
