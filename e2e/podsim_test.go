package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/client"
	ckptpebble "github.com/ckpt-io/ckpt/client/pebble"
	"github.com/ckpt-io/ckpt/lab/kube"
	"github.com/ckpt-io/ckpt/lab/testservers"
	"github.com/ckpt-io/ckpt/lab/workload"
	corev1 "k8s.io/api/core/v1"
)

// podSim runs one pod of a rendered manifest as the kubelet would, with
// processes instead of containers: init containers in order to completion,
// native sidecars (restartPolicy: Always) started and awaited through
// their startup probe, then the app; on deletion, SIGTERM to the app
// first, then to the sidecars, each given the pod's
// terminationGracePeriodSeconds. Volumes are directories of the test
// (a volume name maps to the same directory in every container that
// mounts it), and every mount path in a container's args and env is
// rewritten to its directory. The ckpt binary stands in for the ckpt
// image; the app is the test's own Pebble workload.
type podSim struct {
	t       *testing.T
	objs    []kube.Object
	spec    corev1.PodSpec
	pod     kube.Pod
	volumes map[string]string // volume name -> directory
	// override replaces env values the cluster would differ in (the
	// storage URL pointed at the test's server); extra is added to every
	// ckpt container's env (the credentials a cloud identity would give).
	override map[string]string
	extra    []string
	ports    map[int32]int // container port -> the port the test gave it
	sidecars []*simProc
}

// simProc is a running container process.
type simProc struct {
	name   string
	cmd    *exec.Cmd
	out    *lockedBuffer
	exited chan struct{}
}

// mounts returns c's mount paths and their directories, longest first.
func (p *podSim) mounts(c corev1.Container) [][2]string {
	var m [][2]string
	for _, vm := range c.VolumeMounts {
		dir, ok := p.volumes[vm.Name]
		if !ok {
			p.t.Fatalf("container %s mounts volume %q the simulation has no directory for", c.Name, vm.Name)
		}
		m = append(m, [2]string{vm.MountPath, dir})
	}
	sort.Slice(m, func(i, j int) bool { return len(m[i][0]) > len(m[j][0]) })
	return m
}

// rewrite maps the container paths in s (a value, a --flag=value, or a
// comma-separated list of them) to the volumes' directories.
func rewrite(s string, mounts [][2]string) string {
	if k, v, ok := strings.Cut(s, "="); ok && strings.HasPrefix(k, "--") {
		return k + "=" + rewrite(v, mounts)
	}
	parts := strings.Split(s, ",")
	for i, part := range parts {
		for _, m := range mounts {
			if part == m[0] || strings.HasPrefix(part, m[0]+"/") {
				parts[i] = m[1] + strings.TrimPrefix(part, m[0])
				break
			}
		}
	}
	return strings.Join(parts, ",")
}

// env is container c's environment as the kubelet gives it, with the
// test's overrides, mount paths rewritten and metrics ports remapped.
func (p *podSim) env(c corev1.Container) []string {
	env, err := kube.Env(c, p.objs, p.pod)
	if err != nil {
		p.t.Fatal(err)
	}
	mounts := p.mounts(c)
	for i, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if o, ok := p.override[k]; ok {
			v = o
		}
		if k == "CKPT_METRICS_ADDR" {
			_, port, err := net.SplitHostPort(v)
			if err != nil {
				p.t.Fatalf("container %s: %s=%s: %v", c.Name, k, v, err)
			}
			v = "127.0.0.1:" + strconv.Itoa(p.port(port))
		}
		env[i] = k + "=" + rewrite(v, mounts)
	}
	return env
}

// port is the local port standing for container port s.
func (p *podSim) port(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		p.t.Fatalf("port %q: %v", s, err)
	}
	if got, ok := p.ports[int32(n)]; ok {
		return got
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		p.t.Fatal(err)
	}
	free := l.Addr().(*net.TCPAddr).Port
	l.Close()
	p.ports[int32(n)] = free
	return free
}

// start starts container c's command line as a process.
func (p *podSim) start(c corev1.Container) *simProc {
	p.t.Helper()
	env := p.env(c)
	line := kube.CommandLine(c, env)
	if len(line) == 0 || path.Base(line[0]) != "ckpt" {
		p.t.Fatalf("container %s runs %q: only ckpt containers run as processes", c.Name, line)
	}
	mounts := p.mounts(c)
	args := make([]string, len(line)-1)
	for i, a := range line[1:] {
		args[i] = rewrite(a, mounts)
	}
	sp := &simProc{name: c.Name, out: &lockedBuffer{}, exited: make(chan struct{})}
	sp.cmd = exec.Command(ckptBin, args...)
	sp.cmd.Env = append(append([]string{"PATH=/usr/bin:/bin", "HOSTNAME=" + p.pod.Name}, env...), p.extra...)
	sp.cmd.Stdout, sp.cmd.Stderr = sp.out, sp.out
	if c.StartupProbe == nil { // a run-to-completion container: keep stdout apart
		sp.cmd.Stderr = &lockedBuffer{}
	}
	if err := sp.cmd.Start(); err != nil {
		p.t.Fatalf("start container %s: %v", c.Name, err)
	}
	go func() { sp.cmd.Wait(); close(sp.exited) }()
	p.t.Cleanup(func() {
		select {
		case <-sp.exited:
		default:
			sp.cmd.Process.Kill()
			<-sp.exited
		}
	})
	return sp
}

// startInit runs the pod's init containers in order: a run-to-completion
// one must exit 0 (its stdout is returned by name), a native sidecar is
// started and must pass its startup probe before the next one starts.
func (p *podSim) startInit() map[string][]byte {
	p.t.Helper()
	outputs := map[string][]byte{}
	for _, c := range p.spec.InitContainers {
		sp := p.start(c)
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			p.awaitStartup(c, sp)
			p.sidecars = append(p.sidecars, sp)
			continue
		}
		select {
		case <-sp.exited:
		case <-time.After(2 * time.Minute):
			p.t.Fatalf("init container %s still running after 2m", c.Name)
		}
		if code := sp.cmd.ProcessState.ExitCode(); code != 0 {
			p.t.Fatalf("init container %s exited %d:\n%s", c.Name, code, sp.cmd.Stderr)
		}
		outputs[c.Name] = []byte(sp.out.String())
	}
	return outputs
}

// awaitStartup polls c's startup probe (an HTTP GET) as the kubelet does,
// until it answers 200 or its failure threshold is reached.
func (p *podSim) awaitStartup(c corev1.Container, sp *simProc) {
	p.t.Helper()
	pr := c.StartupProbe
	if pr == nil || pr.HTTPGet == nil {
		p.t.Fatalf("native sidecar %s has no HTTP startup probe: the app could start before it serves", c.Name)
	}
	port := pr.HTTPGet.Port.String()
	for _, cp := range c.Ports {
		if cp.Name == port {
			port = strconv.Itoa(int(cp.ContainerPort))
		}
	}
	url := fmt.Sprintf("http://127.0.0.1:%d%s", p.port(port), pr.HTTPGet.Path)
	period := time.Duration(max(pr.PeriodSeconds, 1)) * time.Second
	hc := &http.Client{Timeout: period}
	for i := int32(0); i < max(pr.FailureThreshold, 1); i++ {
		select {
		case <-sp.exited:
			p.t.Fatalf("sidecar %s exited before its startup probe passed:\n%s", c.Name, sp.out)
		default:
		}
		if resp, err := hc.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(period / 4) // probe faster than the kubelet: the outcome is the same
	}
	p.t.Fatalf("sidecar %s: startup probe %s never passed:\n%s", c.Name, url, sp.out)
}

// stopSidecars sends SIGTERM to the sidecars in reverse order of start,
// after the app has stopped, and requires each to exit 0 within the pod's
// termination grace period.
func (p *podSim) stopSidecars() {
	p.t.Helper()
	grace := 30 * time.Second
	if g := p.spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	for i := len(p.sidecars) - 1; i >= 0; i-- {
		sp := p.sidecars[i]
		sp.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-sp.exited:
		case <-time.After(grace):
			p.t.Fatalf("sidecar %s still running %v after SIGTERM: the kubelet would kill it", sp.name, grace)
		}
		if code := sp.cmd.ProcessState.ExitCode(); code != 0 {
			p.t.Fatalf("sidecar %s exited %d after SIGTERM, want 0:\n%s", sp.name, code, sp.out)
		}
		if strings.Contains(sp.out.String(), "unknown environment variable") {
			p.t.Errorf("sidecar %s warned of an unknown variable:\n%s", sp.name, sp.out)
		}
	}
	p.sidecars = nil
}

// scrape checks what the PodMonitor would scrape and the liveness probe
// would see: /metrics on the port the PodMonitor names reports the task's
// last checkpoint, and /healthz answers 200.
func (p *podSim) scrape(objs []kube.Object, task string, last uint64) {
	p.t.Helper()
	pm := kube.Find(objs, "PodMonitor", "ckpt")
	if pm == nil {
		p.t.Fatal("no PodMonitor ckpt")
	}
	ep := pm.Obj.(*kube.PodMonitor).Spec.PodMetricsEndpoints[0]
	var port string
	for _, c := range p.spec.InitContainers {
		for _, cp := range c.Ports {
			if cp.Name == ep.Port {
				port = strconv.Itoa(int(cp.ContainerPort))
			}
		}
	}
	if port == "" {
		p.t.Fatalf("the PodMonitor scrapes port %q, which no container names", ep.Port)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", p.port(port))
	get := func(path string) string {
		resp, err := http.Get(base + path)
		if err != nil {
			p.t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			p.t.Fatalf("GET %s: %s\n%s", path, resp.Status, b)
		}
		return string(b)
	}
	get("/healthz")
	want := `ckpt_checkpoint_last_id{`
	metrics := get(ep.Path)
	found := false
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, want) && strings.Contains(line, `task="`+task+`"`) && strings.HasSuffix(line, " "+strconv.FormatUint(last, 10)) {
			found = true
		}
	}
	if !found {
		p.t.Errorf("%s on the PodMonitor's port has no ckpt_checkpoint_last_id %d for task %s", ep.Path, last, task)
	}
}

// appEnv is the app container's environment, paths rewritten.
func (p *podSim) appEnv() func(string) string {
	if len(p.spec.Containers) != 1 {
		p.t.Fatalf("want one app container, the pod has %d", len(p.spec.Containers))
	}
	look := kube.EnvLookup(p.env(p.spec.Containers[0]))
	return func(k string) string {
		v, ok := look(k)
		if !ok {
			p.t.Fatalf("the app container has no %s", k)
		}
		return v
	}
}

// TestTheSidecarPodRunsInKubernetesOrderAndRestoresLocallyAndRemotely runs
// the S3 overlay's pod on versitygw: a first start (nothing to restore)
// and checkpoints; the pod deleted and recreated on the same volume with
// its store intact (nothing to restore, the app goes on), then with its
// store gone (a local restore: no byte from storage); then on a fresh
// volume on another node (a remote restore). Every store is verified key
// by key.
func TestTheSidecarPodRunsInKubernetesOrderAndRestoresLocallyAndRemotely(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the sidecar pod's containers on versitygw")
	}
	srv := testservers.S3(t)
	srv.CreateBucket(t, "ckpt-pods")
	runSidecarPod(t, "s3", srv.URL("ckpt-pods", "prod"), srv.Env())
}

// TestTheGCSOverlaysPodRunsOnTheGCSEmulator runs the same pod lifecycle
// with the GCS overlay on fake-gcs-server.
func TestTheGCSOverlaysPodRunsOnTheGCSEmulator(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the sidecar pod's containers on fake-gcs-server")
	}
	srv := testservers.GCS(t)
	srv.CreateBucket(t, "ckpt-pods")
	runSidecarPod(t, "gcs", srv.URL("ckpt-pods", "prod"), srv.Env())
}

// runSidecarPod renders deploy/overlays/<overlay> (with
// components/monitoring) and runs its pod's
// lifecycle with storage at storageURL (the overlay's scheme) and env
// standing for the pod's cloud identity.
func runSidecarPod(t *testing.T, overlay, storageURL string, env []string) {
	// The overlay with the optional monitoring component, whose PodMonitor
	// scrape checks.
	objs, err := kube.RenderWith(filepath.Join(deployDir(t), "overlays", overlay), filepath.Join(deployDir(t), "components", "monitoring"))
	if err != nil {
		t.Fatal(err)
	}
	sts := kube.Find(objs, "StatefulSet", "orders")
	if sts == nil {
		t.Fatalf("overlays/%s renders no StatefulSet orders", overlay)
	}
	spec := kube.PodSpec(*sts).Spec
	cm := kube.Find(objs, "ConfigMap", spec.InitContainers[0].EnvFrom[0].ConfigMapRef.Name)
	if cm == nil || !strings.HasPrefix(cm.Obj.(*corev1.ConfigMap).Data["CKPT_STORAGE"], storageURL[:5]) {
		t.Fatalf("overlays/%s does not store to %s...", overlay, storageURL[:5])
	}
	newPod := func(node, dataDir string) *podSim {
		return &podSim{t: t, objs: objs, spec: spec,
			pod:      kube.Pod{Name: "orders-0", Namespace: "default", NodeName: node, IP: "10.0.0.1", ServiceAccount: spec.ServiceAccountName},
			volumes:  map[string]string{"data": dataDir, "ckpt-socket": shortDir(t), "ckpt-tmp": t.TempDir()},
			override: map[string]string{"CKPT_STORAGE": storageURL},
			extra:    env, ports: map[int32]int{}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	opts := workload.Options{Seed: 7, StateBytes: 4 << 20, ValueSize: 512}
	restored := func(outputs map[string][]byte) restoreResult {
		t.Helper()
		var rr restoreResult
		if err := json.Unmarshal(outputs["ckpt-restore"], &rr); err != nil {
			t.Fatalf("ckpt-restore printed no JSON: %v\n%s", err, outputs["ckpt-restore"])
		}
		return rr
	}
	// checkpoints runs rounds of the app and checkpoints first..last through
	// the socket the manifest gives it, and returns the state of the last.
	checkpoints := func(p *podSim, w *workload.Workload, first, last uint64) *workload.Expected {
		t.Helper()
		env := p.appEnv()
		c, err := client.Dial(ctx, env("CKPT_SOCKET"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var exp *workload.Expected
		for n := first; n <= last; n++ {
			if _, err := w.Round(ctx); err != nil {
				t.Fatal(err)
			}
			exp = w.Snapshot()
			pend, err := ckptpebble.Checkpoint(ctx, c, w.DB(), env("STORE_DIR"), env("CKPT_TASK"), n)
			if err != nil {
				t.Fatalf("checkpoint %d: %v", n, err)
			}
			ev, err := pend.Wait(ctx)
			if err != nil {
				t.Fatalf("checkpoint %d: %v", n, err)
			}
			t.Logf("checkpoint %d: checkpoint_size %d, full_size %d, %d files uploaded, %d reused", n, ev.CheckpointSize, ev.FullSize, ev.FilesUploaded, ev.FilesReused)
		}
		return exp
	}

	// 1. First start on a fresh volume: nothing to restore.
	vol := t.TempDir()
	p := newPod("node-a", vol)
	if rr := restored(p.startInit()); rr.Restored {
		t.Fatalf("first start restored %+v, want nothing to restore", rr)
	}
	storeDir := p.appEnv()("STORE_DIR")
	w, err := workload.Open(storeDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	checkpoints(p, w, 1, 3)
	p.scrape(objs, "orders-0", 3)
	if _, err := w.Round(ctx); err != nil { // written after the last checkpoint
		t.Fatal(err)
	}
	latest := w.Snapshot()
	// Pod deleted: the app stops first, then the sidecar.
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	p.stopSidecars()

	// 2. Recreated on the same volume, the store intact: the restore does
	// nothing and the app goes on with all it wrote.
	p = newPod("node-a", vol)
	if rr := restored(p.startInit()); rr.Restored {
		t.Fatalf("the store survived, yet the restore ran: %+v", rr)
	}
	if w, err = workload.Resume(ctx, storeDir, opts, latest); err != nil {
		t.Fatalf("the app's own store after a pod restart: %v", err)
	}
	exp4 := checkpoints(p, w, 4, 4)
	w.Close()
	p.stopSidecars()

	// 3. Recreated on the same volume, the store gone (lost, or discarded
	// by the app): a local restore from the agent's copies on the volume.
	if err := os.RemoveAll(storeDir); err != nil {
		t.Fatal(err)
	}
	p = newPod("node-a", vol)
	rr := restored(p.startInit())
	t.Logf("local restore: %+v", rr)
	if !rr.Restored || rr.Checkpoint != 4 || rr.BytesRemote != 0 || rr.BytesLocal != rr.Bytes || rr.Bytes == 0 {
		t.Fatalf("restore on the same volume: %+v, want checkpoint 4 from the local copy alone (bytes_remote 0)", rr)
	}
	if w, err = workload.Resume(ctx, storeDir, opts, exp4); err != nil {
		t.Fatalf("the locally restored store: %v", err)
	}
	exp5 := checkpoints(p, w, 5, 5)
	w.Close()
	p.stopSidecars()

	// 4. Recreated on a fresh volume on another node: a remote restore,
	// and the agent there takes the task over.
	p = newPod("node-b", t.TempDir())
	rr = restored(p.startInit())
	t.Logf("remote restore: %+v", rr)
	if !rr.Restored || rr.Checkpoint != 5 || rr.BytesLocal != 0 || rr.BytesRemote != rr.Bytes || rr.Bytes == 0 {
		t.Fatalf("restore on a fresh volume: %+v, want checkpoint 5 from storage", rr)
	}
	storeDir = p.appEnv()("STORE_DIR")
	if w, err = workload.Resume(ctx, storeDir, opts, exp5); err != nil {
		t.Fatalf("the remotely restored store: %v", err)
	}
	checkpoints(p, w, 6, 6)
	w.Close()
	p.stopSidecars()
}
