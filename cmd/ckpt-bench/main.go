// Command ckpt-bench is the benchmark lab of ckpt: it measures ckpt on a
// real Pebble store against full checkpoints, rclone, restic and ldb, and
// checks each figure against its target (see lab/bench).
//
// It runs agents in its own process and as `ckpt agent` processes; the ckpt
// binary is --ckpt, else built from the ckpt repository around the working
// directory or this binary, else the ckpt beside this binary, else the one
// on PATH. The app section's controls (--hash-load, --copy-load) are this
// binary run again with that flag.
//
// Exit status: 0 success, 1 the run failed, 2 bad usage.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ckpt-io/ckpt/lab/bench"
)

const (
	synopsis = "[--storage URL] [--state-bytes B] [--rescale-bytes B] [--scale-files N,...] [--scale-objects N,...] [--churn F] [--checkpoints N] [--app-interval D] [--quick] [--json] [--cpuprofile FILE]"
	example  = "ckpt-bench --state-bytes 1GiB --json > bench.json"
)

// usageError marks errors that exit with status 2.
type usageError struct{ error }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run runs ckpt-bench with args and returns its exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := runBench(ctx, args, stdout, stderr)
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "ckpt-bench: %v\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "ckpt-bench: %v\n", err)
		return 1
	}
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ckpt-bench", flag.ContinueOnError)
	store := fs.String("storage", "", "storage URL to measure against (default: start versitygw, an S3 server, on 127.0.0.1)")
	stateBytes := fs.String("state-bytes", "", "size of the workload's state and of the large checkpoint of the memory figure, e.g. 64MiB, 1GiB (default 64MiB; --quick 8MiB)")
	rescaleBytes := fs.String("rescale-bytes", "", "keyed state of the rescale section (4 Pebble tasks rebuilt as 3 and as 6), e.g. 1GiB (default 1GiB; --quick 16MiB)")
	scaleFiles := fs.String("scale-files", "", "state sizes in files of the scale section's incremental curve, e.g. 1k,10k,100k (default 1k,10k,100k; --quick 200,1k; \"none\" skips it)")
	scaleObjects := fs.String("scale-objects", "", "job sizes in objects of the scale section's gc, list and verify curve, e.g. 10k,100k,1M (default 10k,100k,1M; --quick 2k; \"none\" skips it)")
	scaleNoVerify := fs.Bool("scale-no-verify", false, "leave ckpt verify out of the scale section's jobs of many objects (it reads every live object)")
	churn := fs.Float64("churn", 0.01, "fraction of the keys overwritten per round")
	checkpoints := fs.Int("checkpoints", 0, "checkpoints of the incremental section (default 10; --quick 3)")
	appInterval := fs.Duration("app-interval", time.Second, "checkpoint interval of the app-throughput section (phases last at least five intervals)")
	quick := fs.Bool("quick", false, "scale everything down to run in seconds (a smoke test: figures are not meaningful)")
	asJSON := fs.Bool("json", false, "print one JSON object with every figure and the per-checkpoint series")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the bench process (agents in it included) to FILE")
	only := fs.String("only", "", "comma-separated sections to run: "+strings.Join(bench.Sections, ", ")+" (default all)")
	dir := fs.String("dir", "", "scratch directory, kept afterwards (default: a temporary one, removed)")
	ckptExe := fs.String("ckpt", "", "the ckpt binary to run as `ckpt agent` (default: built from the ckpt repository around the working directory or this binary, else the ckpt beside this binary, else the one on PATH)")
	agentMetrics := fs.String("agent-metrics-addr", "", "serve /metrics and /debug/pprof/ of the agent processes of the memory and scale sections on HOST:PORT")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	hashLoad := fs.String("hash-load", "", "hash this many bytes a second (e.g. 150MB) with BLAKE3 until interrupted, and do nothing else: the CPU control the app-throughput section runs beside the app")
	copyLoad := fs.String("copy-load", "", "copy the new files of each checkpoint directory named on stdin into DIR, answer on stdout, and do nothing else: the shipping control the app-throughput section runs beside the app")
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "ckpt-bench: the benchmark lab of ckpt (incremental checkpoints of LSM stores to object storage).\n\n")
		fmt.Fprintf(w, "Usage: ckpt-bench %s\n\nFlags:\n", synopsis)
		fs.SetOutput(w)
		fs.PrintDefaults()
		fmt.Fprintf(w, "\nExample:\n  %s\n", example)
	}
	fs.SetOutput(io.Discard) // parse errors and --help are printed below
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout) // --help goes to stdout
			return err
		}
		usage(stderr)
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0))}
	}
	if *copyLoad != "" {
		if !filepath.IsAbs(*copyLoad) {
			return usageError{fmt.Errorf("--copy-load: %q: want an absolute directory", *copyLoad)}
		}
		return bench.CopyLoad(ctx, *copyLoad, os.Stdin, stdout)
	}
	if *hashLoad != "" {
		rate, err := parseBytes(*hashLoad)
		if err != nil {
			return usageError{fmt.Errorf("--hash-load: %v", err)}
		}
		return bench.HashLoad(ctx, rate)
	}
	o := bench.Options{ScaleNoVerify: *scaleNoVerify, Storage: *store, Churn: *churn, Checkpoints: *checkpoints, AppInterval: *appInterval, Quick: *quick, Dir: *dir,
		CkptExe: *ckptExe, AgentMetricsAddr: *agentMetrics, Log: stderr}
	if *quiet {
		o.Log = io.Discard
	}
	if *stateBytes != "" {
		b, err := parseBytes(*stateBytes)
		if err != nil {
			return usageError{fmt.Errorf("--state-bytes: %v", err)}
		}
		o.StateBytes = b
	}
	if *rescaleBytes != "" {
		b, err := parseBytes(*rescaleBytes)
		if err != nil {
			return usageError{fmt.Errorf("--rescale-bytes: %v", err)}
		}
		o.RescaleBytes = b
	}
	if *scaleFiles == "none" {
		o.ScaleFiles = []int{}
	} else if *scaleFiles != "" {
		ns, err := parseCounts(*scaleFiles)
		if err != nil {
			return usageError{fmt.Errorf("--scale-files: %v", err)}
		}
		o.ScaleFiles = ns
	}
	if *scaleObjects == "none" {
		o.ScaleObjects = []int{}
	} else if *scaleObjects != "" {
		ns, err := parseCounts(*scaleObjects)
		if err != nil {
			return usageError{fmt.Errorf("--scale-objects: %v", err)}
		}
		o.ScaleObjects = ns
	}
	if *only != "" {
		o.Only = strings.Split(*only, ",")
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := bench.Run(ctx, o)
	if rep == nil {
		if err != nil && strings.Contains(err.Error(), "must") {
			return usageError{err}
		}
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if perr := enc.Encode(rep); perr != nil {
			return perr
		}
	} else if perr := rep.Print(stdout); perr != nil {
		return perr
	}
	if err != nil {
		return err
	}
	if len(rep.Errors) > 0 {
		return fmt.Errorf("%d section(s) failed: %s", len(rep.Errors), strings.Join(rep.Errors, "; "))
	}
	return nil
}

// parseBytes reads 123, 64MiB, 1GiB, 512KiB (also KB/MB/GB as powers of 1024).
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.m
			break
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("want a positive size such as 64MiB or 1GiB, got %q", s)
	}
	return int64(f * float64(mult)), nil
}

// parseCounts reads a comma-separated list of counts: 1000, 10k, 1M.
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		mult := 1
		switch {
		case strings.HasSuffix(f, "k"), strings.HasSuffix(f, "K"):
			f, mult = f[:len(f)-1], 1000
		case strings.HasSuffix(f, "M"):
			f, mult = f[:len(f)-1], 1000000
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("want positive counts such as 1k,10k,100k, got %q", s)
		}
		out = append(out, n*mult)
	}
	return out, nil
}
