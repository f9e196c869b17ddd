// Command ckpt is the checkpoint sidecar: the agent, and the commands that
// trigger, list, verify, restore and garbage-collect checkpoints.
//
// Exit status: 0 success, 1 the operation failed, 2 bad usage.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	_ "github.com/ckpt-io/ckpt/engines/pebble" // registers the pebble engine
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/ckpt-io/ckpt/storage"
	_ "github.com/ckpt-io/ckpt/storage/file"
	_ "github.com/ckpt-io/ckpt/storage/gs"
	"github.com/ckpt-io/ckpt/storage/metered"
	"github.com/ckpt-io/ckpt/storage/retry"
	_ "github.com/ckpt-io/ckpt/storage/s3"
)

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string) error
}

func commands() []command {
	return []command{
		{"agent", "run the sidecar agent on a Unix socket", runAgent},
		{"trigger", "send one checkpoint request to an agent and wait for its end", runTrigger},
		{"restore", "restore a task's store from its newest (or a chosen, or the newest job-complete) checkpoint", runRestore},
		{"list", "list the complete checkpoints of a job", runList},
		{"verify", "re-read every object of checkpoints and check sizes and checksums", runVerify},
		{"gc", "apply retention and delete objects no retained checkpoint needs", runGC},
		{"drill", "restore the newest checkpoint (of a task, or of every task of the job) from storage into scratch dirs, verify it, time it", runDrill},
		{"demo", "run the whole loop on a Pebble store and file:// storage in a temporary directory", runDemo},
		{"savepoint", "copy a checkpoint (or a job-complete one of every task) to storage of its own, which no retention or GC touches", runSavepoint},
		{"plugins", "list the storage and engine plugins of a plugin directory, and why any were refused", runPlugins},
		{"version", "print the version (also ckpt --version)", runVersion},
	}
}

// usageError marks errors that exit with status 2.
type usageError struct{ error }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	exitStuck = func(msg string) {
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(1)
	}
	os.Exit(run(ctx, os.Args[1:]))
}

func run(ctx context.Context, args []string) int {
	version = buildVersion()
	defer closePlugins()
	cmds := commands()
	switch {
	case len(args) == 0:
		printUsage(os.Stderr, cmds)
		return 2
	case args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help":
		printUsage(os.Stdout, cmds)
		return 0
	case args[0] == "--version" || args[0] == "-version":
		args = []string{"version"}
	}
	for _, c := range cmds {
		if c.name == args[0] {
			cctx, done := withCommandTimeout(ctx, c.name)
			err := explainTimeout(cctx, c.run(cctx, args[1:]))
			done()
			if err == nil {
				return 0
			}
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			var ue usageError
			if errors.As(err, &ue) {
				fmt.Fprintf(os.Stderr, "ckpt %s: %v\n", c.name, err)
				return 2
			}
			if !errors.Is(err, errReported) {
				fmt.Fprintf(os.Stderr, "ckpt %s: %v\n", c.name, err)
			}
			return 1
		}
	}
	fmt.Fprintf(os.Stderr, "ckpt: unknown command %q\n\n", args[0])
	printUsage(os.Stderr, cmds)
	return 2
}

// errReported is returned by commands that already printed their failure.
var errReported = errors.New("failed")

func printUsage(w io.Writer, cmds []command) {
	fmt.Fprintln(w, "ckpt: incremental checkpoints of LSM stores to object storage, with local recovery.")
	fmt.Fprintln(w, "\nUsage: ckpt <command> [flags]   (ckpt <command> --help for its flags)")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
}

// newFlags makes a command's flag set with a usage text and an example.
// The usage goes to stdout when asked for (--help), to stderr after a
// mistake (see parse).
func newFlags(name, synopsis, example string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	addPluginDirFlag(fs, name)
	addTimeoutFlag(fs, name)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: ckpt %s %s\n\nFlags:\n", name, synopsis)
		fs.PrintDefaults()
		if example != "" {
			fmt.Fprintf(w, "\nExample:\n  %s\n", example)
		}
	}
	return fs
}

// parse parses flags (see parseFlags), refuses stray arguments and checks
// required flags.
func parse(fs *flag.FlagSet, args []string, required ...string) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return checkArgs(fs, required...)
}

// parseFlags parses args into fs. --help prints the usage to stdout and
// returns flag.ErrHelp (exit 0); a flag error prints the usage to stderr
// and returns a usageError (exit 2).
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(os.Stdout)
		fs.Usage()
		return err
	case err != nil:
		fs.SetOutput(os.Stderr)
		fs.Usage()
		return usageError{err}
	}
	fs.SetOutput(os.Stderr)
	return armTimeout(fs)
}

// checkArgs refuses stray arguments and reports required flags not set.
func checkArgs(fs *flag.FlagSet, required ...string) error {
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0))}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var missing []string
	for _, r := range required {
		if !set[r] && fs.Lookup(r).Value.String() == "" {
			missing = append(missing, "--"+r)
		}
	}
	if len(missing) > 0 {
		return usageError{fmt.Errorf("missing %s", strings.Join(missing, ", "))}
	}
	return nil
}

// openStore opens a storage URL (the backend checks at once that it can
// reach it, with a message that says what to check), measures every call
// it makes (each retry attempt counts), and retries transient failures.
func openStore(ctx context.Context, rawURL string) (storage.Store, error) {
	if err := loadPlugins(ctx); err != nil {
		return nil, err
	}
	s, err := storage.Open(ctx, rawURL)
	if errors.Is(err, storage.ErrBadURL) {
		if pluginHost != nil && len(pluginHost.Refused()) > 0 {
			// The plugin that serves the scheme may be one of those refused
			// (a wrong or missing pin): the command failed, the usage is fine.
			return nil, fmt.Errorf("%w (a plugin refused above may be the one that serves it)", err)
		}
		return nil, usageError{err}
	}
	if err != nil {
		return nil, err
	}
	scheme := "unknown"
	if u, err := url.Parse(rawURL); err == nil {
		scheme = u.Scheme
	}
	return retry.New(metered.New(s, scheme), retry.Options{MaxAttempts: 4}), nil
}

// printJSON writes v as the one JSON value on stdout.
func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// newLogger logs to stderr: JSON when stderr is not a terminal, text when it is.
func newLogger(level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level %q: use debug, info, warn or error", level)}
	}
	opts := &slog.HandlerOptions{Level: lv}
	if isTerminal(os.Stderr) {
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
