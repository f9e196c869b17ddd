package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// netLab gives each node of a test its own network namespace, joined to
// the host by a veth pair on a /30 the lab makes itself, and a storage
// address on the host that every node reaches through its own pair. Cutting
// a node's link (Cut) partitions it from storage while its processes, and
// its Unix sockets on the shared filesystem, stay as they are.
//
// Addresses come from 198.18.0.0/15 (reserved for benchmarking networks,
// RFC 2544), in a /24 no interface of the host uses yet: never a range
// the machine's own networks use. Names carry the test process's pid, so
// that concurrent runs do not collide and a run's leftovers are known.
type netLab struct {
	t      *testing.T
	tag    string // "ckf<pid>": the prefix of the lab's interface names
	subnet string // "198.18.X." or "198.19.X."
	// StorageIP is the host address servers bind to (on the storage veth).
	StorageIP string
	nodes     map[string]*netNode
	next      int // next /30 block (0 is storage's)
}

// netNode is one node's namespace and link.
type netNode struct {
	NS     string // network namespace name
	hostIf string
	nsIf   string
	HostIP string
	IP     string // the node's address, inside NS
}

// ipCmd runs `ip args...` and returns its combined output.
func ipCmd(args ...string) (string, error) {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// newNetLab sets up the lab's storage link, or returns why it cannot (not
// root, no `ip`, namespaces refused): the caller then falls back to plain
// processes and says so.
func newNetLab(t *testing.T) (*netLab, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil, errors.New("not root: network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("the ip command (iproute2) is not installed")
	}
	cleanStaleNetLabs(t)
	// Interface names: "ckf" + pid (at most 7 digits) + "h63": 13 of 15.
	l := &netLab{t: t, tag: fmt.Sprintf("ckf%d", os.Getpid()), nodes: map[string]*netNode{}, next: 1}
	addrs, err := ipCmd("-o", "addr", "show")
	if err != nil {
		return nil, err
	}
	for i := range 512 {
		x := (os.Getpid() + i) % 512
		subnet := fmt.Sprintf("198.%d.%d.", 18+x/256, x%256)
		if !strings.Contains(addrs, " "+subnet) {
			l.subnet = subnet
			break
		}
	}
	if l.subnet == "" {
		return nil, errors.New("every /24 of 198.18.0.0/15 is in use on this host")
	}
	// The storage address sits on a veth whose peer stays in the host's
	// namespace, up: an address no node's cut can take down.
	l.StorageIP = l.subnet + "1"
	sh, sp := l.tag+"s0", l.tag+"s1"
	if _, err := ipCmd("link", "add", sh, "type", "veth", "peer", "name", sp); err != nil {
		return nil, err
	}
	t.Cleanup(func() { ipCmd("link", "del", sh) })
	for _, args := range [][]string{
		{"addr", "add", l.StorageIP + "/30", "dev", sh},
		{"link", "set", sh, "up"},
		{"link", "set", sp, "up"},
	} {
		if _, err := ipCmd(args...); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// cleanStaleNetLabs removes namespaces and links a killed earlier run of
// this suite left behind: only those named after a pid that is gone.
func cleanStaleNetLabs(t *testing.T) {
	out, err := ipCmd("netns", "list")
	if err != nil {
		return
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "ckpt-fleet-") {
			continue
		}
		parts := strings.Split(f[0], "-")
		if len(parts) < 4 {
			continue
		}
		pid, err := strconv.Atoi(parts[2])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue // a live run's
		}
		t.Logf("netns: removing %s, left by an earlier run (pid %d is gone)", f[0], pid)
		ipCmd("netns", "del", f[0])
	}
	links, err := ipCmd("-o", "link", "show")
	if err != nil {
		return
	}
	for _, line := range strings.Split(links, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[1], "ckf") {
			continue
		}
		name := strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":")
		pidStr := strings.TrimPrefix(name, "ckf")
		if i := strings.IndexFunc(pidStr, func(r rune) bool { return r < '0' || r > '9' }); i > 0 {
			pidStr = pidStr[:i]
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue
		}
		t.Logf("netns: removing link %s, left by an earlier run (pid %d is gone)", name, pid)
		ipCmd("link", "del", name)
	}
}

// Node creates the namespace of a node and its link: a /30 with the host
// side and the node side, and a route to the storage address only.
func (l *netLab) Node(name string) *netNode {
	l.t.Helper()
	if n := l.nodes[name]; n != nil {
		return n
	}
	i := l.next
	l.next++
	if i >= 64 {
		l.t.Fatal("netns: more than 63 nodes")
	}
	n := &netNode{
		NS:     fmt.Sprintf("ckpt-fleet-%d-%s", os.Getpid(), name),
		hostIf: fmt.Sprintf("%sh%d", l.tag, i),
		nsIf:   fmt.Sprintf("%sn%d", l.tag, i),
		HostIP: fmt.Sprintf("%s%d", l.subnet, 4*i+1),
		IP:     fmt.Sprintf("%s%d", l.subnet, 4*i+2),
	}
	if _, err := ipCmd("netns", "add", n.NS); err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { ipCmd("netns", "del", n.NS) })
	for _, args := range [][]string{
		{"link", "add", n.hostIf, "type", "veth", "peer", "name", n.nsIf, "netns", n.NS},
		{"addr", "add", n.HostIP + "/30", "dev", n.hostIf},
		{"link", "set", n.hostIf, "up"},
		{"-n", n.NS, "link", "set", "lo", "up"},
		{"-n", n.NS, "addr", "add", n.IP + "/30", "dev", n.nsIf},
		{"-n", n.NS, "link", "set", n.nsIf, "up"},
		{"-n", n.NS, "route", "add", l.StorageIP + "/32", "via", n.HostIP},
	} {
		if _, err := ipCmd(args...); err != nil {
			l.t.Fatal(err)
		}
	}
	l.nodes[name] = n
	return n
}

// Wrap is the command prefix that runs a program in the node's namespace
// (ip netns exec execs it: the process started is the program itself).
func (n *netNode) Wrap() []string { return []string{"ip", "netns", "exec", n.NS} }

// Cut takes the node's link down: packets to and from storage are dropped
// (connections stall, nothing is reset) until Reconnect.
func (l *netLab) Cut(n *netNode) {
	l.t.Helper()
	if _, err := ipCmd("-n", n.NS, "link", "set", n.nsIf, "down"); err != nil {
		l.t.Fatal(err)
	}
}

// Reconnect brings the node's link back up, with its route to storage.
func (l *netLab) Reconnect(n *netNode) {
	l.t.Helper()
	if _, err := ipCmd("-n", n.NS, "link", "set", n.nsIf, "up"); err != nil {
		l.t.Fatal(err)
	}
	// Taking the link down removed the route through it.
	if out, err := ipCmd("-n", n.NS, "route", "replace", l.StorageIP+"/32", "via", n.HostIP); err != nil {
		l.t.Fatalf("%v: %s", err, out)
	}
}
