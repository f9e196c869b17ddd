package plugins

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ckpt-io/ckpt/engines"
	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/plugins/proto"
)

// classifyTimeout bounds one Classify call (Engine.Classify has no ctx).
const classifyTimeout = 30 * time.Second

// Engine returns the engine a plugin serves under name.
func (h *Host) Engine(name string) (engines.Engine, bool) {
	for _, p := range h.plugins {
		if p.info.Kind == KindEngine && p.info.Engine == name {
			return &Engine{p: p}, true
		}
	}
	return nil, false
}

// Engine is an engines.Engine served by a plugin. Classify answers are
// cached (the contract makes them a pure function of the name); a
// Classify that fails says private, which is always safe, and the failure
// is written to the host's log.
type Engine struct {
	p     *Plugin
	cache sync.Map // name -> manifests.Kind
}

var _ engines.Engine = (*Engine)(nil)

// Name implements engines.Engine.
func (e *Engine) Name() string { return e.p.info.Engine }

// Classify implements engines.Engine.
func (e *Engine) Classify(name string) manifests.Kind {
	if k, ok := e.cache.Load(name); ok {
		return k.(manifests.Kind)
	}
	ctx, cancel := context.WithTimeout(context.Background(), classifyTimeout)
	defer cancel()
	kinds, err := e.ClassifyAll(ctx, []string{name})
	if err != nil {
		fmt.Fprintf(e.p.host.opts.Log, "%s: classify %q: %v (treated as private)\n", e.p.label(), name, err)
		return manifests.Private
	}
	return kinds[0]
}

// ClassifyAll classifies many names in one call.
func (e *Engine) ClassifyAll(ctx context.Context, names []string) ([]manifests.Kind, error) {
	sess, err := e.p.connect()
	if err != nil {
		return nil, err
	}
	r, err := pluginpb.NewEngineClient(sess.conn).Classify(ctx, &pluginpb.ClassifyRequest{Names: names})
	if err != nil {
		return nil, e.p.fail(ctx, sess, "classify", err)
	}
	if len(r.Kinds) != len(names) {
		return nil, fmt.Errorf("classify: plugin %s answered %d kinds for %d names", e.p.label(), len(r.Kinds), len(names))
	}
	out := make([]manifests.Kind, len(names))
	for i, k := range r.Kinds {
		switch manifests.Kind(k) {
		case manifests.Shared, manifests.Private:
			out[i] = manifests.Kind(k)
		default:
			return nil, fmt.Errorf("classify %q: plugin %s answered %q, want shared or private", names[i], e.p.label(), k)
		}
		e.cache.Store(names[i], out[i])
	}
	return out, nil
}

// Check implements engines.Engine.
func (e *Engine) Check(ctx context.Context, dir string) (engines.Result, error) {
	sess, err := e.p.connect()
	if err != nil {
		return engines.Result{}, err
	}
	r, err := pluginpb.NewEngineClient(sess.conn).Check(ctx, &pluginpb.CheckRequest{Dir: dir})
	if err != nil {
		return engines.Result{}, e.p.fail(ctx, sess, "check "+dir, err)
	}
	return engines.Result{Checked: r.Checked, Keys: r.Keys}, nil
}
