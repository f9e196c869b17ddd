package sdk

import (
	"os/exec"
	"strings"
	"testing"
)

// A plugin links the SDK, the storage contract and the engine interface,
// not ckpt's manifest format, nor an engine's library: those are the
// host's.
func TestTheSDKLinksNeitherManifestsNorPebble(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "github.com/ckpt-io/ckpt/manifests" || strings.HasPrefix(dep, "github.com/cockroachdb/pebble") {
			t.Errorf("package sdk depends on %s", dep)
		}
	}
}
