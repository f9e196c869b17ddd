package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/restore"
	"github.com/ckpt-io/ckpt/storage/file"
)

const goodTenants = `# two tenants on one node
tenants:
- name: alpha
  uid: 2001
  job: alpha
  storage: file:///var/lib/ckpt-store
  allow_roots: [/var/lib/tenants/alpha]
  tasks: "a-*"
- name: beta
  uid: 2002
  gid: 3000
  cgroup: /kubepods.slice/beta
  job: beta
  storage: s3://bucket/ckpt?path_style=true
  allow_roots:
  - /var/lib/tenants/beta
  - /data/beta
  tasks: "re:b-[0-9]+"
  retain: 3
`

func TestATenantsFileIsReadFromYAMLOrJSON(t *testing.T) {
	for name, doc := range map[string]string{
		"yaml": goodTenants,
		"json": `{"tenants":[{"name":"alpha","uid":2001,"job":"alpha","storage":"file:///var/lib/ckpt-store","allow_roots":["/var/lib/tenants/alpha"],"tasks":"a-*"},
			{"name":"beta","uid":2002,"gid":3000,"cgroup":"/kubepods.slice/beta","job":"beta","storage":"s3://bucket/ckpt?path_style=true","allow_roots":["/var/lib/tenants/beta","/data/beta"],"tasks":"re:b-[0-9]+","retain":3}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			ts, err := ParseTenants([]byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			if len(ts) != 2 || ts[0].Name != "alpha" || *ts[0].UID != 2001 || ts[0].GID != nil ||
				ts[1].Job != "beta" || *ts[1].GID != 3000 || ts[1].Retain != 3 || len(ts[1].AllowRoots) != 2 || ts[1].Cgroup != "/kubepods.slice/beta" {
				t.Fatalf("parsed %+v", ts)
			}
			if name == "yaml" && (ts[0].Line != 3 || ts[1].Line != 9) {
				t.Errorf("lines %d, %d; want 3, 9", ts[0].Line, ts[1].Line)
			}
			for task, want := range map[string][2]bool{
				"a-0": {true, false}, "a-": {true, false}, "b-12": {false, true}, "b-": {false, false},
				"b-1x": {false, false}, "xb-1": {false, false}, "alpha": {false, false},
			} {
				if got := [2]bool{ts[0].match(task), ts[1].match(task)}; got != want {
					t.Errorf("task %s matches alpha, beta: %v, want %v", task, got, want)
				}
			}
		})
	}
}

// TestABadTenantsFileIsRefusedWithTheEntryAndTheReason: every invalid or
// overlapping entry is refused, naming the entry (index, line, name) and
// why.
func TestABadTenantsFileIsRefusedWithTheEntryAndTheReason(t *testing.T) {
	entry := func(name, creds, job, storage, roots, tasks string) string {
		return "- name: " + name + "\n  " + creds + "\n  job: " + job + "\n  storage: " + storage +
			"\n  allow_roots: " + roots + "\n  tasks: " + tasks + "\n"
	}
	a := entry("alpha", "uid: 2001", "alpha", "file:///s", "[/r/a]", `"a-*"`)
	for _, c := range []struct{ name, doc, want string }{
		{"not YAML", "tenants: [", "not a valid tenants file"},
		{"an unknown field", a + "  color: red\n", `unknown field "color"`},
		{"a misspelt field", strings.Replace(a, "allow_roots", "allow_root", 1), `unknown field "allow_root"`},
		{"no tenants", "tenants: []\n", "no tenants"},
		{"a negative uid", entry("b", "uid: -1", "b", "file:///s", "[/r/b]", "b"), "not a valid tenants file"},
		{"no credentials", a + entry("beta", "cgroup: /x", "beta", "file:///s", "[/r/b]", "b-*"), `entry 2 (line 8) "beta": no uid and no gid`},
		{"a relative root", a + entry("beta", "uid: 2002", "beta", "file:///s", "[data/beta]", "b-*"), `entry 2 (line 8) "beta": allow root "data/beta" is relative`},
		{"no roots", entry("beta", "uid: 2002", "beta", "file:///s", "[]", "b-*"), `entry 1 (line 2) "beta": no allow_roots`},
		{"a bad glob", a + entry("beta", "uid: 2002", "beta", "file:///s", "[/r/b]", `"b-["`), `entry 2 (line 8) "beta": tasks pattern "b-[" is not a valid glob`},
		{"a bad regexp", a + entry("beta", "uid: 2002", "beta", "file:///s", "[/r/b]", `"re:b-(["`), `tasks pattern "re:b-(["`},
		{"no pattern", a + entry("beta", "uid: 2002", "beta", "file:///s", "[/r/b]", `""`), `no tasks pattern`},
		{"a bad job name", entry("beta", "uid: 2002", "../beta", "file:///s", "[/r/b]", "b"), `invalid job name`},
		{"no storage", entry("beta", "uid: 2002", "beta", `""`, "[/r/b]", "b"), `no storage URL`},
		{"storage without a scheme", entry("beta", "uid: 2002", "beta", "/s", "[/r/b]", "b"), `not a URL with a scheme`},
		{"a bad tenant name", entry("be ta", "uid: 2002", "beta", "file:///s", "[/r/b]", "b"), `invalid tenant name`},
		{"a relative cgroup", entry("beta", "uid: 2002\n  cgroup: kubepods", "beta", "file:///s", "[/r/b]", "b"), `cgroup "kubepods" is not an absolute clean path`},
		{"a negative retain", a + "  retain: -1\n", `retain must be at least 1`},
		{"a name twice", a + entry("alpha", "uid: 2002", "beta", "file:///s", "[/r/b]", "b"), `entry 2 (line 8) "alpha": the name is used by entry 1 (line 2) "alpha"`},
		{"the same uid twice", a + entry("beta", "uid: 2001", "beta", "file:///s", "[/r/b]", "b"), `entry 2 (line 8) "beta": matches the same peers as entry 1 (line 2) "alpha"`},
		{"a uid tenant and a gid tenant", a + entry("beta", "gid: 5", "beta", "file:///s", "[/r/b]", "b"), `matches the same peers`},
		{"a cgroup below another", entry("alpha", "uid: 1\n  cgroup: /pods", "alpha", "file:///s", "[/r/a]", "a") + entry("beta", "uid: 1\n  cgroup: /pods/b", "beta", "file:///s", "[/r/b]", "b"), `matches the same peers`},
		{"a cgroup tenant and one without", entry("alpha", "uid: 1\n  cgroup: /pods", "alpha", "file:///s", "[/r/a]", "a") + entry("beta", "uid: 1", "beta", "file:///s", "[/r/b]", "b"), `matches the same peers`},
		{"a root inside another tenant's", a + entry("beta", "uid: 2002", "beta", "file:///s", "[/r/b, /r/a/b]", "b-*"), `entry 2 (line 8) "beta": allow root /r/a/b is inside allow root /r/a of entry 1 (line 2) "alpha"`},
		{"a root holding another tenant's", a + entry("beta", "uid: 2002", "beta", "file:///s", "[/r]", "b-*"), `entry 1 (line 2) "alpha": allow root /r/a is inside allow root /r of entry 2 (line 8) "beta"`},
		{"another tenant's root, spelt otherwise", a + entry("beta", "uid: 2002", "beta", "file:///s", "[/r//a/]", "b-*"), `allow root /r/a is allow root /r//a/ of entry 2 (line 8) "beta"`},
		{"the root of all", a + entry("beta", "uid: 2002", "beta", "file:///s", "[/]", "b-*"), `allow root /r/a is inside allow root / of entry 2`},
		{"one job in two storages", a + entry("beta", "uid: 2002", "alpha", "file:///other", "[/r/b]", "b"), `entry 2 (line 8) "beta": job "alpha" is served by entry 1 (line 2) "alpha" from storage file:///s, and here from file:///other`},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc := c.doc
			if !strings.HasPrefix(doc, "tenants:") {
				doc = "tenants:\n" + doc
			}
			_, err := ParseTenants([]byte(doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// TestTenantsThatMayCoexistAreAccepted: different uids, the same uid in
// disjoint cgroups, and one job served by two tenants from one storage.
func TestTenantsThatMayCoexistAreAccepted(t *testing.T) {
	doc := `tenants:
- {name: a, uid: 1, cgroup: /pods/a, job: shared, storage: "file:///s", allow_roots: [/r/a], tasks: "a-*"}
- {name: b, uid: 1, cgroup: /pods/ab, job: shared, storage: "file:///s", allow_roots: [/r/b], tasks: "b-*"}
- {name: c, uid: 2, gid: 7, job: c, storage: "file:///s", allow_roots: [/r/c], tasks: "*"}
- {name: d, uid: 3, gid: 7, job: d, storage: "file:///s", allow_roots: [/r/d], tasks: "*"}
`
	ts, err := ParseTenants([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		peer   Peer
		cgroup string
		want   string
	}{
		{Peer{UID: 1}, "/pods/a", "a"},
		{Peer{UID: 1}, "/pods/a/ctr", "a"},
		{Peer{UID: 1}, "/pods/ab", "b"},
		{Peer{UID: 1}, "/pods", ""},
		{Peer{UID: 1}, "", ""},
		{Peer{UID: 2, GID: 7}, "", "c"},
		{Peer{UID: 2, GID: 8}, "", ""},
		{Peer{UID: 3, GID: 7}, "/x", "d"},
	} {
		var got []string
		for i := range ts {
			if ts[i].matches(c.peer, c.cgroup) {
				got = append(got, ts[i].Name)
			}
		}
		if strings.Join(got, ",") != c.want {
			t.Errorf("peer %+v in %q matches %v, want %q", c.peer, c.cgroup, got, c.want)
		}
	}
}

func TestAPeersCgroupIsItsUnifiedPath(t *testing.T) {
	dir := t.TempDir()
	old := procRoot
	procRoot = dir
	t.Cleanup(func() { procRoot = old })
	os.MkdirAll(filepath.Join(dir, "42"), 0o755)
	os.WriteFile(filepath.Join(dir, "42", "cgroup"), []byte("12:memory:/v1/x\n0::/kubepods.slice/pod-a/cri-1\n"), 0o644)
	if p, err := peerCgroup(42); err != nil || p != "/kubepods.slice/pod-a/cri-1" {
		t.Fatalf("cgroup %q, %v", p, err)
	}
	os.MkdirAll(filepath.Join(dir, "43"), 0o755)
	os.WriteFile(filepath.Join(dir, "43", "cgroup"), []byte("12:memory:/v1/x\n"), 0o644)
	if _, err := peerCgroup(43); err == nil {
		t.Fatal("a cgroup v1 only process has a cgroup v2 path")
	}
	if _, err := peerCgroup(0); err == nil {
		t.Fatal("pid 0 (not visible) has a cgroup")
	}
}

func FuzzParseTenants(f *testing.F) {
	f.Add([]byte(goodTenants))
	f.Add([]byte(`{"tenants":[{"name":"a","uid":1,"job":"a","storage":"file:///s","allow_roots":["/r"],"tasks":"re:(a|b)+"}]}`))
	f.Add([]byte("tenants:\n- {name: a, gid: 1, job: a, storage: 'gs://b', allow_roots: [/], tasks: '[a-'}\n"))
	f.Add([]byte("tenants: &x [*x]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ts, err := ParseTenants(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an empty error")
			}
			return
		}
		// Accepted files are consistent: each tenant valid, none overlapping.
		if len(ts) == 0 {
			t.Fatal("accepted a file without tenants")
		}
		for i := range ts {
			if ts[i].match == nil || len(ts[i].AllowRoots) == 0 || (ts[i].UID == nil && ts[i].GID == nil) {
				t.Fatalf("accepted an incomplete tenant %+v", ts[i])
			}
			for _, r := range ts[i].AllowRoots {
				if !filepath.IsAbs(r) {
					t.Fatalf("accepted a relative root %q", r)
				}
			}
			for j := range i {
				if overlap(&ts[i], &ts[j]) {
					t.Fatalf("accepted overlapping tenants %s and %s", ts[i].Name, ts[j].Name)
				}
			}
		}
	})
}

// Two tenants' roots that are apart by name but nested on disk, through a
// symlink, are refused when the agent starts (New), naming both; roots
// apart on disk start.
func TestTenantRootsNestedThroughASymlinkAreRefusedAtStart(t *testing.T) {
	base := t.TempDir()
	rootA, rootB := filepath.Join(base, "alpha"), filepath.Join(base, "beta")
	for _, d := range []string{rootA, rootB, filepath.Join(rootA, "inner")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(base, "link-into-alpha")
	if err := os.Symlink(filepath.Join(rootA, "inner"), link); err != nil {
		t.Fatal(err)
	}
	store, err := file.New(filepath.Join(base, "store"))
	if err != nil {
		t.Fatal(err)
	}
	start := func(rootOfB string) error {
		doc := fmt.Sprintf(`tenants:
- {name: alpha, uid: 2001, job: alpha, storage: "file://%s", allow_roots: [%s], tasks: "a-*"}
- {name: beta, uid: 2002, job: beta, storage: "file://%s", allow_roots: [%s], tasks: "b-*"}
`, store.Root(), rootA, store.Root(), rootOfB)
		tenants, err := ParseTenants([]byte(doc))
		if err != nil {
			return err
		}
		_, err = New(Config{Socket: filepath.Join(base, "ckpt.sock"), LocalDir: filepath.Join(base, "local"), Tenants: tenants, GCGrace: time.Hour,
			TenantServices: func(Tenant, string) (TenantServices, error) {
				return TenantServices{Store: store, Restore: func(context.Context, RestoreRequest) (*restore.Result, error) { return nil, nil }}, nil
			}})
		return err
	}
	err = start(link)
	if err == nil || !strings.Contains(err.Error(), "allow root "+link+" is inside allow root "+rootA) || !strings.Contains(err.Error(), "resolved") {
		t.Fatalf("beta's root %s, a symlink into alpha's %s: %v, want it refused naming both", link, rootA, err)
	}
	if err := start(rootB); err != nil {
		t.Fatalf("roots apart on disk: %v", err)
	}
}
