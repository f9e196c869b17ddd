package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/lab/testservers"
)

// TestVersionJSONPrintsTheStampedFields: what the build stamped into
// version, commit and date is what `ckpt version --json` prints, one JSON
// object on stdout.
func TestVersionJSONPrintsTheStampedFields(t *testing.T) {
	old := [3]string{version, commit, date}
	t.Cleanup(func() { version, commit, date = old[0], old[1], old[2] })
	version, commit, date = "v1.2.3", "0123456789abcdef0123456789abcdef01234567", "2026-12-04T20:00:00Z"
	code, stdout, stderr := runCaptured(t, "version", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("stdout is no JSON object: %v\n%s", err, stdout)
	}
	want := map[string]string{"version": "v1.2.3", "commit": "0123456789abcdef0123456789abcdef01234567", "date": "2026-12-04T20:00:00Z"}
	if len(got) != len(want) {
		t.Errorf("ckpt version --json: %v, want exactly %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("ckpt version --json: %s = %q, want %q", k, got[k], v)
		}
	}
}

// TestVersionFallsBackToTheBuildInfo: a field the build did not stamp
// comes from the build info the Go toolchain recorded (the module version,
// vcs.revision, vcs.modified, vcs.time), and a stamped one wins over it.
func TestVersionFallsBackToTheBuildInfo(t *testing.T) {
	rev := "8791f6deda42c4c35a7cc42ff8e6bb05a2c065ee"
	vcs := func(modified string) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev},
			{Key: "vcs.time", Value: "2026-12-01T20:46:54Z"}, {Key: "vcs.modified", Value: modified}}}
	}
	tagged := &debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}
	for _, tc := range []struct {
		name    string
		stamped buildInfo
		bi      *debug.BuildInfo
		want    buildInfo
	}{
		{"nothing stamped, a clean checkout", buildInfo{}, vcs("false"), buildInfo{"dev-8791f6deda42", rev, "2026-12-01T20:46:54Z"}},
		{"nothing stamped, a modified checkout", buildInfo{}, vcs("true"), buildInfo{"dev-8791f6deda42-dirty", rev + "-dirty", "2026-12-01T20:46:54Z"}},
		{"nothing stamped, a tagged go install", buildInfo{}, tagged, buildInfo{"v1.4.0", "unknown", "unknown"}},
		{"nothing stamped, no build info", buildInfo{}, nil, buildInfo{"dev", "unknown", "unknown"}},
		{"only the version stamped", buildInfo{Version: "v2.0.0"}, vcs("false"), buildInfo{"v2.0.0", rev, "2026-12-01T20:46:54Z"}},
		{"everything stamped", buildInfo{"v2.0.0", "abc", "2026-12-04T00:00:00Z"}, vcs("true"), buildInfo{"v2.0.0", "abc", "2026-12-04T00:00:00Z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resolveBuildInfo(tc.stamped, tc.bi); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestVersionJSONOfARealBuild builds ckpt twice: stamped with -ldflags -X
// (as deploy/build.sh does), and unstamped, in which case what it prints is
// what the Go toolchain recorded in the binary (go version -m).
func TestVersionJSONOfARealBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds ckpt twice")
	}
	root, err := testservers.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	build := func(name string, args ...string) (string, map[string]string) {
		t.Helper()
		bin := filepath.Join(dir, name)
		cmd := exec.Command("go", append(append([]string{"build"}, args...), "-o", bin, "./cmd/ckpt")...)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %q: %v\n%s", args, err, b)
		}
		out, err := exec.Command(bin, "version", "--json").Output()
		if err != nil {
			t.Fatalf("%s version --json: %v", name, err)
		}
		var got map[string]string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s version --json: %v\n%s", name, err, out)
		}
		return bin, got
	}

	_, got := build("stamped", "-ldflags", "-X main.version=v7.8.9-test -X main.commit=feedface -X main.date=2026-01-02T03:04:05Z")
	if got["version"] != "v7.8.9-test" || got["commit"] != "feedface" || got["date"] != "2026-01-02T03:04:05Z" {
		t.Errorf("stamped build: %v", got)
	}

	bin, got := build("unstamped", "-buildvcs=auto")
	m, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string]string{}
	for _, line := range strings.Split(string(m), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "build" {
			if k, v, ok := strings.Cut(f[1], "="); ok {
				recorded[k] = v
			}
		}
	}
	wantCommit, wantDate := "unknown", "unknown"
	if r := recorded["vcs.revision"]; r != "" {
		wantCommit, wantDate = r, recorded["vcs.time"]
		if recorded["vcs.modified"] == "true" {
			wantCommit += "-dirty"
		}
	}
	t.Logf("the toolchain recorded vcs.revision %q, vcs.time %q", recorded["vcs.revision"], recorded["vcs.time"])
	if got["commit"] != wantCommit || got["date"] != wantDate {
		t.Errorf("unstamped build: %v, want commit %q and date %q from the build info", got, wantCommit, wantDate)
	}
}
