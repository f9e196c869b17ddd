package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"
)

// timeoutCommands are the commands that talk to storage, with their
// default --timeout: a storage server or plugin that stops answering ends
// them with exit 1 instead of holding them (a restore in an init
// container, a gc in a cron job) forever.
var timeoutCommands = map[string]time.Duration{
	"restore": time.Hour, "savepoint": time.Hour, "verify": time.Hour, "gc": time.Hour, "drill": time.Hour, "list": time.Hour,
}

// timeoutEnv sets --timeout when the command line does not.
const timeoutEnv = "CKPT_TIMEOUT"

// stuckGrace is how long a command may take to stop once its --timeout
// has cancelled it; past it, the process exits (see exitStuck).
const stuckGrace = 10 * time.Second

// commandTimeout is the --timeout of the command being run.
var commandTimeout time.Duration

// addTimeoutFlag gives a command that talks to storage its --timeout.
func addTimeoutFlag(fs *flag.FlagSet, name string) {
	def, ok := timeoutCommands[name]
	if !ok {
		return
	}
	commandTimeout = def
	fs.DurationVar(&commandTimeout, "timeout", def,
		"give up, exit 1, when the command has not finished after this long, however storage (or a plugin) answers (0: no limit; default from $"+timeoutEnv+" when set)")
}

// timedOut is the cause of a command's context when its --timeout passed.
type timedOut struct {
	d    time.Duration
	flag string // how it was set
}

func (e *timedOut) Error() string {
	return fmt.Sprintf("timed out after %v (%s); storage or a plugin did not answer in time: check it, or give a longer --timeout", e.d, e.flag)
}

// deadline arms the --timeout of the command run() is running; nil
// outside run().
var deadline struct {
	mu  sync.Mutex
	arm func(d time.Duration, how string)
}

// exitStuck, when set (by main), ends the process if a command still runs
// stuckGrace after its --timeout cancelled it: something that ignores its
// context must not hold the command past its deadline.
var exitStuck func(msg string)

// withCommandTimeout returns the context run() gives a command: cancelled
// (cause *timedOut) once the command's --timeout, armed when its flags are
// parsed, passes. done stops the timers.
func withCommandTimeout(ctx context.Context, name string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	var mu sync.Mutex
	var timers []*time.Timer
	deadline.mu.Lock()
	deadline.arm = func(d time.Duration, how string) {
		mu.Lock()
		defer mu.Unlock()
		timers = append(timers, time.AfterFunc(d, func() {
			cancel(&timedOut{d: d, flag: how})
			if exitStuck == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			timers = append(timers, time.AfterFunc(stuckGrace, func() {
				exitStuck(fmt.Sprintf("ckpt %s: timed out after %v (%s) and did not stop within %v of it; exiting", name, d, how, stuckGrace))
			}))
		}))
	}
	deadline.mu.Unlock()
	return ctx, func() {
		deadline.mu.Lock()
		deadline.arm = nil
		deadline.mu.Unlock()
		mu.Lock()
		for _, t := range timers {
			t.Stop()
		}
		mu.Unlock()
		cancel(nil)
	}
}

// armTimeout starts the --timeout of fs's command, if it has one, once
// its flags are parsed: from the command line, else from CKPT_TIMEOUT,
// else the command's default.
func armTimeout(fs *flag.FlagSet) error {
	f := fs.Lookup("timeout")
	if f == nil {
		return nil
	}
	how := "--timeout"
	set := false
	fs.Visit(func(v *flag.Flag) { set = set || v.Name == "timeout" })
	if !set {
		how = "the default --timeout"
		if v := os.Getenv(timeoutEnv); v != "" {
			if err := fs.Set("timeout", v); err != nil {
				return usageError{fmt.Errorf("environment %s=%q: %w (it sets --timeout: a duration such as 30m)", timeoutEnv, v, err)}
			}
			how = timeoutEnv
		}
	}
	d := commandTimeout
	if d < 0 {
		return usageError{fmt.Errorf("%s %v: must not be negative (0: no limit)", how, d)}
	}
	how = fmt.Sprintf("%s %v", how, d)
	deadline.mu.Lock()
	arm := deadline.arm
	deadline.mu.Unlock()
	if d > 0 && arm != nil {
		arm(d, how)
	}
	return nil
}

// explainTimeout says, when ctx ended because the command's --timeout
// passed, that it did, before what the command failed with.
func explainTimeout(ctx context.Context, err error) error {
	var to *timedOut
	if err == nil || !errors.As(context.Cause(ctx), &to) || errors.As(err, new(usageError)) {
		return err
	}
	if errors.Is(err, errReported) {
		return fmt.Errorf("%w", to)
	}
	return fmt.Errorf("%w: %v", to, err)
}
