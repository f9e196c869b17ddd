package main

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzApplyConfig: whatever bytes a --config file holds, applyConfig never
// panics; it either applies known settings or names what is wrong, and it
// never lets the file override a flag given on the command line.
func FuzzApplyConfig(f *testing.F) {
	for _, s := range []string{
		`{"storage":"s3://b/p","allow_root":["/data","/x"],"retain":3,"gc_grace":"2h","pprof":true}`,
		`{"retain":"three"}`, `{"unknown":1}`, `{"config":"/etc/x"}`, `[]`, `null`, `{"allow_root":[1,{}]}`,
		`{"retain":1e400}`, `{"gc_grace":-5}`, `{"storage":null}`, "\xff", `{"socket":"/cmdline"}`,
	} {
		f.Add([]byte(s))
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "config.json")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Skip(err)
		}
		fs := flag.NewFlagSet("agent", flag.ContinueOnError)
		socket := fs.String("socket", "", "")
		fs.String("storage", "", "")
		fs.Int("retain", 2, "")
		fs.Duration("gc-grace", time.Hour, "")
		fs.Bool("pprof", false, "")
		fs.String("config", "", "")
		var roots stringList
		fs.Var(&roots, "allow-root", "")
		if err := fs.Parse([]string{"--socket", "/cmdline"}); err != nil {
			t.Fatal(err)
		}
		applyConfig(fs, path)
		if *socket != "/cmdline" {
			t.Fatalf("the config file overrode --socket given on the command line: %q", *socket)
		}
	})
}
