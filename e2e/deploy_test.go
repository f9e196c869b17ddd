package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestTheSidecarExampleUsesOnlyRealFlags keeps deploy/sidecar honest: every
// flag that the example passes to a ckpt command exists in that command.
func TestTheSidecarExampleUsesOnlyRealFlags(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "deploy", "sidecar", "statefulset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	type container struct {
		Name    string   `json:"name"`
		Command []string `json:"command"`
		Args    []string `json:"args"`
	}
	var sts struct {
		Kind string `json:"kind"`
		Spec struct {
			Template struct {
				Spec struct {
					InitContainers []container `json:"initContainers"`
					Containers     []container `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &sts); err != nil {
		t.Fatalf("statefulset.yaml: %v", err)
	}
	if sts.Kind != "StatefulSet" {
		t.Fatalf("kind %q", sts.Kind)
	}
	checked := 0
	for _, c := range append(sts.Spec.Template.Spec.InitContainers, sts.Spec.Template.Spec.Containers...) {
		if len(c.Command) == 0 || c.Command[0] != "ckpt" {
			continue
		}
		sub := c.Args[0]
		help := runCkpt(t, sub, "--help")
		if help.Code != 0 {
			t.Fatalf("ckpt %s --help: exit %d", sub, help.Code)
		}
		for _, arg := range c.Args[1:] {
			name := strings.TrimPrefix(strings.SplitN(arg, "=", 2)[0], "--")
			if !strings.Contains(string(help.Stdout), "  -"+name+" ") && !strings.Contains(string(help.Stdout), "  -"+name+"\n") {
				t.Errorf("container %s: ckpt %s has no flag --%s", c.Name, sub, name)
			}
			checked++
		}
	}
	if checked < 10 {
		t.Fatalf("checked only %d flags: the example lost its ckpt containers", checked)
	}
}
