package e2e

import (
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTheImageBuildYieldsStaticBinariesWithTheVersionStamped runs the
// build command of the Dockerfile (deploy/build.sh) into a temporary dir,
// as the image build does, and checks what the image would ship: static
// binaries (no interpreter, no shared library) and `ckpt version` printing
// the stamped version. No image daemon is needed.
func TestTheImageBuildYieldsStaticBinariesWithTheVersionStamped(t *testing.T) {
	if testing.Short() {
		t.Skip("builds ckpt and the plugins without cgo (about a minute cold)")
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	checkDockerfile(t, string(dockerfile))

	out := t.TempDir()
	const stamp = "v0.0.0-imagetest"
	cmd := exec.Command(filepath.Join(root, "deploy", "build.sh"), out, stamp, "c0ffee", "2026-12-04T20:00:00Z")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1") // the script must turn cgo off itself
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("deploy/build.sh: %v\n%s", err, b)
	}
	bins := []string{"ckpt", "plugins/ckpt-plugin-s3", "plugins/ckpt-plugin-azblob"}
	for _, b := range bins {
		checkStatic(t, filepath.Join(out, b))
	}
	v, err := exec.Command(filepath.Join(out, "ckpt"), "version").Output()
	if err != nil || strings.TrimSpace(string(v)) != stamp {
		t.Errorf("ckpt version: %q %v, want %q", v, err, stamp)
	}
	v, err = exec.Command(filepath.Join(out, "ckpt"), "version", "--json").Output()
	var info map[string]string
	if err != nil || json.Unmarshal(v, &info) != nil || info["version"] != stamp || info["commit"] != "c0ffee" || info["date"] != "2026-12-04T20:00:00Z" {
		t.Errorf("ckpt version --json: %s %v, want what deploy/build.sh stamped", v, err)
	}
	p, err := exec.Command(filepath.Join(out, "ckpt"), "plugins", "--plugin-dir", filepath.Join(out, "plugins"), "--json").Output()
	var served []struct{ Name string }
	if err != nil || json.Unmarshal(p, &served) != nil || len(served) != 2 || served[0].Name != "azblob" || served[1].Name != "s3" {
		t.Errorf("ckpt plugins on the image's plugin dir: %v\n%s", err, p)
	}
}

// checkDockerfile holds the Dockerfile to what the test proves: it builds
// with deploy/build.sh, and its final stage runs no command (no shell),
// as a fixed non-root user, with the plugin dir set.
func checkDockerfile(t *testing.T, text string) {
	t.Helper()
	if !strings.Contains(text, " ./deploy/build.sh /out ") {
		t.Error("the Dockerfile does not build with deploy/build.sh")
	}
	final := text[strings.LastIndex(text, "\nFROM "):]
	for _, want := range []string{"\nFROM scratch", "\nUSER 65532:65532", "CKPT_PLUGIN_DIR=/usr/lib/ckpt/plugins",
		"COPY --from=build /out/plugins/ /usr/lib/ckpt/plugins/", "ENTRYPOINT [\"/usr/local/bin/ckpt\"]"} {
		if !strings.Contains(final, want) {
			t.Errorf("the final stage lacks %q", want)
		}
	}
	if strings.Contains(final, "\nRUN ") {
		t.Error("the final stage runs a command: the image has no shell")
	}
}

// checkStatic fails unless the ELF file at path asks for no interpreter
// and no shared library.
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has an interpreter (PT_INTERP): it is dynamically linked", filepath.Base(path))
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) > 0 {
		t.Errorf("%s needs shared libraries (DT_NEEDED): %v", filepath.Base(path), libs)
	}
}
