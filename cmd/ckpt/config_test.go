package main

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// writeConfig writes a --config file and returns its path.
func writeConfig(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

var required = []string{"--socket=/run/ckpt.sock", "--storage=file:///s", "--job=j", "--local-dir=/data/l"}

func TestFlagsWinOverTheEnvironmentWhichWinsOverTheConfigFile(t *testing.T) {
	cfg := writeConfig(t, "agent.yaml", "retain: 7\nupload_rate: 100000000\ngc-grace: 3h\nnode: from-file\nmetrics_addr: 127.0.0.1:1\n")
	args := append([]string{"--config", cfg, "--retain=5"}, required...)
	env := []string{"CKPT_RETAIN=6", "CKPT_GC_GRACE=2h", "CKPT_ALLOW_ROOT=/data, /cache", "PATH=/bin"}
	o, unknown, err := parseAgentFlags(args, env)
	if err != nil {
		t.Fatal(err)
	}
	if o.retain != 5 {
		t.Errorf("retain %d, want 5 (the flag)", o.retain)
	}
	if o.grace != 2*time.Hour {
		t.Errorf("gc-grace %v, want 2h (the environment over the file)", o.grace)
	}
	if o.uploadRate != 100000000 || o.node != "from-file" || o.metricsAddr != "127.0.0.1:1" {
		t.Errorf("from the file: upload-rate %d node %q metrics-addr %q", o.uploadRate, o.node, o.metricsAddr)
	}
	if want := (stringList{"/data", "/cache"}); !reflect.DeepEqual(o.roots, want) {
		t.Errorf("allow-root %q, want %q (comma-separated in the environment)", o.roots, want)
	}
	if len(unknown) != 0 {
		t.Errorf("unknown %q", unknown)
	}
}

func TestEveryAgentFlagHasAnEnvironmentVariable(t *testing.T) {
	fs, _ := agentFlagSet()
	var env []string
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		env = append(env, envName(f.Name)+"="+f.DefValue)
		n++
	})
	_, unknown, err := parseAgentFlags(nil, append(env, "CKPT_SOCKET=/s", "CKPT_STORAGE=file:///s", "CKPT_JOB=j",
		"CKPT_LOCAL_DIR=/l", "CKPT_ALLOW_ROOT=/data", "CKPT_CONFIG="))
	if err != nil {
		t.Fatal(err)
	}
	if len(unknown) != 0 || n < 25 {
		t.Errorf("%d flags; unknown %q", n, unknown)
	}
}

func TestTheEnvironmentAloneStartsAnAgent(t *testing.T) {
	o, _, err := parseAgentFlags(nil, []string{"CKPT_SOCKET=/run/ckpt/ckpt.sock", "CKPT_STORAGE=s3://b/p",
		"CKPT_JOB=orders", "CKPT_LOCAL_DIR=/data/l", "CKPT_ALLOW_ROOT=/data", "CKPT_ALLOW_UID=1000,1001", "CKPT_PPROF=true"})
	if err != nil {
		t.Fatal(err)
	}
	if o.socket != "/run/ckpt/ckpt.sock" || o.store != "s3://b/p" || o.job != "orders" || !o.pprof ||
		!reflect.DeepEqual(o.uids, idList{1000, 1001}) {
		t.Errorf("%+v", o)
	}
}

func TestUnknownCkptVariablesAreNamedAndOthersLeftAlone(t *testing.T) {
	env := []string{"CKPT_STORAG=s3://typo", "CKPT_TASK=orders-0", "CKPT_PLUGIN_DIR=/p", "CKPT_UNSAFE_MIN_GC_GRACE=1s",
		"CKPT_FAILPOINT=x", "CKPT_ALLOWROOT=/x", "HOME=/root"}
	_, unknown, err := parseAgentFlags(required, append(env, "CKPT_ALLOW_ROOT=/data"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"CKPT_ALLOWROOT", "CKPT_STORAG"}; !reflect.DeepEqual(unknown, want) {
		t.Errorf("unknown %q, want %q", unknown, want)
	}
}

func TestBadSettingsAreUsageErrorsNamingTheirSource(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"a bad environment value", nil, []string{"CKPT_RETAIN=three", "CKPT_ALLOW_ROOT=/d"}, "CKPT_RETAIN"},
		{"a bad uid list", nil, []string{"CKPT_ALLOW_UID=1,x", "CKPT_ALLOW_ROOT=/d"}, "CKPT_ALLOW_UID"},
		{"a relative root from the environment", nil, []string{"CKPT_ALLOW_ROOT=/d,data"}, "relative"},
		{"no root at all", nil, nil, "--allow-root is required"},
		{"retain 0 from the environment", nil, []string{"CKPT_RETAIN=0", "CKPT_ALLOW_ROOT=/d"}, "--retain 0"},
		{"an unknown config key", []string{"--config", "@typo"}, []string{"CKPT_ALLOW_ROOT=/d"}, `unknown setting "retian"`},
		{"a config that is a list", []string{"--config", "@list"}, []string{"CKPT_ALLOW_ROOT=/d"}, "want an object"},
		{"a bad log level", []string{"--log-level=loud"}, []string{"CKPT_ALLOW_ROOT=/d"}, "--log-level"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{}, required...), tc.args...)
			for i, a := range args {
				switch a {
				case "@typo":
					args[i] = writeConfig(t, "c.yaml", "retian: 3\n")
				case "@list":
					args[i] = writeConfig(t, "c.yaml", "- retain\n")
				}
			}
			_, _, err := parseAgentFlags(args, tc.env)
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want a usage error naming %q", err, tc.want)
			}
		})
	}
}

func TestAJSONConfigStillWorks(t *testing.T) {
	cfg := writeConfig(t, "agent.json", `{"storage": "s3://bucket/ckpt", "allow_root": ["/data", "/x"], "retain": 3, "pprof": true}`)
	o, _, err := parseAgentFlags([]string{"--config", cfg, "--socket=/s", "--job=j", "--local-dir=/l"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.store != "s3://bucket/ckpt" || o.retain != 3 || !o.pprof || len(o.roots) != 2 {
		t.Errorf("%+v", o)
	}
}
