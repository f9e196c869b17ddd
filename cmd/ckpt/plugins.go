package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/ckpt-io/ckpt/plugins"
)

// pluginCommands are the commands that open storage or check an engine,
// and so take --plugin-dir.
var pluginCommands = map[string]bool{
	"agent": true, "trigger": true, "restore": true, "list": true, "verify": true,
	"gc": true, "drill": true, "savepoint": true,
}

// pluginDir is the --plugin-dir of the command being run; pluginPins,
// pluginPinFile and pluginRequirePins are its --plugin-sha256,
// --plugin-sha256-file and --require-pins.
var (
	pluginDir         string
	pluginPins        = pinFlag{}
	pluginPinFile     string
	pluginRequirePins bool
)

// addPluginDirFlag gives a command that uses plugins its --plugin-dir flag
// and the flags that pin plugin binaries.
func addPluginDirFlag(fs *flag.FlagSet, name string) {
	if pluginCommands[name] {
		pluginPins, pluginPinFile = pinFlag{}, ""
		fs.StringVar(&pluginDir, "plugin-dir", os.Getenv("CKPT_PLUGIN_DIR"),
			"directory of ckpt-plugin-* binaries (storage backends and engines) to use (default $CKPT_PLUGIN_DIR)")
		addPinFlags(fs, pluginPins, &pluginPinFile, &pluginRequirePins)
	}
}

// addPinFlags adds --plugin-sha256, --plugin-sha256-file and
// --require-pins.
func addPinFlags(fs *flag.FlagSet, pins pinFlag, file *string, require *bool) {
	fs.Var(pins, "plugin-sha256", "NAME=SHA256: run ckpt-plugin-NAME only if its binary has this SHA-256 (repeatable, or comma-separated)")
	fs.StringVar(file, "plugin-sha256-file", "", "file of pins, one per line: NAME=SHA256, or the output of sha256sum ckpt-plugin-*")
	*require = false
	if v, ok := os.LookupEnv(requirePinsEnv); ok {
		// A value that is no boolean requires pins: an error (see
		// pluginOptions) must not turn the check off.
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		*require = b || err != nil
	}
	fs.BoolVar(require, "require-pins", *require, "refuse every plugin that --plugin-sha256 or --plugin-sha256-file does not pin (default $"+requirePinsEnv+")")
}

// requirePinsEnv is --require-pins from the environment, for every
// command that has the flag.
const requirePinsEnv = "CKPT_REQUIRE_PINS"

// pinFlag is the repeatable --plugin-sha256 NAME=HEX.
type pinFlag plugins.Pins

func (p pinFlag) String() string {
	var s []string
	for n, h := range p {
		s = append(s, n+"="+h)
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

// Set adds NAME=HEX, or several separated by commas (as one value from
// the environment).
func (p pinFlag) Set(v string) error {
	for _, one := range strings.Split(v, ",") {
		name, sum, err := plugins.ParsePin(one)
		if err != nil {
			return err
		}
		if err := plugins.Pins(p).Add(name, sum); err != nil {
			return err
		}
	}
	return nil
}

// pluginOptions merges the pins of the flags and of the pin file.
func pluginOptions(dir string, pins pinFlag, file string, requirePins bool) (plugins.Options, error) {
	if v, ok := os.LookupEnv(requirePinsEnv); ok {
		if _, err := strconv.ParseBool(strings.TrimSpace(v)); err != nil {
			return plugins.Options{}, usageError{fmt.Errorf("environment %s=%q: want true or false", requirePinsEnv, v)}
		}
	}
	all := plugins.Pins{}
	if file != "" {
		fp, err := plugins.ReadPinFile(file)
		if err != nil {
			return plugins.Options{}, usageError{fmt.Errorf("--plugin-sha256-file: %w", err)}
		}
		all = fp
	}
	for n, h := range pins {
		if err := all.Add(n, h); err != nil {
			return plugins.Options{}, usageError{fmt.Errorf("--plugin-sha256 and --plugin-sha256-file: %w", err)}
		}
	}
	if len(all) > 0 && dir == "" {
		return plugins.Options{}, usageError{fmt.Errorf("--plugin-sha256 pins plugins but no --plugin-dir (or CKPT_PLUGIN_DIR) is given")}
	}
	return plugins.Options{Dir: dir, Checksums: all, RequireChecksums: requirePins}, nil
}

var (
	pluginsOnce sync.Once
	pluginsErr  error
	pluginHost  *plugins.Host
)

// loadPlugins starts the plugins of --plugin-dir, once, and registers them
// with storage.Open and engines.Lookup. Refused binaries are reported on
// stderr and left out; an unreadable directory is an error.
func loadPlugins(ctx context.Context) error {
	pluginsOnce.Do(func() {
		opts, err := pluginOptions(pluginDir, pluginPins, pluginPinFile, pluginRequirePins)
		if err != nil || pluginDir == "" {
			pluginsErr = err
			return
		}
		h, err := plugins.Discover(ctx, opts)
		if err != nil {
			pluginsErr = fmt.Errorf("--plugin-dir: %w", err)
			return
		}
		for _, r := range h.Refused() {
			fmt.Fprintf(os.Stderr, "ckpt: plugin %s\n", r)
		}
		h.Register()
		pluginHost = h
	})
	return pluginsErr
}

// closePlugins stops the plugin processes.
func closePlugins() {
	if pluginHost != nil {
		pluginHost.Close()
	}
}

func runPlugins(ctx context.Context, args []string) error {
	fs := newFlags("plugins", "--plugin-dir DIR [--json]", "ckpt plugins --plugin-dir /usr/lib/ckpt/plugins --json")
	dir := fs.String("plugin-dir", os.Getenv("CKPT_PLUGIN_DIR"), "directory of ckpt-plugin-* binaries (default $CKPT_PLUGIN_DIR)")
	pins, pinFile, requirePins := pinFlag{}, "", false
	addPinFlags(fs, pins, &pinFile, &requirePins)
	asJSON := fs.Bool("json", false, `print [{"name","kind","schemes"|"engine","path","protocol"}] as JSON`)
	if err := parse(fs, args, "plugin-dir"); err != nil {
		return err
	}
	opts, err := pluginOptions(*dir, pins, pinFile, requirePins)
	if err != nil {
		return err
	}
	h, err := plugins.Discover(ctx, opts)
	if err != nil {
		return err
	}
	defer h.Close()
	found := h.Plugins()
	if *asJSON {
		if found == nil {
			found = []plugins.Info{}
		}
		if err := printJSON(found); err != nil {
			return err
		}
	} else {
		w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NAME\tKIND\tSERVES\tPROTOCOL\tPATH")
		for _, p := range found {
			serves := p.Engine
			if p.Kind == plugins.KindStorage {
				serves = strings.Join(p.Schemes, "://, ") + "://"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", p.Name, p.Kind, serves, p.Protocol, p.Path)
		}
		w.Flush()
	}
	refused := h.Refused()
	for _, r := range refused {
		fmt.Fprintf(os.Stderr, "ckpt plugins: %s\n", r)
	}
	if len(refused) > 0 {
		return errReported
	}
	return nil
}
