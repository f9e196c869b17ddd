package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/ckpt-io/ckpt/lab/servers"
)

// modulePath is the module the ckpt repository declares in its go.mod.
const modulePath = "github.com/ckpt-io/ckpt"

// FindCkpt returns a ckpt binary to run as `ckpt agent`, in this order:
//
//  1. built with `go build ./cmd/ckpt` into binDir from the ckpt repository
//     around the working directory or this binary, so that the agent
//     processes run the same source as the in-process agents;
//  2. the `ckpt` beside this binary (bin/ckpt beside bin/ckpt-bench);
//  3. the `ckpt` on PATH.
//
// logf, when set, is told what was picked.
func FindCkpt(ctx context.Context, binDir string, logf func(format string, args ...any)) (string, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	exe, _ := os.Executable()
	var buildErr error
	if root := ckptRepo(exe); root != "" {
		out := filepath.Join(binDir, "ckpt")
		logf("building ckpt from %s into %s", root, out)
		if buildErr = buildCkpt(ctx, root, out); buildErr == nil {
			return out, nil
		}
		logf("%v", buildErr)
	}
	if exe != "" {
		p := filepath.Join(filepath.Dir(exe), "ckpt")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			logf("ckpt agent: %s", p)
			return p, nil
		}
	}
	if p, err := exec.LookPath("ckpt"); err == nil {
		logf("ckpt agent: %s (PATH)", p)
		return p, nil
	}
	if buildErr != nil {
		return "", buildErr
	}
	return "", errors.New("no ckpt binary to run as an agent: build it beside ckpt-bench (go build -o bin/ckpt ./cmd/ckpt), put it on PATH or pass --ckpt PATH")
}

// ckptRepo returns the root of the ckpt repository holding the working
// directory or the directory of exe, or "".
func ckptRepo(exe string) string {
	var dirs []string
	if wd, err := os.Getwd(); err == nil {
		dirs = append(dirs, wd)
	}
	if exe != "" {
		dirs = append(dirs, filepath.Dir(exe))
	}
	for _, d := range dirs {
		root, err := servers.RepoRoot(d)
		if err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, "cmd", "ckpt", "main.go")); err != nil {
			continue
		}
		if modulePathOf(filepath.Join(root, "go.mod")) == modulePath {
			return root
		}
	}
	return ""
}

// modulePathOf reads the module line of a go.mod.
func modulePathOf(gomod string) string {
	f, err := os.Open(gomod)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// buildCkpt builds root's ./cmd/ckpt into out.
func buildCkpt(ctx context.Context, root, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, servers.GoTool(), "build", "-o", out, "./cmd/ckpt")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/ckpt in %s: %v\n%s", root, err, strings.TrimSpace(string(b)))
	}
	return nil
}
