package kube

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestExpandAsTheKubeletDoes(t *testing.T) {
	look := EnvLookup([]string{"A=1", "POD=orders-0", "EMPTY="})
	for in, want := range map[string]string{
		"--task=$(POD)":  "--task=orders-0",
		"$(A)$(A)":       "11",
		"$$(A)":          "$(A)",
		"$(UNKNOWN)":     "$(UNKNOWN)",
		"x$(EMPTY)y":     "xy",
		"$(A":            "$(A",
		"a$b":            "a$b",
		"tail$":          "tail$",
		"$(A)-$$-$(POD)": "1-$-orders-0",
	} {
		if got := Expand(in, look); got != want {
			t.Errorf("Expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDecodeIsStrict(t *testing.T) {
	for name, doc := range map[string]string{
		"a misspelt field":  "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a}\nautomountToken: true\n",
		"a wrong type":      "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: a}\nspec: {replicas: three}\n",
		"an unknown kind":   "apiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: a}\n",
		"a PodMonitor typo": "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: a}\nspec: {podMetricEndpoints: []}\n",
		"no kind":           "metadata: {name: a}\n",
		"a duplicate key":   "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a, name: b}\n",
	} {
		if _, err := Decode("test", []byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
	o, err := Decode("test", []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {K: v}\n"))
	if err != nil || o.Obj.(*corev1.ConfigMap).Data["K"] != "v" {
		t.Fatalf("%+v %v", o, err)
	}
}

func TestEnvResolvesConfigMapsFieldsAndReferences(t *testing.T) {
	objs := []Object{{Kind: "ConfigMap", Name: "ckpt-abc", Obj: &corev1.ConfigMap{Data: map[string]string{"CKPT_JOB": "orders", "B": "b"}}}}
	c := corev1.Container{Name: "agent",
		EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "ckpt-abc"}}}},
		Env: []corev1.EnvVar{
			{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "CKPT_NODE", Value: "$(NODE)"},
			{Name: "LATER", Value: "$(AFTER)"},
			{Name: "AFTER", Value: "x"},
			{Name: "B", Value: "override-$(B)"},
		},
		Args: []string{"--job=$(CKPT_JOB)", "$(LATER)"},
	}
	env, err := Env(c, objs, Pod{Name: "orders-0", NodeName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(env, " "), "B=override-b CKPT_JOB=orders NODE=node-a CKPT_NODE=node-a LATER=$(AFTER) AFTER=x"; got != want {
		t.Errorf("env %s\nwant %s", got, want)
	}
	if got := CommandLine(c, env); strings.Join(got, " ") != "--job=orders $(AFTER)" {
		t.Errorf("command line %q", got)
	}
}

func TestSplitDocuments(t *testing.T) {
	docs := SplitDocuments([]byte("# c\n---\na: 1\n---\n# only a comment\n---\nb: 2\n"))
	if len(docs) != 2 || string(docs[0]) != "a: 1\n" || string(docs[1]) != "b: 2\n" {
		t.Errorf("%q", docs)
	}
}

func TestFilesDecodesEveryDocumentAndSetsAsideNonObjects(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("kustomization.yaml", "resources: [a.yaml]\n")
	write("a.yaml", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
	write("tenants.yaml", "tenants:\n  - uid: 1000\n")
	objs, other, err := Files(dir)
	if err != nil || len(objs) != 2 || len(other) != 1 || !strings.Contains(other[0], "tenants.yaml") {
		t.Fatalf("objs %d, other %q, err %v", len(objs), other, err)
	}
	write("b.yml", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: b}\nsecrets: nope\n")
	if _, _, err := Files(dir); err == nil || !strings.Contains(err.Error(), "b.yml") {
		t.Fatalf("a bad document in b.yml: err %v", err)
	}
}
