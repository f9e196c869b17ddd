package main

import (
	"testing"
)

// FuzzAgentConfig: whatever bytes a --config file holds (YAML or JSON),
// parsing the agent's settings never panics; it either applies known
// settings or names what is wrong, and the file never overrides a flag
// given on the command line or by the environment.
func FuzzAgentConfig(f *testing.F) {
	for _, s := range []string{
		`{"storage":"s3://b/p","allow_root":["/data","/x"],"retain":3,"gc_grace":"2h","pprof":true}`,
		"storage: gs://b/p\nallow-root: [/data]\nupload_rate: 100000000\n",
		"retain: three\n", `{"retain":"three"}`, `{"unknown":1}`, `{"config":"/etc/x"}`, `[]`, `null`,
		`{"allow_root":[1,{}]}`, `{"retain":1e400}`, `{"gc_grace":-5}`, `{"storage":null}`, "\xff",
		`{"socket":"/cmdline"}`, `{"job":"from-file"}`, "a: &x [*x]\n", "- 1\n- 2\n", "{a: b, a: c}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fs, o := agentFlagSet()
		if err := parseFlags(fs, []string{"--socket", "/cmdline"}); err != nil {
			t.Fatal(err)
		}
		if _, err := applyEnv(fs, []string{"CKPT_JOB=from-env"}); err != nil {
			t.Fatal(err)
		}
		applyConfigData(fs, "config.yaml", data)
		if o.socket != "/cmdline" {
			t.Fatalf("the config file overrode --socket given on the command line: %q", o.socket)
		}
		if o.job != "from-env" {
			t.Fatalf("the config file overrode CKPT_JOB: %q", o.job)
		}
	})
}
