// Command ckpt-plugin-faulty is the plugins package's test plugin. What it
// does depends on the name it is installed under:
//
//   - ckpt-plugin-faulty serves faulty:///dir as the file:// backend,
//     except that a Put of a key under crash/ exits the process halfway
//     through the body, a Put of a key under kill/ sends the process
//     SIGKILL, a Get or Stat of a key under hang/ never returns, and a
//     Stat of class/<name> fails with storagetest.ClassErrors[name] (the
//     error classes of storage.Store, to check that they cross the
//     boundary); it prints to stdout before Serve and on every Put.
//   - ckpt-plugin-testengine serves the engine "testengine": *.dat files
//     are shared, Check counts the files of the directory.
//
// Started with CKPT_TEST_RAN_FILE set, it first appends its name to that
// file, so that a test can tell whether it ran at all; with
// CKPT_TEST_PID_FILE set, it writes its pid there. While the file
// CKPT_TEST_CRASH_FILE names exists, every Put of a key with a /shared/
// segment crashes the process halfway through the body (an agent's
// upload of a data file). While the file CKPT_TEST_HANG_FILE names exists,
// such a Put never returns, whatever its context says.
package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/plugins/sdk"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/file"
	"github.com/ckpt-io/ckpt/storage/storagetest"
)

func main() {
	name := strings.TrimPrefix(filepath.Base(os.Args[0]), "ckpt-plugin-")
	// Tests that must prove a binary was never run name a file here.
	if p := os.Getenv("CKPT_TEST_RAN_FILE"); p != "" {
		if f, err := os.OpenFile(p, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600); err == nil {
			fmt.Fprintln(f, name)
			f.Close()
		}
	}
	// Tests that must signal the process name a file for its pid.
	if p := os.Getenv("CKPT_TEST_PID_FILE"); p != "" {
		os.WriteFile(p, []byte(fmt.Sprint(os.Getpid())), 0o600)
	}
	fmt.Println("noise on stdout before Serve")
	os.Stdout.WriteString("more noise\n")
	syscall.Write(1, []byte("raw noise on fd 1\n"))
	switch name {
	case "testengine":
		sdk.ServeEngine(testEngine{})
	default:
		sdk.ServeStorage(func(ctx context.Context, u *url.URL) (storage.Store, error) {
			s, err := file.New(u.Path)
			if err != nil {
				return nil, err
			}
			return &faulty{Store: s}, nil
		}, "faulty")
	}
}

type faulty struct{ storage.Store }

func (f *faulty) Put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	fmt.Println("put", key) // after Serve: forwarded to the host's log
	crash := strings.HasPrefix(key, "crash/")
	if p := os.Getenv("CKPT_TEST_CRASH_FILE"); p != "" && strings.Contains(key, "/shared/") {
		if _, err := os.Stat(p); err == nil {
			crash = true
		}
	}
	if p := os.Getenv("CKPT_TEST_HANG_FILE"); p != "" && strings.Contains(key, "/shared/") {
		if _, err := os.Stat(p); err == nil {
			select {}
		}
	}
	if strings.HasPrefix(key, "kill/") {
		// Killed as by the OOM killer: nothing is cleaned up.
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	if crash {
		io.CopyN(io.Discard, body, size/2)
		// Straight to file descriptor 2, as a panic is written.
		syscall.Write(2, []byte("faulty plugin: crashing on purpose\n"))
		os.Exit(3)
	}
	return f.Store.Put(ctx, key, body, size)
}

func (f *faulty) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if strings.HasPrefix(key, "hang/") {
		select {}
	}
	return f.Store.Get(ctx, key)
}

func (f *faulty) Stat(ctx context.Context, key string) (storage.ObjectInfo, error) {
	if strings.HasPrefix(key, "hang/") {
		select {}
	}
	if c, ok := strings.CutPrefix(key, "class/"); ok {
		return storage.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, storagetest.ClassErrors[c])
	}
	return f.Store.Stat(ctx, key)
}

type testEngine struct{}

func (testEngine) Name() string { return "testengine" }

func (testEngine) Classify(name string) manifests.Kind {
	if strings.HasSuffix(name, ".dat") {
		return manifests.Shared
	}
	return manifests.Private
}

func (testEngine) Check(ctx context.Context, dir string) (engines.Result, error) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return engines.Result{}, err
	}
	return engines.Result{Checked: true, Keys: int64(len(es))}, nil
}
