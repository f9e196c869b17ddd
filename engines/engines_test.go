package engines_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/manifests"
)

func TestLookup(t *testing.T) {
	r := engines.NewRegistry()
	for _, name := range []string{"", "generic", "rocksdb"} {
		if _, err := r.Lookup(name); err != nil {
			t.Errorf("Lookup(%q): %v", name, err)
		}
	}
	_, err := r.Lookup("leveldb")
	if !errors.Is(err, engines.ErrUnknown) {
		t.Fatalf("Lookup(leveldb) = %v, want ErrUnknown", err)
	}
	if got := err.Error(); got != `unknown engine "leveldb": known engines are generic, rocksdb` {
		t.Errorf("error %q does not list the known engines", got)
	}
}

func TestClassify(t *testing.T) {
	r := engines.NewRegistry()
	for _, name := range []string{"generic", "rocksdb"} {
		e, _ := r.Lookup(name)
		for file, want := range map[string]manifests.Kind{
			"000012.sst": manifests.Shared, "000013.blob": manifests.Shared,
			"MANIFEST-000001": manifests.Private, "CURRENT": manifests.Private, "OPTIONS-000005": manifests.Private,
			"000014.log": manifests.Private, "IDENTITY": manifests.Private, "marker.format-version.000001.013": manifests.Private,
			"sst": manifests.Private, "x.sst.tmp": manifests.Private,
		} {
			if got := e.Classify(file); got != want {
				t.Errorf("%s: Classify(%q) = %s, want %s", name, file, got, want)
			}
		}
	}
}

func TestCheckOfAnUnknownEngineProvesNothing(t *testing.T) {
	r, err := engines.Check(context.Background(), "some-plugin-engine", t.TempDir())
	if err != nil || r.Checked {
		t.Fatalf("Check of an engine this build lacks = %+v, %v; want unchecked, nil", r, err)
	}
}

func TestRegisterReplaces(t *testing.T) {
	r := engines.NewRegistry()
	r.Register(private{})
	e, err := r.Lookup("generic")
	if err != nil || e.Classify("a.sst") != manifests.Private {
		t.Fatalf("a registered engine did not replace the built-in of its name")
	}
}

type private struct{}

func (private) Name() string                                          { return "generic" }
func (private) Classify(string) manifests.Kind                        { return manifests.Private }
func (private) Check(context.Context, string) (engines.Result, error) { return engines.Result{}, nil }

// Package engines is what an engine plugin links beside the SDK: it needs
// nothing of ckpt but itself (not manifests, not an engine's library), so
// that a plugin links neither the manifest format nor Pebble.
func TestEnginesLinksNothingElseOfCkpt(t *testing.T) {
	for _, dep := range nonStandardDeps(t, ".") {
		if dep != "github.com/ckpt-io/ckpt/engines" {
			t.Errorf("package engines depends on %s", dep)
		}
	}
}

// nonStandardDeps lists the packages outside the standard library that
// the package pkg links (go list -deps), or skips without a go command.
func nonStandardDeps(t *testing.T, pkg string) []string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	return strings.Fields(string(out))
}
