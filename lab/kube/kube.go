// Package kube reads the Kubernetes manifests under deploy/ the way a
// cluster would, for tests: it renders kustomizations with kustomize's own
// library (krusty), decodes every document strictly into the k8s.io/api
// types (an unknown or misspelt field is an error), and resolves a
// container's environment and command line as the kubelet does (env from
// ConfigMaps, downward API fields, $(VAR) expansion).
//
// No cluster is needed: tests run the resolved command lines as processes.
package kube

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Object is one decoded manifest document.
type Object struct {
	APIVersion, Kind, Name string
	// Source names where it came from: a file, or a rendered kustomization.
	Source string
	// Path is the file it was read from ("" when rendered).
	Path string
	// Obj is the typed value: *appsv1.StatefulSet, *corev1.ConfigMap,
	// *PodMonitor, ...
	Obj any
}

// PodMonitor is the part of the Prometheus Operator's PodMonitor
// (monitoring.coreos.com/v1, a CRD with no Go type in k8s.io/api) that the
// manifests use. It is decoded strictly like every other kind: a field
// this struct does not know is an error, so a misspelt field cannot pass;
// grow the struct when a manifest needs more of the CRD.
type PodMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       PodMonitorSpec    `json:"spec"`
}

// PodMonitorSpec is PodMonitor's spec: which pods, which endpoints.
type PodMonitorSpec struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	NamespaceSelector *struct {
		Any        bool     `json:"any,omitempty"`
		MatchNames []string `json:"matchNames,omitempty"`
	} `json:"namespaceSelector,omitempty"`
	PodMetricsEndpoints []struct {
		Port     string `json:"port"`
		Path     string `json:"path,omitempty"`
		Interval string `json:"interval,omitempty"`
		Scheme   string `json:"scheme,omitempty"`
	} `json:"podMetricsEndpoints"`
}

// PrometheusRule is the part of the Prometheus Operator's PrometheusRule
// (monitoring.coreos.com/v1) that the manifests use, decoded strictly as
// PodMonitor is.
type PrometheusRule struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Groups []RuleGroup `json:"groups"`
	} `json:"spec"`
}

// RuleGroup is one group of a PrometheusRule.
type RuleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []Rule `json:"rules"`
}

// Rule is an alerting rule (Alert set) or a recording rule (Record set).
type Rule struct {
	Alert         string            `json:"alert,omitempty"`
	Record        string            `json:"record,omitempty"`
	Expr          string            `json:"expr"`
	For           string            `json:"for,omitempty"`
	KeepFiringFor string            `json:"keep_firing_for,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme, rbacv1.AddToScheme,
		batchv1.AddToScheme, policyv1.AddToScheme, networkingv1.AddToScheme, schedulingv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// Decode decodes one YAML document strictly into the Go type of its
// apiVersion and kind. An unknown kind, an unknown field or a value of the
// wrong type is an error naming source.
func Decode(source string, doc []byte) (Object, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return Object{}, fmt.Errorf("%s: %w", source, err)
	}
	o := Object{APIVersion: head.APIVersion, Kind: head.Kind, Name: head.Metadata.Name, Source: source}
	if head.Kind == "" || head.APIVersion == "" {
		return o, fmt.Errorf("%s: a document without apiVersion and kind", source)
	}
	gv, err := schema.ParseGroupVersion(head.APIVersion)
	if err != nil {
		return o, fmt.Errorf("%s: apiVersion %q: %w", source, head.APIVersion, err)
	}
	var obj any
	switch {
	case gv.Group == "monitoring.coreos.com" && gv.Version == "v1" && head.Kind == "PodMonitor":
		obj = &PodMonitor{}
	case gv.Group == "monitoring.coreos.com" && gv.Version == "v1" && head.Kind == "PrometheusRule":
		obj = &PrometheusRule{}
	default:
		ro, err := scheme.New(gv.WithKind(head.Kind))
		if err != nil {
			return o, fmt.Errorf("%s: %s %s: no Go type known for it (add its group to package kube's scheme): %w", source, head.APIVersion, head.Kind, err)
		}
		obj = ro
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return o, fmt.Errorf("%s: %s %q: %w", source, head.Kind, head.Metadata.Name, err)
	}
	o.Obj = obj
	return o, nil
}

// SplitDocuments splits a YAML stream at its "---" lines, dropping empty
// documents (comments only count as empty).
func SplitDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if hasContent(cur.Bytes()) {
			docs = append(docs, bytes.Clone(cur.Bytes()))
		}
		cur.Reset()
	}
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if t := strings.TrimRight(line, " \t\r\n"); t == "---" || strings.HasPrefix(t, "--- ") {
			flush()
			continue
		}
		cur.WriteString(line)
	}
	flush()
	return docs
}

func hasContent(doc []byte) bool {
	for _, l := range strings.Split(string(doc), "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			return true
		}
	}
	return false
}

// Render builds the kustomization in dir with kustomize's library and
// decodes every resource it yields strictly.
func Render(dir string) ([]Object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var out []Object
	for _, r := range rm.Resources() {
		doc, err := r.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
		}
		o, err := Decode("kustomize build "+dir, doc)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// Kustomizations lists the directories under root that hold a
// kustomization.yaml of kind Kustomization (a root that renders on its
// own), sorted. Components (kind Component) render only inside a
// kustomization: see Components.
func Kustomizations(root string) ([]string, error) {
	return kustomizationsOf(root, false)
}

// Components lists the directories under root that hold a kustomize
// Component, sorted.
func Components(root string) ([]string, error) {
	return kustomizationsOf(root, true)
}

func kustomizationsOf(root string, components bool) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || d.Name() != "kustomization.yaml" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(data, &head); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if (head.Kind == "Component") == components {
			dirs = append(dirs, filepath.Dir(p))
		}
		return nil
	})
	sort.Strings(dirs)
	return dirs, err
}

// RenderWith renders the kustomization in dir with components added, as a
// kustomization of a user's would that lists dir as its resource and the
// components under components:.
func RenderWith(dir string, components ...string) ([]Object, error) {
	tmp, err := os.MkdirTemp("", "kube-render-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	// kustomize takes relative paths only.
	rel := func(p string) (string, error) {
		a, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		return filepath.Rel(tmp, a)
	}
	r, err := rel(dir)
	if err != nil {
		return nil, err
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + r + "\ncomponents:\n"
	for _, c := range components {
		r, err := rel(c)
		if err != nil {
			return nil, err
		}
		k += "  - " + r + "\n"
	}
	if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return nil, err
	}
	return Render(tmp)
}

// Files decodes every document of every .yaml and .yml file under root
// strictly, except kustomization files (kustomize's own format, checked by
// rendering them). A kustomize patch is a partial object of its kind, so
// it decodes too, and a misspelt field in it is caught. A document with
// neither apiVersion nor kind is no Kubernetes object (a ckpt tenants
// file, say): it is returned in other, by file, not decoded.
func Files(root string) (objs []Object, other []string, err error) {
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		ext := filepath.Ext(p)
		if d.IsDir() || ext != ".yaml" && ext != ".yml" || d.Name() == "kustomization.yaml" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for i, doc := range SplitDocuments(data) {
			source := fmt.Sprintf("%s (document %d)", p, i+1)
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if yaml.Unmarshal(doc, &head) == nil && head.APIVersion == "" && head.Kind == "" {
				other = append(other, source)
				continue
			}
			o, err := Decode(source, doc)
			if err != nil {
				return err
			}
			o.Path = p
			objs = append(objs, o)
		}
		return nil
	})
	return objs, other, err
}

// PodSpec returns the pod template of a workload object (StatefulSet,
// DaemonSet, Deployment, Job), or nil for other kinds.
func PodSpec(o Object) *corev1.PodTemplateSpec {
	switch v := o.Obj.(type) {
	case *appsv1.StatefulSet:
		return &v.Spec.Template
	case *appsv1.DaemonSet:
		return &v.Spec.Template
	case *appsv1.Deployment:
		return &v.Spec.Template
	case *batchv1.Job:
		return &v.Spec.Template
	}
	return nil
}

// Find returns the object of kind and name in objs, or nil.
func Find(objs []Object, kind, name string) *Object {
	for i := range objs {
		if objs[i].Kind == kind && objs[i].Name == name {
			return &objs[i]
		}
	}
	return nil
}

// Pod is what the kubelet would know of a pod when it starts its
// containers: the values of the downward API fields the manifests use.
type Pod struct {
	Name, Namespace, NodeName, IP, ServiceAccount string
}

// Env resolves container c's environment as the kubelet does: envFrom
// ConfigMaps (found in objs) first, then env in order, each value's
// $(VAR) references expanded against what is defined before it, downward
// API fields from pod. It returns KEY=VALUE entries in definition order
// (a later definition of a key replaces an earlier one in place).
func Env(c corev1.Container, objs []Object, pod Pod) ([]string, error) {
	var keys []string
	vals := map[string]string{}
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			keys = append(keys, k)
		}
		vals[k] = v
	}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			return nil, fmt.Errorf("container %s: envFrom other than a ConfigMap is not simulated", c.Name)
		}
		cm := Find(objs, "ConfigMap", from.ConfigMapRef.Name)
		if cm == nil {
			return nil, fmt.Errorf("container %s: ConfigMap %q not found", c.Name, from.ConfigMapRef.Name)
		}
		data := cm.Obj.(*corev1.ConfigMap).Data
		names := make([]string, 0, len(data))
		for k := range data {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			set(from.Prefix+k, data[k])
		}
	}
	lookup := func(k string) (string, bool) { v, ok := vals[k]; return v, ok }
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			set(e.Name, Expand(e.Value, lookup))
		case e.ValueFrom.FieldRef != nil:
			v, err := pod.field(e.ValueFrom.FieldRef.FieldPath)
			if err != nil {
				return nil, fmt.Errorf("container %s: env %s: %w", c.Name, e.Name, err)
			}
			set(e.Name, v)
		case e.ValueFrom.ResourceFieldRef != nil:
			v, err := resourceField(c, *e.ValueFrom.ResourceFieldRef)
			if err != nil {
				return nil, fmt.Errorf("container %s: env %s: %w", c.Name, e.Name, err)
			}
			set(e.Name, v)
		default:
			return nil, fmt.Errorf("container %s: env %s: only fieldRef and resourceFieldRef are simulated", c.Name, e.Name)
		}
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k + "=" + vals[k]
	}
	return out, nil
}

// resourceField is the value of a resourceFieldRef of container c to its
// own requests or limits, as the kubelet gives it: the quantity divided by
// the divisor (default 1), rounded up. A limit the container does not set
// (the kubelet would give the node's allocatable) is an error.
func resourceField(c corev1.Container, ref corev1.ResourceFieldSelector) (string, error) {
	if ref.ContainerName != "" && ref.ContainerName != c.Name {
		return "", fmt.Errorf("resourceFieldRef to container %q: only a container's own resources are simulated", ref.ContainerName)
	}
	kind, name, ok := strings.Cut(ref.Resource, ".")
	var list corev1.ResourceList
	switch {
	case ok && kind == "limits":
		list = c.Resources.Limits
	case ok && kind == "requests":
		list = c.Resources.Requests
	default:
		return "", fmt.Errorf("resourceFieldRef %q: want limits.NAME or requests.NAME", ref.Resource)
	}
	q, ok := list[corev1.ResourceName(name)]
	if !ok {
		return "", fmt.Errorf("resourceFieldRef %q: the container sets no such value", ref.Resource)
	}
	div := int64(1)
	if !ref.Divisor.IsZero() {
		div = ref.Divisor.Value()
	}
	if name == "cpu" {
		m, d := q.MilliValue(), ref.Divisor.MilliValue()
		if ref.Divisor.IsZero() {
			d = 1000
		}
		return fmt.Sprint((m + d - 1) / d), nil
	}
	return fmt.Sprint((q.Value() + div - 1) / div), nil
}

func (p Pod) field(path string) (string, error) {
	switch path {
	case "metadata.name":
		return p.Name, nil
	case "metadata.namespace":
		return p.Namespace, nil
	case "spec.nodeName":
		return p.NodeName, nil
	case "status.podIP":
		return p.IP, nil
	case "spec.serviceAccountName":
		return p.ServiceAccount, nil
	}
	return "", fmt.Errorf("downward API field %q is not simulated", path)
}

// Expand replaces each $(VAR) in s whose VAR lookup knows by its value, as
// the kubelet does in env values, command and args: $$ stands for a
// literal $, and a reference to an unknown variable stays as written.
func Expand(s string, lookup func(string) (string, bool)) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// EnvLookup is a lookup for Expand over KEY=VALUE entries (the last wins).
func EnvLookup(env []string) func(string) (string, bool) {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// CommandLine is container c's command and args with $(VAR) expanded
// against env, as the kubelet runs it.
func CommandLine(c corev1.Container, env []string) []string {
	look := EnvLookup(env)
	var out []string
	for _, s := range append(append([]string{}, c.Command...), c.Args...) {
		out = append(out, Expand(s, look))
	}
	return out
}
