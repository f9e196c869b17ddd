package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ckpt-io/ckpt/agent"
	"github.com/ckpt-io/ckpt/client"
	cpebble "github.com/ckpt-io/ckpt/client/pebble"
	"github.com/ckpt-io/ckpt/lab/kube"
	"github.com/ckpt-io/ckpt/lab/testservers"
)

// The tenant app: the e2e test binary, run again as a tenant's pod
// (CKPT_E2E_TENANT_APP names what it does), under the tenant's uid.
func init() {
	if mode := os.Getenv("CKPT_E2E_TENANT_APP"); mode != "" {
		out, err := tenantApp(mode)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tenant app:", err)
			os.Exit(1)
		}
		json.NewEncoder(os.Stdout).Encode(out)
		os.Exit(0)
	}
}

// tenantKeys is how many keys each checkpoint of a tenant app adds.
const tenantKeys = 2000

func tenantKey(i int) []byte { return fmt.Appendf(nil, "key-%06d", i) }

func tenantValue(task string, i int) []byte {
	return bytes.Repeat(fmt.Appendf(nil, "%s/%d;", task, i), 20)
}

// tenantApp is what a tenant's pod does, by mode: checkpoint (a Pebble
// store, two checkpoints through the node's socket), restore (its task,
// through the socket, then every key checked), or attack (the other
// tenant's directory and job, each answered with an error code).
func tenantApp(mode string) (any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	socket, job, task, data := os.Getenv("CKPT_SOCKET"), os.Getenv("CKPT_JOB"), os.Getenv("CKPT_TASK"), os.Getenv("CKPT_DATA_DIR")
	store := filepath.Join(data, "store")
	switch mode {
	case "checkpoint":
		if err := os.MkdirAll(data, 0o755); err != nil {
			return nil, err
		}
		db, err := pebble.Open(store, &pebble.Options{Logger: quietPebble{}})
		if err != nil {
			return nil, err
		}
		defer db.Close()
		c, err := client.Dial(ctx, socket)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		var done []uint64
		for n := uint64(1); n <= 2; n++ {
			for i := int(n-1) * tenantKeys; i < int(n)*tenantKeys; i++ {
				if err := db.Set(tenantKey(i), tenantValue(task, i), pebble.NoSync); err != nil {
					return nil, err
				}
			}
			var p *client.Pending
			if n == 1 { // the tenant's job by default
				p, err = cpebble.Checkpoint(ctx, c, db, store, task, n)
			} else { // or named
				var dir string
				if dir, err = cpebble.Snapshot(db, store, n); err == nil {
					p, err = c.Send(ctx, client.Request{Job: job, Task: task, Checkpoint: n, Dir: dir, Engine: cpebble.Engine, Handoff: true})
					os.RemoveAll(dir)
				}
			}
			if err != nil {
				return nil, fmt.Errorf("checkpoint %d: %w", n, err)
			}
			if _, err := p.Wait(ctx); err != nil {
				return nil, fmt.Errorf("checkpoint %d: %w", n, err)
			}
			done = append(done, n)
		}
		return map[string]any{"completed": done}, nil
	case "restore":
		target := filepath.Join(data, "restored")
		ev, err := rawRequest(socket, map[string]any{"op": "restore", "job": job, "task": task, "target": target})
		if err != nil {
			return nil, err
		}
		if ev["event"] != "restored" {
			return nil, fmt.Errorf("restore: %v", ev)
		}
		// The tenant opens (and writes) what the agent restored for it.
		db, err := pebble.Open(target, &pebble.Options{Logger: quietPebble{}})
		if err != nil {
			return nil, fmt.Errorf("open the restored store: %w", err)
		}
		defer db.Close()
		it, err := db.NewIter(nil)
		if err != nil {
			return nil, err
		}
		defer it.Close()
		i := 0
		for it.First(); it.Valid(); it.Next() {
			if !bytes.Equal(it.Key(), tenantKey(i)) || !bytes.Equal(it.Value(), tenantValue(task, i)) {
				return nil, fmt.Errorf("restored key %d: %q = %.40q", i, it.Key(), it.Value())
			}
			i++
		}
		if i != 2*tenantKeys {
			return nil, fmt.Errorf("restored %d keys, want %d", i, 2*tenantKeys)
		}
		if err := db.Set([]byte("after-restore"), []byte("x"), pebble.Sync); err != nil {
			return nil, fmt.Errorf("write the restored store: %w", err)
		}
		return map[string]any{"checkpoint": ev["checkpoint"], "keys": i}, nil
	case "attack":
		otherDir, otherJob := os.Getenv("CKPT_E2E_OTHER_DIR"), os.Getenv("CKPT_E2E_OTHER_JOB")
		own := filepath.Join(data, "attack")
		os.MkdirAll(own, 0o755)
		os.WriteFile(filepath.Join(own, "000001.sst"), []byte("mine"), 0o644)
		codes := map[string]string{}
		for name, req := range map[string]map[string]any{
			"checkpoint the other's dir":   {"op": "checkpoint", "task": task, "checkpoint": 9, "dir": otherDir},
			"checkpoint the other's job":   {"op": "checkpoint", "job": otherJob, "task": task, "checkpoint": 9, "dir": own},
			"restore into the other's dir": {"op": "restore", "task": task, "target": filepath.Join(filepath.Dir(otherDir), "stolen")},
			"restore the other's job":      {"op": "restore", "job": otherJob, "task": task, "target": filepath.Join(data, "stolen")},
		} {
			ev, err := rawRequest(socket, req)
			if err != nil {
				return nil, err
			}
			e, _ := ev["error"].(map[string]any)
			codes[name], _ = e["code"].(string)
		}
		return codes, nil
	}
	return nil, fmt.Errorf("unknown mode %q", mode)
}

// rawRequest sends one request line and returns the reply that ends it.
func rawRequest(socket string, req map[string]any) (map[string]any, error) {
	c, err := net.Dial("unix", socket)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var ev map[string]any
		if err := json.Unmarshal(line, &ev); err != nil {
			return nil, err
		}
		if ev["event"] != "synced" {
			return ev, nil
		}
	}
}

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format, args...)
	os.Exit(2)
}

// nodeAgentDocs are the node agent's manifests as a cluster gets them:
// deploy/node-agent rendered with kustomize's library, and the example
// tenants' StatefulSets, every document decoded strictly (an unknown field
// is an error) into Kubernetes' own types.
type nodeAgentDocs struct {
	account    corev1.ServiceAccount
	tenantsMap corev1.ConfigMap
	ds         appsv1.DaemonSet
	sets       []appsv1.StatefulSet
}

func decodeNodeAgent(t *testing.T) *nodeAgentDocs {
	t.Helper()
	dir := filepath.Join(deployDir(t), "node-agent")
	objs, err := kube.Render(dir)
	if err != nil {
		t.Fatal(err)
	}
	d := &nodeAgentDocs{}
	for _, o := range objs {
		switch v := o.Obj.(type) {
		case *corev1.ServiceAccount:
			d.account = *v
		case *corev1.ConfigMap:
			d.tenantsMap = *v
		case *appsv1.DaemonSet:
			d.ds = *v
		}
	}
	examples, _, err := kube.Files(filepath.Join(dir, "example-tenants"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range examples {
		if v, ok := o.Obj.(*appsv1.StatefulSet); ok {
			d.sets = append(d.sets, *v)
		}
	}
	if d.ds.Name == "" || d.tenantsMap.Name == "" || d.account.Name == "" || len(d.sets) != 2 {
		t.Fatalf("deploy/node-agent: want a ServiceAccount, a ConfigMap and a DaemonSet rendered, and two example StatefulSets")
	}
	return d
}

// argValue returns the value of --name=value in args ("" if absent).
func argValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// TestTheNodeAgentManifestsHoldTogether: the DaemonSet, its tenants file
// and the tenants' StatefulSets agree: the tenants file parses, each
// StatefulSet runs as the uid of one tenant and keeps its data under that
// tenant's root, the socket and data are hostPath volumes mounted at the
// same paths in the agent and the pods, the probes are the agent's, and
// the pod's grace outlasts the agent's shutdown grace.
func TestTheNodeAgentManifestsHoldTogether(t *testing.T) {
	d := decodeNodeAgent(t)
	spec := d.ds.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("containers: %d", len(spec.Containers))
	}
	ag := spec.Containers[0]
	if ag.ReadinessProbe == nil || ag.ReadinessProbe.HTTPGet == nil || ag.ReadinessProbe.HTTPGet.Path != "/readyz" ||
		ag.LivenessProbe == nil || ag.LivenessProbe.HTTPGet == nil || ag.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Error("the agent's probes are not /readyz and /healthz")
	}
	grace, err := time.ParseDuration(argValue(ag.Args, "shutdown-grace"))
	if err != nil || spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second <= grace {
		t.Errorf("terminationGracePeriodSeconds %v must exceed --shutdown-grace %v (%v)", spec.TerminationGracePeriodSeconds, grace, err)
	}
	sc := ag.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Error("the agent's securityContext: want a read-only root filesystem and every capability dropped but the few it needs")
	}
	hostPaths := map[string]string{} // mount path → host path
	for _, m := range ag.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil {
				hostPaths[m.MountPath] = v.HostPath.Path
			}
		}
	}
	socket := argValue(ag.Args, "socket")
	if hostPaths[filepath.Dir(socket)] == "" {
		t.Errorf("the socket dir %s is not a hostPath volume", filepath.Dir(socket))
	}
	tenants, err := agent.ParseTenants([]byte(d.tenantsMap.Data[filepath.Base(argValue(ag.Args, "tenants"))]))
	if err != nil {
		t.Fatalf("the tenants file: %v", err)
	}
	local := argValue(ag.Args, "local-dir")
	for _, set := range d.sets {
		pod := set.Spec.Template.Spec
		if pod.SecurityContext == nil || pod.SecurityContext.RunAsUser == nil {
			t.Fatalf("%s: no runAsUser", set.Name)
		}
		var tn *agent.Tenant
		for i := range tenants {
			if tenants[i].UID != nil && int64(*tenants[i].UID) == *pod.SecurityContext.RunAsUser {
				tn = &tenants[i]
			}
		}
		if tn == nil {
			t.Fatalf("%s runs as uid %d, which no tenant matches", set.Name, *pod.SecurityContext.RunAsUser)
		}
		if !slices.Contains(pod.SecurityContext.SupplementalGroups, *sc.RunAsGroup) {
			t.Errorf("%s is not in the socket's group %d", set.Name, *sc.RunAsGroup)
		}
		for _, m := range pod.Containers[0].VolumeMounts {
			for _, v := range pod.Volumes {
				if v.Name != m.Name || v.HostPath == nil {
					continue
				}
				if m.MountPath != v.HostPath.Path {
					t.Errorf("%s mounts %s at %s: mount it at its host path, as the agent does", set.Name, v.HostPath.Path, m.MountPath)
				}
				if m.MountPath == filepath.Dir(socket) {
					continue
				}
				inRoot := false
				for _, r := range tn.AllowRoots {
					inRoot = inRoot || m.MountPath == r || strings.HasPrefix(m.MountPath, r+"/")
				}
				if !inRoot {
					t.Errorf("%s keeps data at %s, outside tenant %s's roots %v", set.Name, m.MountPath, tn.Name, tn.AllowRoots)
				}
				// One mount in the agent holds both the tenant's data and the
				// local dir: snapshots are hard-linked, not copied.
				if agentMount(hostPaths, m.MountPath) != agentMount(hostPaths, local) {
					t.Errorf("%s's data (%s) and the agent's --local-dir %s are in different mounts of the agent: hard links fail across them", set.Name, m.MountPath, local)
				}
			}
		}
	}
}

// agentMount returns the mount path (of mounts) that holds p.
func agentMount(mounts map[string]string, p string) string {
	best := ""
	for m := range mounts {
		if (p == m || strings.HasPrefix(p, m+"/")) && len(m) > len(best) {
			best = m
		}
	}
	return best
}

// TestTheNodeAgentServesTwoTenantPodsAndKeepsThemApart runs the DaemonSet
// as processes: its init container's script, then its agent container's
// command line (volumes mapped to temporary directories, the tenants file
// from the ConfigMap, storage the bucket it names on versitygw), and the two StatefulSets' pods
// as processes under their uids, groups and environment. Each checkpoints a
// real Pebble store twice and restores it, key by key; one tenant's attempts
// at the other's directory and job are forbidden.
func TestTheNodeAgentServesTwoTenantPodsAndKeepsThemApart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs processes")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the pods under their uids")
	}
	d := decodeNodeAgent(t)
	host := t.TempDir()
	for p := host; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		os.Chmod(p, 0o755) // the pods' uids walk to their mounts
	}
	// A container path under a hostPath mount lives at host+hostPath.
	spec := d.ds.Spec.Template.Spec
	mounts := map[string]string{}
	for _, m := range append(spec.InitContainers[0].VolumeMounts, spec.Containers[0].VolumeMounts...) {
		for _, v := range spec.Volumes {
			switch {
			case v.Name != m.Name:
			case v.HostPath != nil:
				mounts[m.MountPath] = filepath.Join(host, v.HostPath.Path)
			default: // configMap, emptyDir: a directory of the pod's own
				mounts[m.MountPath] = filepath.Join(host, "pod", v.Name)
			}
		}
	}
	// One pass over every mount path, longest first: a mapped path is not
	// mapped again.
	var alts []string
	for _, m := range sortedByLength(mounts) {
		alts = append(alts, regexp.QuoteMeta(m))
	}
	mountRE := regexp.MustCompile(`(^|[ =\[,:])(` + strings.Join(alts, "|") + `)(/|\b|$)`)
	mapPath := func(s string) string {
		return mountRE.ReplaceAllStringFunc(s, func(m string) string {
			sub := mountRE.FindStringSubmatch(m)
			return sub[1] + mounts[sub[2]] + sub[3]
		})
	}
	for _, p := range mounts {
		os.MkdirAll(p, 0o755)
	}
	// The tenants' storage: the bucket and prefix the ConfigMap names, on a
	// real S3 server (versitygw) reached through the environment, as a
	// cloud's would be.
	srv := testservers.S3(t)
	var bucket, prefix string
	storageRE := regexp.MustCompile(`storage: (\S+)`)
	for name, content := range d.tenantsMap.Data {
		content = storageRE.ReplaceAllStringFunc(content, func(m string) string {
			u, err := url.Parse(storageRE.FindStringSubmatch(m)[1])
			if err != nil || u.Scheme != "s3" {
				t.Fatalf("tenant storage %s: want s3://bucket/prefix", m)
			}
			if bucket == "" {
				bucket, prefix = u.Host, strings.Trim(u.Path, "/")
				srv.CreateBucket(t, bucket)
			}
			if u.Host != bucket || strings.Trim(u.Path, "/") != prefix {
				t.Fatalf("the tenants use several buckets or prefixes; this test maps one")
			}
			return "storage: " + strconv.Quote(srv.URL(bucket, prefix))
		})
		// The ConfigMap, as the kubelet projects it.
		if err := os.WriteFile(filepath.Join(mounts["/etc/ckpt"], name), []byte(mapPath(content)), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The init container: the tenants' roots, owned by their uids.
	initC := spec.InitContainers[0]
	script := mapPath(strings.Join(initC.Args, " "))
	if out, err := exec.Command(initC.Command[0], append(initC.Command[1:], script)...).CombinedOutput(); err != nil {
		t.Fatalf("init container %s: %v\n%s", initC.Name, err, out)
	}

	// The agent container, with the DaemonSet's args and env.
	ag := spec.Containers[0]
	port := freePort(t)
	args := []string{}
	for _, a := range ag.Args {
		if strings.HasPrefix(a, "--metrics-addr=") {
			a = "--metrics-addr=127.0.0.1:" + strconv.Itoa(port)
		}
		args = append(args, mapPath(strings.ReplaceAll(a, "$(NODE_NAME)", "node-1")))
	}
	env := childEnv(nil)
	for _, e := range ag.Env {
		if e.Value != "" {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	env = append(env, srv.Env()...) // the service account's credentials, here
	cmd := exec.Command(ckptBin, args...)
	cmd.Env = env
	stderr := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(*ag.SecurityContext.RunAsUser), Gid: uint32(*ag.SecurityContext.RunAsGroup)}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed when the agent exits
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("agent:\n%s", stderr)
		}
	})
	waitReadyz(t, port, exited, stderr)

	// The pods: the test binary as each tenant's app.
	app := filepath.Join(host, "pod", "tenant-app")
	copyFile(t, os.Args[0], app)
	type pod struct {
		name, job string
		env       []string
		cred      *syscall.Credential
		data      string
	}
	var pods []pod
	for _, set := range d.sets {
		ps := set.Spec.Template.Spec
		p := pod{name: set.Name + "-0", cred: &syscall.Credential{Uid: uint32(*ps.SecurityContext.RunAsUser), Gid: uint32(*ps.SecurityContext.RunAsGroup)}}
		for _, g := range ps.SecurityContext.SupplementalGroups {
			p.cred.Groups = append(p.cred.Groups, uint32(g))
		}
		vars := map[string]string{}
		for _, e := range ps.Containers[0].Env {
			v := e.Value
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" {
				v = p.name
			}
			for k, kv := range vars {
				v = strings.ReplaceAll(v, "$("+k+")", kv)
			}
			vars[e.Name] = mapPath(v)
			p.env = append(p.env, e.Name+"="+vars[e.Name])
		}
		p.job, p.data = vars["CKPT_JOB"], vars["CKPT_DATA_DIR"]
		pods = append(pods, p)
	}
	run := func(p pod, mode string, extra ...string) map[string]any {
		t.Helper()
		c := exec.Command(app)
		c.Env = append(append(childEnv(p.env), "CKPT_E2E_TENANT_APP="+mode), extra...)
		c.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
		var out, errb bytes.Buffer
		c.Stdout, c.Stderr = &out, &errb
		if err := c.Run(); err != nil {
			t.Fatalf("pod %s, %s: %v\n%s", p.name, mode, err, errb.String())
		}
		var res map[string]any
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			t.Fatalf("pod %s, %s: %v: %q", p.name, mode, err, out.String())
		}
		return res
	}
	for _, p := range pods {
		if res := run(p, "checkpoint"); fmt.Sprint(res["completed"]) != "[1 2]" {
			t.Fatalf("pod %s: %v", p.name, res)
		}
	}
	storeDir := filepath.Join(srv.DataDir, bucket)
	keys := storedKeys(t, storeDir)
	if len(keys) == 0 {
		t.Fatal("nothing in storage after the checkpoints")
	}
	// The other tenant's pod attacks: its dir, its job.
	victim := pods[1]
	codes := run(pods[0], "attack", "CKPT_E2E_OTHER_DIR="+filepath.Join(victim.data, "store"), "CKPT_E2E_OTHER_JOB="+victim.job)
	if len(codes) != 4 {
		t.Fatalf("attack: %v", codes)
	}
	for what, code := range codes {
		if code != "forbidden" {
			t.Errorf("%s of %s to %s: %v, want forbidden", pods[0].name, what, victim.name, code)
		}
	}
	if after := storedKeys(t, storeDir); !slices.Equal(after, keys) {
		t.Errorf("refused requests changed storage")
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(victim.data), "stolen")); !os.IsNotExist(err) {
		t.Errorf("a refused restore wrote into the other tenant's root")
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, prefix+"/"+pods[0].job+"/") && !strings.HasPrefix(k, prefix+"/"+pods[1].job+"/") {
			t.Errorf("object outside the tenants' jobs: %s", k)
		}
	}
	// Each restores its task through the agent, and reads every key.
	for _, p := range pods {
		res := run(p, "restore")
		if res["keys"] != float64(2*tenantKeys) || res["checkpoint"] != float64(2) {
			t.Fatalf("pod %s restore: %v", p.name, res)
		}
	}
}

func sortedByLength(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b string) int { return len(b) - len(a) })
	return ks
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitReadyz(t *testing.T, port int, exited <-chan struct{}, stderr *lockedBuffer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			t.Fatalf("the agent exited:\n%s", stderr)
		default:
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the agent is not ready\n%s", stderr)
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func storedKeys(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() && strings.HasPrefix(fi.Name(), ".") {
			return filepath.SkipDir // the server's own (temporary parts, locks)
		}
		if err == nil && !fi.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	slices.Sort(out)
	return out
}
