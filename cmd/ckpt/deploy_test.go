package main

import (
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/lab/kube"
	"github.com/ckpt-io/ckpt/lab/testservers"
	corev1 "k8s.io/api/core/v1"
)

// TestTheDeployManifestsParseWithCkptsOwnFlags renders every
// kustomization under deploy/ and gives each ckpt container's command
// line and environment, resolved as the kubelet does, to ckpt's own
// parser: the agent's through parseAgentFlags (args, CKPT_ variables and
// all, none unknown), other commands' flags through their flag sets (with
// --help last, so nothing runs).
func TestTheDeployManifestsParseWithCkptsOwnFlags(t *testing.T) {
	root, err := testservers.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := kube.Kustomizations(filepath.Join(root, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	agents, others := 0, 0
	for _, dir := range dirs {
		objs, err := kube.Render(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			tmpl := kube.PodSpec(o)
			if tmpl == nil {
				continue
			}
			pod := kube.Pod{Name: o.Name + "-0", Namespace: "default", NodeName: "node-a", IP: "10.0.0.1", ServiceAccount: tmpl.Spec.ServiceAccountName}
			for _, c := range append(append([]corev1.Container{}, tmpl.Spec.InitContainers...), tmpl.Spec.Containers...) {
				if len(c.Command) == 0 || path.Base(c.Command[0]) != "ckpt" {
					continue
				}
				where := dir + ": " + o.Name + "/" + c.Name
				env, err := kube.Env(c, objs, pod)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				line := kube.CommandLine(c, env)[1:]
				for _, s := range append(append([]string{}, line...), env...) {
					if strings.Contains(s, "$(") {
						t.Errorf("%s: %q refers to a variable the container does not define", where, s)
					}
				}
				if len(line) == 0 {
					t.Errorf("%s: no ckpt command", where)
					continue
				}
				if line[0] == "agent" {
					_, unknown, err := parseAgentFlags(line[1:], env)
					if err != nil {
						t.Errorf("%s: ckpt agent %q with env %q: %v", where, line[1:], env, err)
					}
					if len(unknown) > 0 {
						t.Errorf("%s: the agent would warn of unknown variables %q", where, unknown)
					}
					agents++
					continue
				}
				for _, a := range line[1:] {
					if !strings.HasPrefix(a, "-") {
						t.Fatalf("%s: argument %q is no flag", where, a)
					}
				}
				if code, _, stderr := runCaptured(t, append(line, "--help")...); code != 0 {
					t.Errorf("%s: ckpt %q: exit %d\n%s", where, line, code, stderr)
				}
				others++
			}
		}
	}
	if agents < 3 || others < 3 {
		t.Errorf("parsed %d agent and %d other ckpt containers, want the sidecar base's and both overlays' at least", agents, others)
	}
}
