// Package plugins is the host side of ckpt's plugins: storage backends
// and engines served by separate binaries over gRPC with
// hashicorp/go-plugin (the way Velero serves object stores).
//
// Every executable file ckpt-plugin-<name> in the plugin directory is
// started, asked what it serves (a storage backend for some URL schemes,
// or an engine) and registered: storage.Open finds plugin schemes that no
// built-in backend has, engines.Lookup finds plugin engines (a plugin
// engine replaces a built-in one of the same name). A binary that fails
// the handshake (another program, another magic cookie, another protocol
// version), a pinned checksum, or a permission check (a binary or
// directory another user could write) is refused, with the
// reason, and the others are still used.
//
// Transport: AutoMTLS (a one-time certificate pair per process), ctx
// deadlines and cancellation cross the boundary with every call, bodies
// stream in chunks of at most 1 MiB with a CRC-32C over the whole body
// checked by the receiver, and the host checks the sizes it sends and
// receives. A plugin process that exits fails the calls in flight with an
// error naming it (and the last line it wrote to stderr); the next call
// starts it again and reopens its stores. Plugins are written with the
// SDK, package plugins/sdk.
package plugins

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/plugins/internal/wire"
	"github.com/ckpt-io/ckpt/plugins/proto"
	"github.com/ckpt-io/ckpt/storage"
)

// ProtocolVersion is the plugin protocol this build of ckpt speaks.
const ProtocolVersion = wire.ProtocolVersion

// Prefix starts the file name of every plugin binary.
const Prefix = "ckpt-plugin-"

// Kinds of plugins.
const (
	KindStorage = "storage"
	KindEngine  = "engine"
)

// Info describes a plugin that was found and accepted.
type Info struct {
	// Name is the part of the file name after ckpt-plugin-.
	Name string `json:"name"`
	// Kind is KindStorage or KindEngine.
	Kind string `json:"kind"`
	// Schemes are the URL schemes a storage plugin serves.
	Schemes []string `json:"schemes,omitempty"`
	// Engine is the engine an engine plugin serves.
	Engine string `json:"engine,omitempty"`
	// Path is the binary's absolute path.
	Path     string `json:"path"`
	Protocol int    `json:"protocol"`
}

// Refusal is a binary that was not accepted, and why.
type Refusal struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

func (r Refusal) String() string { return fmt.Sprintf("refused %s: %s", r.Path, r.Reason) }

// Options configures Discover.
type Options struct {
	// Dir is the plugin directory.
	Dir string
	// Checksums pins plugins by name (the part after ckpt-plugin-) to the
	// hex SHA-256 of their binary: a binary that differs is refused at
	// discovery, and at every later start. The open file that was hashed
	// is the one executed. A pinned plugin keeps its schemes and engine
	// against unpinned ones.
	Checksums map[string]string
	// RequireChecksums refuses plugins that Checksums does not pin
	// (--require-pins).
	RequireChecksums bool
	// Log receives the plugins' own log output (their stderr) and the
	// host's messages about them. Nil means os.Stderr.
	Log io.Writer
	// StartTimeout bounds a plugin's start and handshake. Zero means 15s.
	StartTimeout time.Duration
}

// Host holds the plugins of one directory. Its methods are safe for
// concurrent use.
type Host struct {
	opts    Options
	plugins []*Plugin
	refused []Refusal
	// runDir is the host's private directory (0700) of plugin sockets,
	// locked by runLock while the host lives.
	runDir  string
	runLock *os.File
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// Discover starts every ckpt-plugin-* binary in opts.Dir, asks what it
// serves and keeps those it accepts running. It fails only if the
// directory cannot be read; refused binaries are in Refused.
func Discover(ctx context.Context, opts Options) (*Host, error) {
	if opts.Log == nil {
		opts.Log = os.Stderr
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 15 * time.Second
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("plugin directory %q: %w", opts.Dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("plugin directory: %w", err)
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("plugin directory: %w", err)
	} else if err := checkOwner(dir, fi, "directory"); err != nil {
		return nil, err
	}
	if err := checkPinsPresent(dir, entries, opts.Checksums); err != nil {
		return nil, err
	}
	runDir, runLock, err := newRunDir()
	if err != nil {
		return nil, err
	}
	h := &Host{opts: opts, runDir: runDir, runLock: runLock}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), Prefix) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, reason := h.load(ctx, path)
			mu.Lock()
			defer mu.Unlock()
			if reason != "" {
				h.refused = append(h.refused, Refusal{Path: path, Reason: reason})
				return
			}
			h.plugins = append(h.plugins, p)
		}()
	}
	wg.Wait()
	sort.Slice(h.plugins, func(i, j int) bool { return h.plugins[i].info.Name < h.plugins[j].info.Name })
	h.dropConflicts()
	sort.Slice(h.refused, func(i, j int) bool { return h.refused[i].Path < h.refused[j].Path })
	return h, nil
}

// checkPinsPresent fails when a pin names a plugin the directory does not
// hold: the operator expects a plugin that is not there (a typo in the
// name, or a binary not installed).
func checkPinsPresent(dir string, entries []os.DirEntry, pins map[string]string) error {
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Name()] = true
	}
	var missing []string
	for name := range pins {
		if !have[Prefix+name] {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	sort.Strings(missing)
	return fmt.Errorf("a SHA-256 is pinned for plugin %s but %s holds no %s%s: install the plugin there, or remove the pin",
		strings.Join(missing, ", "), dir, Prefix, missing[0])
}

// dropConflicts refuses a second plugin for a scheme or an engine. Pinned
// plugins claim theirs first (in name order), then unpinned ones: an
// unpinned binary never displaces a pinned one, whatever its name.
func (h *Host) dropConflicts() {
	claimed := map[string]*Plugin{} // "scheme s" or "engine e"
	kept := map[*Plugin]bool{}
	for _, pinned := range []bool{true, false} {
		for _, p := range h.plugins {
			if (p.checksum != nil) != pinned {
				continue
			}
			var claims []string
			for _, s := range p.info.Schemes {
				claims = append(claims, "scheme "+s+"://")
			}
			if p.info.Engine != "" {
				claims = append(claims, fmt.Sprintf("engine %q", p.info.Engine))
			}
			reason := ""
			for _, c := range claims {
				other := claimed[c]
				switch {
				case other == nil:
					continue
				case other.checksum != nil && p.checksum == nil:
					reason = fmt.Sprintf("%s is served by the pinned %s and this plugin is not pinned: an unpinned plugin never replaces a pinned one; remove it from the plugin directory", c, other.label())
				default:
					reason = fmt.Sprintf("%s is already served by %s", c, other.label())
				}
				break
			}
			if reason != "" {
				p.kill()
				h.refused = append(h.refused, Refusal{Path: p.info.Path, Reason: reason})
				continue
			}
			for _, c := range claims {
				claimed[c] = p
			}
			kept[p] = true
		}
	}
	all := h.plugins
	h.plugins = nil
	for _, p := range all {
		if kept[p] {
			h.plugins = append(h.plugins, p)
		}
	}
}

// load checks and starts one binary and asks what it serves. A non-empty
// reason refuses it.
func (h *Host) load(ctx context.Context, path string) (*Plugin, string) {
	base := filepath.Base(path)
	name := strings.TrimPrefix(base, Prefix)
	if !nameRE.MatchString(name) {
		return nil, fmt.Sprintf("the name after %s must match %s", Prefix, nameRE)
	}
	p := &Plugin{host: h, info: Info{Name: name, Path: path}, stderr: &tail{max: 4096}}
	if sum, ok := h.opts.Checksums[name]; ok {
		want, err := hex.DecodeString(strings.TrimSpace(sum))
		if err != nil || len(want) != sha256.Size {
			return nil, fmt.Sprintf("the pinned checksum %q is not a hex SHA-256", sum)
		}
		p.checksum = want
	} else if h.opts.RequireChecksums {
		return nil, fmt.Sprintf("not pinned, and pins are required (--require-pins): pin it with --plugin-sha256 %s=$(sha256sum < %s | cut -d' ' -f1), or remove it from the plugin directory", name, path)
	}
	// Checked (type, mode, owner, pinned SHA-256) on the opened file,
	// which is what runs.
	sess, err := p.start()
	if err != nil {
		return nil, err.Error()
	}
	dctx, cancel := context.WithTimeout(ctx, h.opts.StartTimeout)
	defer cancel()
	d, err := pluginpb.NewInfoClient(sess.conn).Describe(dctx, &pluginpb.DescribeRequest{})
	if err != nil {
		p.kill()
		return nil, fmt.Sprintf("it does not answer Describe (%v): not a ckpt plugin built with plugins/sdk?", err)
	}
	p.info.Protocol = int(d.Protocol)
	if d.Protocol != ProtocolVersion {
		p.kill()
		return nil, fmt.Sprintf("it speaks plugin protocol %d, this ckpt speaks %d", d.Protocol, ProtocolVersion)
	}
	switch d.Kind {
	case KindStorage:
		if len(d.Schemes) == 0 {
			p.kill()
			return nil, "a storage plugin that serves no URL scheme"
		}
		p.info.Kind, p.info.Schemes = KindStorage, d.Schemes
	case KindEngine:
		if d.Engine == "" {
			p.kill()
			return nil, "an engine plugin without an engine name"
		}
		p.info.Kind, p.info.Engine = KindEngine, d.Engine
	default:
		p.kill()
		return nil, fmt.Sprintf("unknown plugin kind %q", d.Kind)
	}
	return p, ""
}

// mismatch says that a pinned binary differs, and what to do.
func mismatch(name, path string, want, got []byte) string {
	return fmt.Sprintf("checksum mismatch: plugin %s is pinned to SHA-256 %x but the binary's is %x; "+
		"if the plugin was upgraded on purpose, pin the new hash (sha256sum %s), else reinstall the pinned build", name, want, got, path)
}

// Plugins lists the accepted plugins, by name.
func (h *Host) Plugins() []Info {
	out := make([]Info, len(h.plugins))
	for i, p := range h.plugins {
		out[i] = p.info
	}
	return out
}

// Refused lists the refused binaries, by path.
func (h *Host) Refused() []Refusal { return append([]Refusal(nil), h.refused...) }

// Close stops every plugin process and removes their sockets.
func (h *Host) Close() error {
	for _, p := range h.plugins {
		p.kill()
	}
	if h.runLock != nil {
		os.RemoveAll(h.runDir)
		h.runLock.Close()
		h.runLock = nil
	}
	return nil
}

// Plugin is one accepted plugin binary and its current process.
type Plugin struct {
	host     *Host
	info     Info
	checksum []byte
	stderr   *tail

	mu   sync.Mutex
	sess *session
	gen  uint64
}

// session is one process of a plugin.
type session struct {
	client *plugin.Client
	conn   *grpc.ClientConn
	gen    uint64
	stderr *tail // what this process wrote to stderr, its end
}

// Info describes the plugin.
func (p *Plugin) Info() Info { return p.info }

func (p *Plugin) label() string { return Prefix + p.info.Name }

// start starts a process (the caller holds no lock or is load).
func (p *Plugin) start() (*session, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startLocked()
}

func (p *Plugin) startLocked() (*session, error) {
	bin, execPath, err := p.openBinary(p.host.runDir)
	if err != nil {
		return nil, err
	}
	defer bin.Close()
	log := p.host.opts.Log
	lw := &prefixWriter{prefix: p.label() + ": ", w: log}
	// A tail per process: a call that failed with one process names its
	// last words, not those of the next one a concurrent call started.
	p.stderr = &tail{max: 4096}
	c := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig: wire.Handshake,
		Plugins:         plugin.PluginSet{wire.PluginName: &wire.GRPCPlugin{}},
		// The binary runs from the file openBinary checked, with its
		// sockets in a directory of the host's own that go-plugin
		// removes when the process is stopped or found dead.
		RunnerFunc:       p.runnerFunc(bin, execPath),
		UnixSocketConfig: &plugin.UnixSocketConfig{TempDir: p.host.runDir},
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		StartTimeout:     p.host.opts.StartTimeout,
		Stderr:           io.MultiWriter(p.stderr, lw),
		SyncStdout:       lw,
		SyncStderr:       io.MultiWriter(p.stderr, lw),
		Logger:           hclog.New(&hclog.LoggerOptions{Name: p.label(), Output: log, Level: hclog.Off}),
		GRPCDialOptions: []grpc.DialOption{
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wire.MaxMessageSize), grpc.MaxCallSendMsgSize(wire.MaxMessageSize),
				grpc.ForceCodecV2(wire.Codec{})),
			grpc.WithInitialWindowSize(wire.StreamWindow), grpc.WithInitialConnWindowSize(wire.ConnWindow),
			grpc.WithReadBufferSize(wire.IOBuffer), grpc.WithWriteBufferSize(wire.IOBuffer),
		},
	})
	rpc, err := c.Client()
	if err != nil {
		c.Kill()
		return nil, p.explainStart(err)
	}
	raw, err := rpc.Dispense(wire.PluginName)
	if err != nil {
		c.Kill()
		return nil, fmt.Errorf("handshake failed: %v", err)
	}
	p.gen++
	p.sess = &session{client: c, conn: raw.(*grpc.ClientConn), gen: p.gen, stderr: p.stderr}
	return p.sess, nil
}

// explainStart turns go-plugin's start errors into one line that says
// what is wrong.
func (p *Plugin) explainStart(err error) error {
	msg := err.Error()
	last := p.stderr.lastLine()
	switch {
	case strings.Contains(msg, "incompatible API version"):
		return fmt.Errorf("wrong plugin protocol version (%s); this ckpt speaks protocol %d: rebuild the plugin with this ckpt's plugins/sdk", firstLine(msg), ProtocolVersion)
	case strings.Contains(msg, "incompatible core API version"):
		return fmt.Errorf("wrong go-plugin core protocol (%s): rebuild the plugin with this ckpt's plugins/sdk", firstLine(msg))
	case p.stderr.contains("This binary is a plugin"):
		return errors.New("wrong handshake: the binary did not accept ckpt's magic cookie (a go-plugin plugin of another program, or of an incompatible ckpt)")
	case strings.Contains(msg, "Unrecognized remote plugin message"), strings.Contains(msg, "exited before we could connect"),
		strings.Contains(msg, "timeout while waiting"):
		s := fmt.Sprintf("wrong handshake: %s (not a ckpt plugin, or one built for another program or a different ckpt handshake)", firstLine(msg))
		if last != "" {
			s += "; its stderr: " + last
		}
		return errors.New(s)
	case strings.Contains(msg, "unsupported plugin protocol"):
		return fmt.Errorf("wrong handshake: %s (ckpt plugins speak gRPC)", firstLine(msg))
	}
	return fmt.Errorf("start failed: %s", firstLine(msg))
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// connect returns the running process, starting one if there is none or
// the last one exited.
func (p *Plugin) connect() (*session, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sess != nil && !p.sess.client.Exited() {
		return p.sess, nil
	}
	if p.sess != nil {
		p.sess.client.Kill()
		p.sess = nil
	}
	s, err := p.startLocked()
	if err != nil {
		return nil, fmt.Errorf("plugin %s (%s): %w", p.label(), p.info.Path, err)
	}
	return s, nil
}

func (p *Plugin) kill() {
	p.mu.Lock()
	s := p.sess
	p.sess = nil
	p.mu.Unlock()
	if s != nil {
		s.client.Kill()
	}
}

// exited reports whether the session's process has exited, waiting up to
// d for the host to notice.
func (s *session) exited(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if s.client.Exited() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tail keeps the last bytes a process wrote to stderr.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tail) contains(s string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return bytes.Contains(t.b, []byte(s))
}

// settledLastLine is lastLine once the tail stopped growing for a moment
// (at most wait): a process that just exited may still have output in the
// pipe that go-plugin copies into the tail.
func (t *tail) settledLastLine(wait time.Duration) string {
	size := func() int {
		t.mu.Lock()
		defer t.mu.Unlock()
		return len(t.b)
	}
	deadline := time.Now().Add(wait)
	for n := size(); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		m := size()
		if m == n && m > 0 {
			break
		}
		n = m
	}
	return t.lastLine()
}

// lastLine returns the last non-empty line, or for a Go panic its first
// line ("panic: ...").
func (t *tail) lastLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(t.b)), "\n")
	for _, l := range lines {
		if strings.HasPrefix(l, "panic: ") || strings.HasPrefix(l, "fatal error: ") {
			return strings.TrimSpace(l)
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

// prefixWriter writes each line of a plugin's output with a prefix.
type prefixWriter struct {
	mu     sync.Mutex
	prefix string
	w      io.Writer
	buf    []byte
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		line := append([]byte(w.prefix), w.buf[:i+1]...)
		w.buf = w.buf[i+1:]
		w.w.Write(line)
	}
	if len(w.buf) > 64<<10 {
		w.w.Write(append(append([]byte(w.prefix), w.buf...), '\n'))
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

// Register makes the host's plugins available to storage.Open (for URL
// schemes no built-in backend has) and to engines.Lookup (a plugin engine
// replaces a built-in of the same name).
func (h *Host) Register() {
	storage.SetFallback(fallback{h})
	for _, p := range h.plugins {
		if p.info.Kind == KindEngine {
			engines.Register(&Engine{p: p})
		}
	}
}

type fallback struct{ h *Host }

func (f fallback) Opener(scheme string) (storage.Opener, bool) {
	if f.h.storagePlugin(scheme) == nil {
		return nil, false
	}
	return func(ctx context.Context, u *url.URL) (storage.Store, error) {
		return f.h.OpenStorage(ctx, u.String())
	}, true
}

func (f fallback) Schemes() []string { return f.h.Schemes() }
