package main

import (
	"context"
	"flag"
	"fmt"
	"os"
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

// pluginDir is the --plugin-dir of the command being run.
var pluginDir string

// addPluginDirFlag gives a command that uses plugins its --plugin-dir flag.
func addPluginDirFlag(fs *flag.FlagSet, name string) {
	if pluginCommands[name] {
		fs.StringVar(&pluginDir, "plugin-dir", os.Getenv("CKPT_PLUGIN_DIR"),
			"directory of ckpt-plugin-* binaries (storage backends and engines) to use (default $CKPT_PLUGIN_DIR)")
	}
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
		if pluginDir == "" {
			return
		}
		h, err := plugins.Discover(ctx, plugins.Options{Dir: pluginDir})
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
	asJSON := fs.Bool("json", false, `print [{"name","kind","schemes"|"engine","path","protocol"}] as JSON`)
	if err := parse(fs, args, "plugin-dir"); err != nil {
		return err
	}
	h, err := plugins.Discover(ctx, plugins.Options{Dir: *dir})
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
