package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/lab/kube"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/storage/metered"
	"github.com/ckpt-io/ckpt/telemetry"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
)

// plainStatefulSet is a stateful app as it would be without ckpt, and a
// user's kustomization adding the ckpt-sidecar component to it.
const plainStatefulSet = `apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: kv
spec:
  serviceName: kv
  replicas: 2
  selector:
    matchLabels: {app: kv}
  template:
    metadata:
      labels: {app: kv}
    spec:
      securityContext: {runAsNonRoot: true, runAsUser: 1000, runAsGroup: 1000, fsGroup: 1000}
      containers:
        - name: server
          image: kv:1.0
          env:
            - {name: KV_DIR, value: /data/store}
          volumeMounts:
            - {name: data, mountPath: /data}
        - name: exporter
          image: kv-exporter:1.0
  volumeClaimTemplates:
    - metadata: {name: data}
      spec:
        accessModes: [ReadWriteOnce]
        resources: {requests: {storage: 10Gi}}
`

// renderPlainWithComponent renders plainStatefulSet with the ckpt-sidecar
// component from a kustomization of a user's (extra is added to it).
func renderPlainWithComponent(t *testing.T, extra string) []kube.Object {
	t.Helper()
	dir := t.TempDir()
	comp, err := filepath.Rel(dir, filepath.Join(deployDir(t), "components", "ckpt-sidecar"))
	if err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [statefulset.yaml]\ncomponents: [" + comp + "]\n" +
		"configMapGenerator:\n  - name: ckpt\n    literals: [CKPT_STORAGE=s3://b/p, CKPT_JOB=kv]\n" + extra
	for name, content := range map[string]string{"kustomization.yaml": k, "statefulset.yaml": plainStatefulSet} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	objs, err := kube.Render(dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestTheSidecarComponentAddsCkptToAPlainStatefulSet: the ckpt-sidecar
// component, applied to a StatefulSet that knows nothing of ckpt, renders
// the restore init container and the agent sidecar in that order, their
// volumes beside the app's, the socket and task name in the app's (first)
// container and nothing in the others, the app's own settings kept, the
// agent's identity from the pod's name, GOMEMLIMIT from the container's
// memory limit, a service account that mounts no token, and images that
// the user's images: entry (kustomize edit set image) changes.
func TestTheSidecarComponentAddsCkptToAPlainStatefulSet(t *testing.T) {
	objs := renderPlainWithComponent(t, "images:\n  - {name: ckpt, newName: myregistry/ckpt, newTag: v1.2.3}\n")
	sts := kube.Find(objs, "StatefulSet", "kv")
	if sts == nil {
		t.Fatal("no StatefulSet kv rendered")
	}
	spec := kube.PodSpec(*sts).Spec
	var inits []string
	for _, c := range spec.InitContainers {
		inits = append(inits, c.Name)
		if c.Image != "myregistry/ckpt:v1.2.3" {
			t.Errorf("init container %s: image %q, want the user's myregistry/ckpt:v1.2.3", c.Name, c.Image)
		}
	}
	if !slices.Equal(inits, []string{"ckpt-restore", "ckpt-agent"}) {
		t.Fatalf("init containers %q, want ckpt-restore then ckpt-agent", inits)
	}
	first := spec
	first.Containers = spec.Containers[:1] // the app; the exporter talks to no agent
	checkSidecarOrder(t, "component on kv", first)
	checkLockedDown(t, "component on kv", spec, spec.InitContainers[1])
	checkProbes(t, "component on kv", spec.InitContainers[1], true)
	var vols []string
	for _, v := range spec.Volumes {
		vols = append(vols, v.Name)
	}
	sort.Strings(vols)
	if !slices.Equal(vols, []string{"ckpt-socket", "ckpt-tmp"}) {
		t.Errorf("volumes %q, want the component's ckpt-socket and ckpt-tmp (data stays a volumeClaimTemplate)", vols)
	}
	for _, c := range spec.InitContainers {
		for _, m := range c.VolumeMounts {
			if m.Name != "data" && !slices.Contains(vols, m.Name) {
				t.Errorf("%s mounts %s, which the pod does not have", c.Name, m.Name)
			}
		}
	}
	app := spec.Containers[0]
	if app.Image != "kv:1.0" || app.Env[0].Name != "KV_DIR" || app.VolumeMounts[0].Name != "data" {
		t.Errorf("the app's own settings were not kept: %+v", app)
	}
	if !slices.ContainsFunc(app.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "ckpt-socket" }) {
		t.Error("the app does not mount the socket's directory")
	}
	if len(spec.Containers[1].Env) != 0 || len(spec.Containers[1].VolumeMounts) != 0 {
		t.Errorf("the second container was patched too: %+v", spec.Containers[1])
	}
	if spec.SecurityContext.RunAsUser == nil || *spec.SecurityContext.RunAsUser != 1000 || *spec.SecurityContext.FSGroup != 65532 {
		t.Errorf("pod securityContext %+v: want the app's runAsUser kept and the ckpt group as fsGroup", spec.SecurityContext)
	}
	agent := spec.InitContainers[1]
	if !fieldRefIs(agent, "CKPT_NODE", "metadata.name") {
		t.Error("the sidecar agent's identity (CKPT_NODE) is not the pod's name")
	}
	env, err := kube.Env(agent, objs, kube.Pod{Name: "kv-0", NodeName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	look := kube.EnvLookup(env)
	if v, _ := look("GOMEMLIMIT"); v != "536870912" {
		t.Errorf("GOMEMLIMIT %q, want the agent's 512Mi memory limit in bytes", v)
	}
	if v, _ := look("CKPT_NODE"); v != "kv-0" {
		t.Errorf("CKPT_NODE %q, want the pod's name", v)
	}
	if v, _ := look("CKPT_JOB"); v != "kv" {
		t.Errorf("CKPT_JOB %q, want the user's ConfigMap's", v)
	}
	if v, ok := look("OTEL_SERVICE_NAME"); !ok || v == "" {
		t.Error("no OTEL_SERVICE_NAME for the agent")
	}
	sa := kube.Find(objs, "ServiceAccount", spec.ServiceAccountName)
	if sa == nil || sa.Obj.(*corev1.ServiceAccount).AutomountServiceAccountToken == nil || *sa.Obj.(*corev1.ServiceAccount).AutomountServiceAccountToken ||
		spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("service account %q: want it rendered, and no token mounted (on it and on the pods)", spec.ServiceAccountName)
	}
}

// TestProbesHaveTimeoutsAndStorageGatesNoReadiness: every probe of every
// ckpt agent under deploy/ states its timeout, and none probes the storage
// health endpoint: an agent whose storage is away still serves its socket.
func TestProbesHaveTimeoutsAndStorageGatesNoReadiness(t *testing.T) {
	checked := 0
	for _, p := range podsUnderDeploy(t) {
		for _, c := range append(append([]corev1.Container{}, p.spec.InitContainers...), p.spec.Containers...) {
			if !ckptContainer(c) || len(c.Args) == 0 || c.Args[0] != "agent" {
				continue
			}
			for name, pr := range map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
				if pr == nil {
					continue
				}
				checked++
				if pr.TimeoutSeconds == 0 {
					t.Errorf("%s: %s %s states no timeoutSeconds", p.where, c.Name, name)
				}
				if pr.HTTPGet != nil && strings.HasPrefix(pr.HTTPGet.Path, "/healthz/storage") {
					t.Errorf("%s: %s %s probes storage health: storage being away must not take the socket out", p.where, c.Name, name)
				}
			}
		}
	}
	if checked < 8 {
		t.Errorf("checked %d probes, want the sidecars' and the node agent's", checked)
	}
}

// TestTheExampleBaseHasAPodDisruptionBudget: the sidecar example limits
// voluntary disruptions to one of its pods at a time.
func TestTheExampleBaseHasAPodDisruptionBudget(t *testing.T) {
	objs := renderAll(t)["sidecar"]
	pdb := kube.Find(objs, "PodDisruptionBudget", "orders")
	sts := kube.Find(objs, "StatefulSet", "orders")
	if pdb == nil || sts == nil {
		t.Fatal("deploy/sidecar renders no PodDisruptionBudget orders or no StatefulSet orders")
	}
	sel := pdb.Obj.(*policyv1.PodDisruptionBudget).Spec.Selector.MatchLabels
	labels := sts.Obj.(*appsv1.StatefulSet).Spec.Template.Labels
	for k, v := range sel {
		if labels[k] != v {
			t.Errorf("the budget selects %s=%s, which the pods do not carry", k, v)
		}
	}
	if len(sel) == 0 {
		t.Error("the budget selects nothing")
	}
}

// TestTheNodeAgentRendersInItsNamespaceAndRollsOnTenantChanges: the node
// agent's kustomization renders its Namespace, puts every namespaced
// object in it, gives the DaemonSet a PriorityClass object of its own (not
// a system-* class, which GKE admits only in kube-system), tolerations, a
// token-less service account, and mounts the generated tenants ConfigMap,
// whose name changes with tenants.yaml: editing the file changes the pod
// template, so the agents roll out and read it.
func TestTheNodeAgentRendersInItsNamespaceAndRollsOnTenantChanges(t *testing.T) {
	src := filepath.Join(deployDir(t), "node-agent")
	objs, err := kube.Render(src)
	if err != nil {
		t.Fatal(err)
	}
	ns := ""
	for _, o := range objs {
		if o.Kind == "Namespace" {
			ns = o.Name
		}
	}
	if ns == "" {
		t.Fatal("no Namespace rendered")
	}
	var ds *appsv1.DaemonSet
	for _, o := range objs {
		m := map[string]string{}
		switch v := o.Obj.(type) {
		case *appsv1.DaemonSet:
			ds = v
			m["ns"] = v.Namespace
		case *corev1.ServiceAccount:
			m["ns"] = v.Namespace
		case *corev1.ConfigMap:
			m["ns"] = v.Namespace
		default:
			continue
		}
		if m["ns"] != ns {
			t.Errorf("%s %s in namespace %q, want %q", o.Kind, o.Name, m["ns"], ns)
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet rendered")
	}
	spec := ds.Spec.Template.Spec
	pc := kube.Find(objs, "PriorityClass", spec.PriorityClassName)
	if pc == nil || strings.HasPrefix(spec.PriorityClassName, "system-") || pc.Obj.(*schedulingv1.PriorityClass).Value >= 1000000000 {
		t.Errorf("priorityClassName %q: want a PriorityClass rendered beside it, not system-*, with a user value (< 1e9)", spec.PriorityClassName)
	}
	if len(spec.Tolerations) == 0 {
		t.Error("the DaemonSet tolerates no taint: tainted nodes get no agent")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the node agent's pods mount a service account token")
	}
	tenantsCM := func(spec corev1.PodSpec) string {
		for _, v := range spec.Volumes {
			if v.ConfigMap != nil {
				return v.ConfigMap.Name
			}
		}
		return ""
	}
	before := tenantsCM(spec)
	if before == "" || kube.Find(objs, "ConfigMap", before) == nil {
		t.Fatalf("the DaemonSet mounts ConfigMap %q, which is not rendered", before)
	}
	if c := spec.Containers[0]; c.Image != "ckpt:latest" {
		t.Errorf("agent image %q, want ckpt:latest from the kustomization's images: (kustomize edit set image)", c.Image)
	}
	env, err := kube.Env(spec.Containers[0], objs, kube.Pod{Name: "ckpt-node-agent-x", NodeName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := kube.EnvLookup(env)("GOMEMLIMIT"); v != "1073741824" {
		t.Errorf("GOMEMLIMIT %q, want the 1Gi limit in bytes", v)
	}

	// The same kustomization with one tenant changed.
	edited := t.TempDir()
	if err := os.CopyFS(edited, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	tenants, err := os.ReadFile(filepath.Join(edited, "tenants.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(edited, "tenants.yaml"), bytes.Replace(tenants, []byte("retain: 3"), []byte("retain: 4"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	objs2, err := kube.Render(edited)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs2 {
		if v, ok := o.Obj.(*appsv1.DaemonSet); ok {
			if after := tenantsCM(v.Spec.Template.Spec); after == before {
				t.Errorf("tenants.yaml changed, the DaemonSet's pod template did not (ConfigMap %q): the agents keep the old tenants", after)
			}
		}
	}
}

// exportedMetricNames returns the Prometheus names the agent's telemetry
// exports (telemetry and the metered storage wrapper, each instrument
// recorded once), with a histogram's _bucket, _sum and _count series.
func exportedMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	ctx := context.Background()
	tel, err := telemetry.New(ctx, telemetry.Options{Job: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(ctx)
	tel.CheckpointStarted(ctx, "t")
	tel.CheckpointEnded(ctx, telemetry.CheckpointRecord{Task: "t", Checkpoint: 1, Status: "completed", CheckpointSize: 1, FullSize: 1, Sync: time.Millisecond})
	tel.GCEnded(ctx, 1, 1, 1)
	tel.ReuseReplaced(ctx, "missing")
	tel.ScrubObject(ctx, "ok", 1)
	tel.RestoreEnded(ctx, telemetry.RestoreRecord{Task: "t", OK: true})
	tel.RequestEnded(ctx, "checkpoint", "ok")
	tel.DrillEnded(ctx, telemetry.DrillRecord{Task: "t", Verified: true, Duration: time.Second})
	tel.StandbyRefreshed(ctx, telemetry.StandbyRecord{Task: "t", Failover: time.Second})
	tel.StorageChecked(ctx, nil)
	tel.GCRun(ctx, "failed")
	tel.TaskBlocked(ctx, "t", "fenced", "another agent owns the task")
	fs, err := file.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := metered.New(fs, "file").Put(ctx, "k", bytes.NewReader([]byte("x")), 1); err != nil {
		t.Fatal(err)
	}
	fams, err := tel.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range fams {
		names[f.GetName()] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+s] = true
			}
		}
	}
	if len(names) < 20 {
		t.Fatalf("the telemetry exported only %v", names)
	}
	return names
}

var (
	promStrings   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promMatchers  = regexp.MustCompile(`\{[^}]*\}`)
	promRanges    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	promIdent     = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promLabelName = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)`)
	promKeywords  = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true, "start": true, "end": true}
)

// promQLNames returns the metric names and the label names a PromQL
// expression uses: label names from its matchers and its by, without, on
// and ignoring lists; metric names from what is left, every identifier
// that is no function (followed by "("), keyword or number.
func promQLNames(expr string) (metrics, labels []string) {
	s := promStrings.ReplaceAllString(expr, `""`)
	for _, m := range promMatchers.FindAllString(s, -1) {
		for _, l := range promLabelName.FindAllStringSubmatch(m, -1) {
			labels = append(labels, l[1])
		}
	}
	s = promMatchers.ReplaceAllString(s, " ")
	s = promRanges.ReplaceAllString(s, " ")
	for _, g := range promGrouping.FindAllStringSubmatch(s, -1) {
		for _, l := range strings.Split(g[2], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
	}
	s = promGrouping.ReplaceAllString(s, " ")
	for _, loc := range promIdent.FindAllStringIndex(s, -1) {
		id := s[loc[0]:loc[1]]
		if loc[0] > 0 && (s[loc[0]-1] >= '0' && s[loc[0]-1] <= '9' || s[loc[0]-1] == '.') {
			continue // a number's exponent or unit (1e3)
		}
		if promKeywords[strings.ToLower(id)] || strings.HasPrefix(strings.TrimLeft(s[loc[1]:], " \t\n"), "(") {
			continue
		}
		metrics = append(metrics, id)
	}
	return metrics, labels
}

// checkRules returns what is wrong with rules: an expression naming a
// metric that is not in known, a label "job" (Prometheus's scrape job)
// where ckpt's job label ckpt_job is meant, in expressions or templates.
func checkRules(rules []kube.Rule, known map[string]bool) []string {
	var errs []string
	jobTemplate := regexp.MustCompile(`\$labels\.job\b`)
	for _, r := range rules {
		name := r.Alert + r.Record
		metrics, labels := promQLNames(r.Expr)
		if len(metrics) == 0 {
			errs = append(errs, name+": its expression names no metric")
		}
		for _, m := range metrics {
			if !known[m] {
				errs = append(errs, name+": metric "+m+" is not one the agent exports")
			}
		}
		for _, l := range labels {
			if l == "job" {
				errs = append(errs, name+": label job is the scrape job; ckpt's job label is ckpt_job")
			}
		}
		for k, v := range r.Annotations {
			if jobTemplate.MatchString(v) {
				errs = append(errs, name+": annotation "+k+" uses $labels.job; ckpt's job label is ckpt_job")
			}
		}
	}
	return errs
}

// TestThePrometheusRulesNameOnlyMetricsTheAgentExports decodes the
// monitoring component's PrometheusRule strictly and checks each alert's
// expression: every metric it names is one the agent's telemetry exports, and it groups and matches by
// ckpt_job, never job. The check itself is shown to catch a misspelt
// metric and a job label.
func TestThePrometheusRulesNameOnlyMetricsTheAgentExports(t *testing.T) {
	known := exportedMetricNames(t)
	for _, m := range []string{"ckpt_storage_up", "ckpt_checkpoint_last_success_timestamp_seconds", "ckpt_gc_runs_total", "ckpt_checkpoint_blocked"} {
		if !known[m] {
			t.Errorf("the agent does not export %s, which the public interface promises", m)
		}
	}

	for _, tc := range []struct {
		name string
		rule kube.Rule
	}{
		{"a misspelt metric", kube.Rule{Alert: "X", Expr: `time() - max by (ckpt_job) (ckpt_checkpoint_last_sucess_timestamp_seconds) > 900`}},
		{"a metric with a suffix it does not have", kube.Rule{Alert: "X", Expr: `ckpt_drill_last_verified == 0`}},
		{"grouping by job", kube.Rule{Alert: "X", Expr: `sum by (job, task) (rate(ckpt_checkpoints_total[5m])) > 0`}},
		{"matching on job", kube.Rule{Alert: "X", Expr: `ckpt_storage_up{job="orders"} == 0`}},
		{"job in a template", kube.Rule{Alert: "X", Expr: `ckpt_storage_up == 0`, Annotations: map[string]string{"summary": "{{ $labels.job }} down"}}},
	} {
		if errs := checkRules([]kube.Rule{tc.rule}, known); len(errs) == 0 {
			t.Errorf("the check passes a rule with %s: %s", tc.name, tc.rule.Expr)
		}
	}

	objs, err := kube.RenderWith(filepath.Join(deployDir(t), "sidecar"), filepath.Join(deployDir(t), "components", "monitoring"))
	if err != nil {
		t.Fatal(err)
	}
	var rules []kube.Rule
	for _, o := range objs {
		if pr, ok := o.Obj.(*kube.PrometheusRule); ok {
			for _, g := range pr.Spec.Groups {
				rules = append(rules, g.Rules...)
			}
		}
	}
	var alerts []string
	for _, r := range rules {
		alerts = append(alerts, r.Alert)
	}
	for _, want := range []string{"CkptNoRecentCheckpoint", "CkptCheckpointsFailing", "CkptDrillFailing", "CkptDrillSlowerThanRTO", "CkptRetainedBytesGrowing"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s among %q", want, alerts)
		}
	}
	for _, e := range checkRules(rules, known) {
		t.Error(e)
	}
}
