package e2e

import (
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/lab/kube"
	corev1 "k8s.io/api/core/v1"
)

// deployDir is the repository's deploy/ directory.
func deployDir(t *testing.T) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy")
}

// renderAll renders every kustomization under deploy/, by directory.
func renderAll(t *testing.T) map[string][]kube.Object {
	t.Helper()
	dirs, err := kube.Kustomizations(deployDir(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 3 {
		t.Fatalf("kustomizations under deploy/: %q, want the sidecar base and the s3 and gcs overlays at least", dirs)
	}
	out := map[string][]kube.Object{}
	for _, d := range dirs {
		objs, err := kube.Render(d)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(deployDir(t), d)
		out[rel] = objs
	}
	return out
}

// TestEveryManifestUnderDeployDecodesStrictly: every YAML document under
// deploy/ (resources and patches alike) and everything each kustomization
// renders decodes into its k8s.io/api type with no unknown field.
func TestEveryManifestUnderDeployDecodesStrictly(t *testing.T) {
	files, other, err := kube.Files(deployDir(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range other {
		t.Logf("not a Kubernetes object (no apiVersion, no kind), not decoded: %s", o)
	}
	kinds := map[string]bool{}
	for _, o := range files {
		kinds[o.Kind] = true
	}
	for _, k := range []string{"StatefulSet", "ServiceAccount", "PodMonitor"} {
		if !kinds[k] {
			t.Errorf("no %s under deploy/", k)
		}
	}
	for dir, objs := range renderAll(t) {
		if len(objs) == 0 {
			t.Errorf("%s renders nothing", dir)
		}
	}
}

// ckptContainer is a container that runs the ckpt binary.
func ckptContainer(c corev1.Container) bool {
	return len(c.Command) > 0 && path.Base(c.Command[0]) == "ckpt"
}

// setting is an agent setting as the container gives it: --name=V or
// --name V in its args, else CKPT_<NAME> in its env, else def.
func setting(c corev1.Container, name, def string) string {
	for i, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
		if a == "--"+name && i+1 < len(c.Args) {
			return c.Args[i+1]
		}
	}
	env := "CKPT_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	for _, e := range c.Env {
		if e.Name == env {
			return e.Value
		}
	}
	return def
}

// deployedPod is a pod template of a manifest under deploy/.
type deployedPod struct {
	where string
	spec  corev1.PodSpec
}

// podsUnderDeploy returns the pod templates of every rendered
// kustomization and of every plain manifest file in a directory that is
// no kustomization (applied with kubectl apply -f as it is).
func podsUnderDeploy(t *testing.T) []deployedPod {
	t.Helper()
	var pods []deployedPod
	for dir, objs := range renderAll(t) {
		for _, o := range objs {
			if tmpl := kube.PodSpec(o); tmpl != nil {
				pods = append(pods, deployedPod{fmt.Sprintf("%s: %s %s", dir, o.Kind, o.Name), tmpl.Spec})
			}
		}
	}
	files, _, err := kube.Files(deployDir(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range files {
		if _, err := os.Stat(filepath.Join(filepath.Dir(o.Path), "kustomization.yaml")); err == nil {
			continue // rendered above
		}
		if tmpl := kube.PodSpec(o); tmpl != nil {
			pods = append(pods, deployedPod{fmt.Sprintf("%s: %s %s", o.Source, o.Kind, o.Name), tmpl.Spec})
		}
	}
	return pods
}

// TestPodsRunCkptSafelyAndInKubernetesOrder checks every pod template
// under deploy/ that runs a ckpt agent: the agent's locked-down
// securityContext, its probes on its metrics port, a termination grace
// longer than its shutdown grace. Sidecar pods (the agent among the init
// containers) also need every container non-root with no capability, and
// the order restore, native sidecar agent, app, with the task named by the
// pod's name through the downward API. (A node agent may run as uid 0
// with the few capabilities it documents: it reads and hard-links other
// users' files.)
func TestPodsRunCkptSafelyAndInKubernetesOrder(t *testing.T) {
	checkedSidecars := 0
	for _, p := range podsUnderDeploy(t) {
		where, spec := p.where, p.spec
		all := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
		agentAt := slices.IndexFunc(all, func(c corev1.Container) bool {
			return ckptContainer(c) && len(c.Args) > 0 && c.Args[0] == "agent"
		})
		if agentAt < 0 {
			continue
		}
		agent := all[agentAt]
		sidecar := agentAt < len(spec.InitContainers)
		checkLockedDown(t, where, spec, agent)
		checkProbes(t, where, agent, sidecar)
		grace, err := time.ParseDuration(setting(agent, "shutdown-grace", "30s"))
		if err != nil {
			t.Errorf("%s: --shutdown-grace: %v", where, err)
		}
		if spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second <= grace {
			t.Errorf("%s: terminationGracePeriodSeconds must exceed the agent's --shutdown-grace %v, or the kubelet kills in-flight uploads", where, grace)
		}
		if sidecar {
			checkPodSecurity(t, where, spec)
			checkSidecarOrder(t, where, spec)
			checkedSidecars++
		}
	}
	if checkedSidecars < 3 {
		t.Errorf("checked %d sidecar pods, want the base's and both overlays'", checkedSidecars)
	}
}

// checkLockedDown holds a ckpt container to no privilege escalation, a
// read-only root filesystem with a writable /tmp, every capability dropped
// (a few may be added back), and seccomp RuntimeDefault.
func checkLockedDown(t *testing.T, where string, spec corev1.PodSpec, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || sc.Privileged != nil && *sc.Privileged {
		t.Errorf("%s: container %s needs allowPrivilegeEscalation false, readOnlyRootFilesystem, capabilities drop ALL", where, c.Name)
	}
	seccomp := sc != nil && sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault ||
		spec.SecurityContext != nil && spec.SecurityContext.SeccompProfile != nil && spec.SecurityContext.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault
	if !seccomp {
		t.Errorf("%s: container %s needs seccomp RuntimeDefault", where, c.Name)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/tmp" && !m.ReadOnly }) {
		t.Errorf("%s: ckpt container %s needs a writable /tmp: its root filesystem is read-only, and plugins and drills use the temp dir", where, c.Name)
	}
}

func checkPodSecurity(t *testing.T, where string, spec corev1.PodSpec) {
	t.Helper()
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		psc.RunAsGroup == nil || psc.FSGroup == nil || *psc.FSGroup != *psc.RunAsGroup ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: the pod needs runAsNonRoot, a fixed non-zero runAsUser, runAsGroup, an fsGroup equal to it (the app and the agent share the volume and the socket) and seccomp RuntimeDefault", where)
	}
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		sc := c.SecurityContext
		ok := sc != nil && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation &&
			sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem &&
			sc.Capabilities != nil && slices.Contains(sc.Capabilities.Drop, "ALL") && len(sc.Capabilities.Add) == 0 &&
			(sc.Privileged == nil || !*sc.Privileged) && (sc.RunAsUser == nil || *sc.RunAsUser != 0)
		if !ok {
			t.Errorf("%s: container %s needs allowPrivilegeEscalation false, readOnlyRootFilesystem, capabilities drop ALL and none added, not root", where, c.Name)
		}
		if ckptContainer(c) && !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/tmp" && !m.ReadOnly }) {
			t.Errorf("%s: ckpt container %s needs a writable /tmp: its root filesystem is read-only, and plugins and drills use the temp dir", where, c.Name)
		}
	}
}

// checkProbes requires readiness (/readyz) and liveness (/healthz) probes
// on the agent's metrics port, and a startup probe (/readyz) on a native
// sidecar, which gates the app's start.
func checkProbes(t *testing.T, where string, agent corev1.Container, sidecar bool) {
	t.Helper()
	_, port, err := net.SplitHostPort(setting(agent, "metrics-addr", ""))
	if err != nil {
		t.Errorf("%s: the agent serves no --metrics-addr for its probes: %v", where, err)
		return
	}
	var portName string
	for _, p := range agent.Ports {
		if fmt.Sprint(p.ContainerPort) == port {
			portName = p.Name
		}
	}
	if portName == "" {
		t.Errorf("%s: no container port of %s is the metrics port %s", where, agent.Name, port)
	}
	for _, pr := range []struct {
		name string
		p    *corev1.Probe
		path string
	}{{"startupProbe", agent.StartupProbe, "/readyz"}, {"readinessProbe", agent.ReadinessProbe, "/readyz"}, {"livenessProbe", agent.LivenessProbe, "/healthz"}} {
		if pr.p == nil && pr.name == "startupProbe" && !sidecar {
			continue
		}
		if pr.p == nil || pr.p.HTTPGet == nil {
			t.Errorf("%s: %s has no %s over HTTP", where, agent.Name, pr.name)
			continue
		}
		g := pr.p.HTTPGet
		if g.Path != pr.path || (g.Port.String() != portName && g.Port.String() != port) {
			t.Errorf("%s: %s %s gets %s on port %s, want %s on the metrics port (%s, %s)", where, agent.Name, pr.name, g.Path, g.Port.String(), pr.path, portName, port)
		}
	}
}

func checkSidecarOrder(t *testing.T, where string, spec corev1.PodSpec) {
	t.Helper()
	var names []string
	restoreAt, agentAt := -1, -1
	for i, c := range spec.InitContainers {
		names = append(names, c.Name)
		if !ckptContainer(c) || len(c.Args) == 0 {
			continue
		}
		switch c.Args[0] {
		case "restore":
			restoreAt = i
			if c.RestartPolicy != nil {
				t.Errorf("%s: the restore init container must run to completion, not as a sidecar", where)
			}
			if setting(c, "task", "") != "$(POD_NAME)" || !fieldRefIs(c, "POD_NAME", "metadata.name") {
				t.Errorf("%s: the restore's --task must be the pod's name through the downward API", where)
			}
		case "agent":
			agentAt = i
			if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
				t.Errorf("%s: the agent must be a native sidecar (an init container with restartPolicy: Always)", where)
			}
		}
	}
	if restoreAt < 0 || agentAt < 0 || restoreAt > agentAt {
		t.Errorf("%s: init containers %q: want ckpt restore, then the ckpt agent", where, names)
	}
	for _, c := range spec.Containers {
		if ckptContainer(c) {
			t.Errorf("%s: ckpt container %s among the app's containers: it would start with the app and get SIGTERM with it", where, c.Name)
		}
		if !fieldRefIs(c, "CKPT_TASK", "metadata.name") {
			t.Errorf("%s: app %s needs CKPT_TASK from the pod's name", where, c.Name)
		}
	}
}

func fieldRefIs(c corev1.Container, env, field string) bool {
	for _, e := range c.Env {
		if e.Name == env {
			return e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == field
		}
	}
	return false
}

// TestTheOverlaysNameACloudIdentityAndThePodMonitorScrapesTheAgent: the
// S3 overlay annotates the pods' service account for IRSA and the GCS one
// for Workload Identity, each points the storage at its cloud, and renders
// no Prometheus Operator object; with components/monitoring added, the
// PodMonitor selects the pods and scrapes a named port of the agent.
func TestTheOverlaysNameACloudIdentityAndThePodMonitorScrapesTheAgent(t *testing.T) {
	rendered := renderAll(t)
	for _, tc := range []struct{ dir, annotation, scheme string }{
		{"overlays/s3", "eks.amazonaws.com/role-arn", "s3://"},
		{"overlays/gcs", "iam.gke.io/gcp-service-account", "gs://"},
	} {
		objs := rendered[tc.dir]
		sts := kube.Find(objs, "StatefulSet", "orders")
		if sts == nil {
			t.Fatalf("%s renders no StatefulSet orders", tc.dir)
		}
		tmpl := kube.PodSpec(*sts)
		sa := kube.Find(objs, "ServiceAccount", tmpl.Spec.ServiceAccountName)
		if sa == nil || sa.Obj.(*corev1.ServiceAccount).Annotations[tc.annotation] == "" {
			t.Errorf("%s: the pods' service account %q lacks %s", tc.dir, tmpl.Spec.ServiceAccountName, tc.annotation)
		}
		for _, c := range tmpl.Spec.InitContainers {
			env, err := kube.Env(c, objs, kube.Pod{Name: "orders-0", NodeName: "node-a"})
			if err != nil {
				t.Fatal(err)
			}
			if st, _ := kube.EnvLookup(env)("CKPT_STORAGE"); !strings.HasPrefix(st, tc.scheme) {
				t.Errorf("%s: container %s stores to %q, want %s", tc.dir, c.Name, st, tc.scheme)
			}
		}
		if kube.Find(objs, "PodMonitor", "ckpt") != nil {
			t.Errorf("%s renders a PodMonitor: it needs the Prometheus Operator, keep it in components/monitoring", tc.dir)
		}
		// With the optional monitoring component.
		withMon, err := kube.RenderWith(filepath.Join(deployDir(t), tc.dir), filepath.Join(deployDir(t), "components", "monitoring"))
		if err != nil {
			t.Fatal(err)
		}
		pm := kube.Find(withMon, "PodMonitor", "ckpt")
		if pm == nil {
			t.Fatalf("%s with components/monitoring renders no PodMonitor", tc.dir)
		}
		spec := pm.Obj.(*kube.PodMonitor).Spec
		for k, v := range spec.Selector.MatchLabels {
			if tmpl.Labels[k] != v {
				t.Errorf("%s: the PodMonitor selects %s=%s, which the pods do not carry", tc.dir, k, v)
			}
		}
		var ports []string
		for _, c := range tmpl.Spec.InitContainers {
			for _, p := range c.Ports {
				ports = append(ports, p.Name)
			}
		}
		if len(spec.PodMetricsEndpoints) == 0 || !slices.Contains(ports, spec.PodMetricsEndpoints[0].Port) ||
			spec.PodMetricsEndpoints[0].Path != "/metrics" {
			t.Errorf("%s: the PodMonitor scrapes %+v, want /metrics on one of %q", tc.dir, spec.PodMetricsEndpoints, ports)
		}
	}
}
