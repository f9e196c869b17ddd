// Package engines knows the storage engines whose snapshots ckpt carries.
//
// An Engine answers two questions about its snapshots: which files are
// shared (immutable once written, so they are uploaded once, stored by
// content and reused by later checkpoints) and which are private (uploaded
// with every checkpoint); and whether a restored directory opens as a
// working store. Everything else ckpt does is the same for every engine.
//
// Engines are found by name in a Registry. The default registry holds
// "generic" (any engine whose data files end in .sst or .blob; nothing to
// open) and "rocksdb" (RocksDB's file names; no check in this process).
// Package engines/pebble adds "pebble" to it when imported. The same
// interface is what an engine plugin serves from its own process.
//
// An engine that can build a new store from key ranges of old ones (a
// rescale restore) also implements Rescaler (rescale.go); pebble does.
// The package links nothing else of ckpt: a plugin that links it links
// neither the manifest format nor an engine's library.
package engines

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Kind says how a file of a snapshot is stored: the engine's answer to
// Classify. Package manifests records it per file (manifests.Kind is this
// type), so that every part of ckpt and every plugin speaks of one kind.
type Kind string

const (
	// Shared files (*.sst, *.blob) are immutable: content-addressed objects
	// under <job>/shared/, uploaded once and referenced by many checkpoints.
	Shared Kind = "shared"
	// Private files (MANIFEST-*, CURRENT, OPTIONS-*, WAL, ...) are stored with
	// each checkpoint, inline in the manifest when small.
	Private Kind = "private"
)

// Engine is one storage engine.
type Engine interface {
	// Name is the engine's name in requests and manifests: lower case,
	// at most 64 bytes, stable across releases.
	Name() string
	// Classify says whether the snapshot file called name (a base name,
	// never a path) is Shared or Private. It must be a pure function of
	// the name: the same answer every time, on every node.
	// A file wrongly called shared that the engine later rewrites in place
	// would be restored stale, so when in doubt an engine says private.
	Classify(name string) Kind
	// Check opens the store in dir read-only and reads it through, proving
	// that the restored files form a store the engine accepts. It must not
	// change dir. An engine that cannot open its stores in this process
	// returns a Result with Checked false and a nil error. It honours ctx.
	Check(ctx context.Context, dir string) (Result, error)
}

// Result is what Check proved.
type Result struct {
	// Checked is true when the store was opened and read through.
	Checked bool
	// Keys is the number of keys read (0 when not checked).
	Keys int64
}

// Generic is the engine of a request that names none: files ending in .sst
// or .blob are shared, every other file is private, and nothing is checked.
const Generic = "generic"

// ErrUnknown is returned (wrapped) by Lookup for a name no engine has.
var ErrUnknown = errors.New("unknown engine")

// Registry maps names to engines. Its methods are safe for concurrent use.
type Registry struct {
	mu      sync.RWMutex
	engines map[string]Engine
}

// NewRegistry returns a registry holding the built-in engines that need no
// import of their own: generic and rocksdb.
func NewRegistry() *Registry {
	r := &Registry{engines: map[string]Engine{}}
	r.Register(suffixEngine{name: Generic})
	r.Register(rocksDB{})
	return r
}

// Register adds e, replacing an engine of the same name (a plugin may stand
// in for a built-in).
func (r *Registry) Register(e Engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.engines[e.Name()] = e
}

// Lookup returns the engine called name; "" means Generic. An unknown name
// is an error naming the engines there are.
func (r *Registry) Lookup(name string) (Engine, error) {
	if name == "" {
		name = Generic
	}
	r.mu.RLock()
	e, ok := r.engines[name]
	r.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w %q: known engines are %s", ErrUnknown, name, strings.Join(r.Names(), ", "))
	}
	return e, nil
}

// Names lists the registered engines, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.engines))
	for n := range r.engines {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Default is the registry commands and the agent use unless told otherwise.
var Default = NewRegistry()

// Register adds e to Default.
func Register(e Engine) { Default.Register(e) }

// Lookup finds name in Default.
func Lookup(name string) (Engine, error) { return Default.Lookup(name) }

// Check looks up the engine called name in Default and checks dir with it.
// An engine this build does not know is not an error here (a manifest may
// name an engine served by a plugin that is not installed): the result is
// not checked.
func Check(ctx context.Context, name, dir string) (Result, error) {
	e, err := Lookup(name)
	if errors.Is(err, ErrUnknown) {
		return Result{}, nil
	}
	if err != nil {
		return Result{}, err
	}
	return e.Check(ctx, dir)
}

// SharedBySuffix classifies the way LSM engines name their files: *.sst
// and *.blob are immutable data files (shared), everything else private.
func SharedBySuffix(name string) Kind {
	if strings.HasSuffix(name, ".sst") || strings.HasSuffix(name, ".blob") {
		return Shared
	}
	return Private
}

// suffixEngine classifies by SharedBySuffix and checks nothing.
type suffixEngine struct{ name string }

func (e suffixEngine) Name() string                                { return e.name }
func (suffixEngine) Classify(name string) Kind                     { return SharedBySuffix(name) }
func (suffixEngine) Check(context.Context, string) (Result, error) { return Result{}, nil }

// rocksDB knows RocksDB's file names: table files (*.sst) and blob files
// (*.blob) are written once and never changed; MANIFEST-*, CURRENT,
// OPTIONS-*, IDENTITY, LOCK, LOG* and the WAL (*.log) are private. Opening
// a RocksDB store needs cgo, which stays out of this binary: Check proves
// nothing here.
type rocksDB struct{}

func (rocksDB) Name() string                                  { return "rocksdb" }
func (rocksDB) Classify(name string) Kind                     { return SharedBySuffix(name) }
func (rocksDB) Check(context.Context, string) (Result, error) { return Result{}, nil }
