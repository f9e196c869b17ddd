package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// envPrefix starts every environment variable that ckpt reads.
const envPrefix = "CKPT_"

// otherEnv are the CKPT_ variables that are no agent flag and yet belong to
// ckpt: the client's, other commands', and the test-only escape hatches.
// The agent does not warn about them. Names ending in "*" are prefixes.
var otherEnv = []string{
	"CKPT_SOCKET",              // the app's client (also the agent's --socket)
	"CKPT_TASK",                // the app's task name (the deploy examples set it)
	"CKPT_PLUGIN_DIR",          // --plugin-dir of every command
	"CKPT_TIMEOUT",             // --timeout of the commands that talk to storage
	"CKPT_PLUGIN_MAGIC_COOKIE", // go-plugin's handshake with plugin binaries
	"CKPT_PLUGIN_BENCH",        // plugin throughput benchmark (tests)
	"CKPT_UNSAFE_*",            // test-only escape hatches (manifests.Unsafe*Env)
	"CKPT_FAILPOINT*",          // fault injection in -tags ckpt_failpoints builds
	"CKPT_SOAK*",               // the soak test
}

// envName is the environment variable of a flag: CKPT_ and the flag's
// name in upper case with - as _ (--allow-root: CKPT_ALLOW_ROOT).
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// repeatable is implemented by flags that may be given more than once; from
// the environment their values are comma-separated.
type repeatable interface{ repeatable() }

func (*stringList) repeatable() {}
func (*idList) repeatable()     {}
func (pinFlag) repeatable()     {}

// applyEnv sets every flag of fs that the command line did not set from its
// CKPT_<FLAG> variable in environ (KEY=VALUE entries), and returns the
// CKPT_ variables that name neither a flag nor a variable of otherEnv,
// sorted. A variable whose value the flag refuses is an error naming it.
func applyEnv(fs *flag.FlagSet, environ []string) ([]string, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	byEnv := map[string]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) { byEnv[envName(f.Name)] = f })
	var unknown []string
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, envPrefix) {
			continue
		}
		f := byEnv[k]
		if f == nil {
			if !isOtherEnv(k) {
				unknown = append(unknown, k)
			}
			continue
		}
		if set[f.Name] {
			continue // the command line wins
		}
		vals := []string{v}
		if _, ok := f.Value.(repeatable); ok {
			vals = splitList(v)
		}
		for _, one := range vals {
			if err := fs.Set(f.Name, one); err != nil {
				return nil, fmt.Errorf("environment %s=%q: %w (it sets --%s)", k, v, err, f.Name)
			}
		}
	}
	sort.Strings(unknown)
	return unknown, nil
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func isOtherEnv(name string) bool {
	for _, o := range otherEnv {
		if p, ok := strings.CutSuffix(o, "*"); ok && strings.HasPrefix(name, p) || name == o {
			return true
		}
	}
	return false
}

// applyConfig sets every flag the config file names and that is not set yet
// (by the command line or the environment). The file is one YAML or JSON
// object keyed by flag name (- or _ alike); a list sets a repeatable flag
// once per item. Unknown keys are errors: a typo must not pass silently.
func applyConfig(fs *flag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	return applyConfigData(fs, path, data)
}

// applyConfigData is applyConfig on the file's bytes.
func applyConfigData(fs *flag.FlagSet, path string, data []byte) error {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fmt.Errorf("--config %s: not YAML or JSON: %w", path, err)
	}
	var kv map[string]any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber() // 100000000 stays 100000000, not 1e+08
	if err := dec.Decode(&kv); err != nil || kv == nil {
		return fmt.Errorf("--config %s: want an object of flag values, e.g. {\"storage\": \"s3://bucket/ckpt\"}", path)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the same file reports the same first mistake
	for _, k := range keys {
		v := kv[k]
		name := strings.ReplaceAll(k, "_", "-")
		if fs.Lookup(name) == nil || name == "config" {
			return fmt.Errorf("--config %s: unknown setting %q", path, k)
		}
		if set[name] {
			continue
		}
		vals := []any{v}
		if list, ok := v.([]any); ok {
			vals = list
		}
		for _, one := range vals {
			var s string
			switch x := one.(type) {
			case string:
				s = x
			case json.Number, bool:
				s = fmt.Sprint(x)
			default:
				return fmt.Errorf("--config %s: setting %q: unsupported value %v", path, k, one)
			}
			if err := fs.Set(name, s); err != nil {
				return fmt.Errorf("--config %s: setting %q: %w", path, k, err)
			}
		}
	}
	return nil
}
