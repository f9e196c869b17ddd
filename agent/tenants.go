package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"

	"github.com/ckpt-io/ckpt/internal/names"
)

// Tenant is one entry of a tenants file (node-agent mode): which peers it
// matches, by the credentials the kernel records for a Unix socket peer
// (SO_PEERCRED), and what those peers may use: one job in one storage, the
// directories under AllowRoots, and the tasks its pattern matches.
//
// A peer matches a tenant when every credential the tenant names matches:
// UID, GID (at least one of the two is required) and, optionally, Cgroup, a
// prefix of the peer process's cgroup v2 path (/proc/<pid>/cgroup, line
// "0::"), compared by whole path components. Cgroup needs the agent to see
// the peer's pid (hostPID in Kubernetes); a peer whose cgroup cannot be
// read matches no tenant that names one.
//
// Tasks is a glob (path.Match: "orders-*", "*" for any task) or, with the
// prefix "re:", a Go regular expression that must match the whole task name
// ("re:orders-[0-9]+").
type Tenant struct {
	Name       string   `json:"name"`
	UID        *uint32  `json:"uid,omitempty"`
	GID        *uint32  `json:"gid,omitempty"`
	Cgroup     string   `json:"cgroup,omitempty"`
	Job        string   `json:"job"`
	Storage    string   `json:"storage"`
	AllowRoots []string `json:"allow_roots"`
	Tasks      string   `json:"tasks"`
	// Retain, when positive, is how many complete checkpoints each task of
	// this tenant keeps (default: the agent's --retain).
	Retain int `json:"retain,omitempty"`

	// Line is the line of the entry in its file (0: unknown), for messages.
	Line int `json:"-"`
	// index is the entry's position in the file, from 1 (0: unknown).
	index int
	// match is the compiled Tasks pattern (set by CheckTenants).
	match func(task string) bool
}

// tenantsFile is the document a tenants file holds.
type tenantsFile struct {
	Tenants []Tenant `json:"tenants"`
}

// LoadTenants reads and checks a tenants file (see ParseTenants).
func LoadTenants(file string) ([]Tenant, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tenants file: %w", err)
	}
	ts, err := ParseTenants(data)
	if err != nil {
		return nil, fmt.Errorf("tenants file %s: %w", file, err)
	}
	return ts, nil
}

// ParseTenants decodes a tenants file, YAML or JSON:
//
//	tenants:
//	- name: orders
//	  uid: 1001
//	  job: orders
//	  storage: s3://bucket/ckpt
//	  allow_roots: [/var/lib/ckpt-tenants/orders]
//	  tasks: "orders-*"
//
// Decoding is strict (an unknown field is an error), and the entries are
// checked with CheckTenants. An error names the entry by its index (from
// 1), its line and its name, and says why it is refused. It reads nothing
// but data: whether the roots exist is checked when the agent starts.
func ParseTenants(data []byte) ([]Tenant, error) {
	var f tenantsFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("not a valid tenants file (a YAML or JSON object with a list under \"tenants\"; fields name, uid, gid, cgroup, job, storage, allow_roots, tasks, retain): %w", err)
	}
	if len(f.Tenants) == 0 {
		return nil, errors.New("no tenants: list at least one under \"tenants\"")
	}
	lines := entryLines(data)
	for i := range f.Tenants {
		f.Tenants[i].index = i + 1
		if i < len(lines) {
			f.Tenants[i].Line = lines[i]
		}
	}
	if err := CheckTenants(f.Tenants); err != nil {
		return nil, err
	}
	return f.Tenants, nil
}

// entryLines returns the line of each entry of the tenants list, in order
// (nil when the document cannot be read for lines; messages then give the
// index only).
func entryLines(data []byte) []int {
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return nil
	}
	m := doc.Content[0]
	if m.Kind != yamlv3.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == "tenants" && m.Content[i+1].Kind == yamlv3.SequenceNode {
			var out []int
			for _, e := range m.Content[i+1].Content {
				out = append(out, e.Line)
			}
			return out
		}
	}
	return nil
}

// where names the entry in messages: its index, line and name.
func (t *Tenant) where() string {
	s := "entry " + strconv.Itoa(t.index)
	if t.index == 0 {
		s = "tenant"
	}
	if t.Line > 0 {
		s += " (line " + strconv.Itoa(t.Line) + ")"
	}
	if t.Name != "" {
		s += fmt.Sprintf(" %q", t.Name)
	}
	return s
}

// CheckTenants checks tenants, each alone and against each other, and
// compiles their task patterns. It refuses an entry with no name or a name
// used twice, matching no credentials (neither uid nor gid), with a cgroup
// that is not an absolute clean path, an invalid job name, no storage URL,
// no allowed root or a relative one, or a task pattern that does not
// compile; and two entries that can match the same peer (every credential
// both name is equal, or one cgroup is a prefix of the other: a uid-only
// and a gid-only tenant overlap too), that serve one job from different
// storage URLs, or one of whose allowed roots is equal to or inside one of
// the other's (cleaned; New checks them again with symlinks resolved).
func CheckTenants(ts []Tenant) error {
	seen := map[string]*Tenant{}
	for i := range ts {
		t := &ts[i]
		if t.index == 0 {
			t.index = i + 1
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%s: %s", t.where(), fmt.Sprintf(format, args...))
		}
		if err := names.Valid("tenant", t.Name); err != nil {
			return bad("%v", err)
		}
		if o := seen[t.Name]; o != nil {
			return bad("the name is used by %s too: give each tenant its own name (it names its local dir)", o.where())
		}
		seen[t.Name] = t
		if t.UID == nil && t.GID == nil {
			return bad("no uid and no gid: a tenant must match a peer's credentials by uid, gid or both")
		}
		if t.Cgroup != "" && (!strings.HasPrefix(t.Cgroup, "/") || path.Clean(t.Cgroup) != t.Cgroup) {
			return bad("cgroup %q is not an absolute clean path such as /kubepods.slice/kubepods-pod123.slice", t.Cgroup)
		}
		if err := names.Valid("job", t.Job); err != nil {
			return bad("%v", err)
		}
		if t.Storage == "" {
			return bad("no storage URL (file:///dir, s3://bucket/prefix, gs://bucket/prefix, ...)")
		}
		if u, err := url.Parse(t.Storage); err != nil || u.Scheme == "" {
			return bad("storage %q is not a URL with a scheme (file:///dir, s3://bucket/prefix, ...)", t.Storage)
		}
		if len(t.AllowRoots) == 0 {
			return bad("no allow_roots: name the directories its pods checkpoint from and restore into")
		}
		for _, r := range t.AllowRoots {
			if !filepath.IsAbs(r) {
				return bad("allow root %q is relative: give an absolute path", r)
			}
		}
		if t.Retain < 0 {
			return bad("retain must be at least 1 (or left out for the agent's --retain), got %d", t.Retain)
		}
		m, err := compileTasks(t.Tasks)
		if err != nil {
			return bad("%v", err)
		}
		t.match = m
	}
	for i := range ts {
		for j := range i {
			a, b := &ts[j], &ts[i]
			if overlap(a, b) {
				return fmt.Errorf("%s: matches the same peers as %s (a peer must match one tenant at most: give them different uids, gids or disjoint cgroups)", b.where(), a.where())
			}
			if a.Job == b.Job && a.Storage != b.Storage {
				return fmt.Errorf("%s: job %q is served by %s from storage %s, and here from %s: one job lives in one storage", b.where(), b.Job, a.where(), a.Storage, b.Storage)
			}
		}
	}
	return checkRootsApart(ts, func(r string) (string, error) { return filepath.Clean(r), nil })
}

// checkRootsApart refuses two tenants one of whose allowed roots is equal
// to or inside one of the other's, as resolve gives them (cleaned, or
// with symlinks resolved): the peers of one could checkpoint the other's
// directories into their own job, or restore their job into the other's.
func checkRootsApart(ts []Tenant, resolve func(string) (string, error)) error {
	type root struct {
		t         *Tenant
		given, at string
	}
	var roots []root
	for i := range ts {
		for _, r := range ts[i].AllowRoots {
			at, err := resolve(r)
			if err != nil {
				return fmt.Errorf("%s: allow root %q: %w (it must exist)", ts[i].where(), r, err)
			}
			roots = append(roots, root{&ts[i], r, at})
		}
	}
	within := func(p, dir string) bool {
		return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
	}
	for i, a := range roots {
		for _, b := range roots[i+1:] {
			if a.t == b.t || (!within(a.at, b.at) && !within(b.at, a.at)) {
				continue
			}
			how := "is inside"
			switch {
			case a.at == b.at:
				how = "is"
			case within(b.at, a.at):
				a, b = b, a
			}
			resolved := ""
			if a.given != a.at || b.given != b.at {
				resolved = fmt.Sprintf(" (resolved, %s %s %s)", a.at, how, b.at)
			}
			return fmt.Errorf("%s: allow root %s %s allow root %s of %s%s: the peers of one tenant could checkpoint or restore into the other's directories; give each tenant roots of its own, none inside another's",
				a.t.where(), a.given, how, b.given, b.t.where(), resolved)
		}
	}
	return nil
}

// CheckTenantRoots is checkRootsApart on the roots as they are on disk,
// symlinks resolved: for an agent about to serve ts.
func CheckTenantRoots(ts []Tenant) error {
	return checkRootsApart(ts, filepath.EvalSymlinks)
}

// compileTasks compiles a task pattern: a glob, or "re:" and a regular
// expression matching whole names.
func compileTasks(p string) (func(string) bool, error) {
	if p == "" {
		return nil, errors.New(`no tasks pattern: give a glob such as "orders-*" ("*" for any task) or "re:" and a regular expression`)
	}
	if expr, ok := strings.CutPrefix(p, "re:"); ok {
		re, err := regexp.Compile(`^(?:` + expr + `)$`)
		if err != nil {
			return nil, fmt.Errorf("tasks pattern %q: %v", p, err)
		}
		return re.MatchString, nil
	}
	if _, err := path.Match(p, ""); err != nil {
		return nil, fmt.Errorf("tasks pattern %q is not a valid glob (path.Match syntax: * ? [a-z] \\): %v", p, err)
	}
	return func(task string) bool {
		ok, _ := path.Match(p, task)
		return ok
	}, nil
}

// overlap reports whether a peer could match both a and b.
func overlap(a, b *Tenant) bool {
	same := func(x, y *uint32) bool { return x == nil || y == nil || *x == *y }
	if !same(a.UID, b.UID) || !same(a.GID, b.GID) {
		return false
	}
	return a.Cgroup == "" || b.Cgroup == "" || underCgroup(a.Cgroup, b.Cgroup) || underCgroup(b.Cgroup, a.Cgroup)
}

// underCgroup reports whether cgroup path p is prefix or below it, by whole
// components.
func underCgroup(p, prefix string) bool {
	return p == prefix || prefix == "/" || strings.HasPrefix(p, prefix+"/")
}

// matches reports whether the peer p, whose cgroup v2 path is cgroup
// ("" unknown), matches t.
func (t *Tenant) matches(p Peer, cgroup string) bool {
	if t.UID != nil && *t.UID != p.UID || t.GID != nil && *t.GID != p.GID {
		return false
	}
	return t.Cgroup == "" || cgroup != "" && underCgroup(cgroup, t.Cgroup)
}

// procRoot is where peerCgroup reads /proc (tests replace it).
var procRoot = "/proc"

// peerCgroup reads the cgroup v2 path of process pid ("" and an error
// when it cannot: the peer is not visible in the agent's pid namespace, or
// the host has no unified hierarchy).
func peerCgroup(pid int32) (string, error) {
	if pid <= 0 {
		return "", errors.New("the peer's pid is not visible to the agent (run it with hostPID)")
	}
	data, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(int(pid)), "cgroup"))
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok && strings.HasPrefix(p, "/") {
			return p, nil
		}
	}
	return "", errors.New("no cgroup v2 path (line 0::) for the peer")
}
