package pebble

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"runtime"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/zeebo/blake3"
	"golang.org/x/sync/errgroup"

	"github.com/ckpt-io/ckpt/engines"
)

// newPairHash returns the hash of the check's key/value pairs: BLAKE3,
// as strong as SHA-256 against a difference and about twice as fast here.
func newPairHash() hash.Hash { return blake3.New() }

// hashKV adds one key/value pair to h: each as uvarint length and bytes.
func hashKV(h hash.Hash, k, v []byte) {
	var b [binary.MaxVarintLen64]byte
	h.Write(b[:binary.PutUvarint(b[:], uint64(len(k)))])
	h.Write(k)
	h.Write(b[:binary.PutUvarint(b[:], uint64(len(v)))])
	h.Write(v)
}

// verifyRescaled opens the new store in dir read-only and checks it
// against the old stores, reading both at once: for each piece of each
// old task, the count and BLAKE3 sum of the new store's keys in the piece
// (clipped to the task's extent) must equal those of the old store's keys
// in the piece (read now for a task whose tables were ingested, while
// rewriting for the others); and the new store must hold no key outside
// the tasks' extents, which lie inside [Start, End) and are disjoint. It
// returns the number of keys.
func verifyRescaled(ctx context.Context, dir string, o engines.RescaleRequest, olds []*oldTask) (int64, error) {
	db, err := pebble.Open(dir, &pebble.Options{ReadOnly: true, Logger: quiet{}})
	if err != nil {
		return 0, fmt.Errorf("rescale restore: the new store does not open: %w", err)
	}
	defer db.Close()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(runtime.GOMAXPROCS(0))
	var exts []span
	for _, t := range olds {
		if t.keyed {
			exts = append(exts, t.extent)
		}
		for _, p := range t.pieces {
			if t.rewrite == "" {
				g.Go(func() error { return p.copy(gctx, sstable.WriterOptions{}, "") })
			}
			g.Go(func() error { return p.verifyNew(gctx, db) })
		}
	}
	slices.SortFunc(exts, func(a, b span) int {
		switch {
		case a.lo == nil:
			return -1
		case b.lo == nil:
			return 1
		}
		return bytes.Compare(a.lo, b.lo)
	})
	// The gaps around the extents: below the first, between, above the last.
	gap, open := span{}, true
	for _, e := range exts {
		if e.lo != nil && (open || bytes.Compare(gap.lo, e.lo) < 0) {
			gp := span{gap.lo, e.lo}
			g.Go(func() error { return noKeys(gctx, db, o, gp) })
		}
		if e.hi == nil {
			open = false
			gap.lo = nil
			break
		}
		gap, open = span{lo: e.hi}, false
	}
	if gap.lo != nil || len(exts) == 0 {
		gp := span{lo: gap.lo}
		g.Go(func() error { return noKeys(gctx, db, o, gp) })
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	var keys int64
	for _, t := range olds {
		for _, p := range t.pieces {
			if p.newKeys != p.keys || p.newSum != p.sum {
				return 0, fmt.Errorf("rescale restore: the new store holds %d keys (blake3 %s) in [%x, %x) from task %s, its checkpoint %d holds %d (blake3 %s)",
					p.newKeys, p.newSum, p.lo, p.hi, t.task, t.src.Checkpoint, p.keys, p.sum)
			}
			keys += p.newKeys
		}
	}
	return keys, nil
}

// verifyNew counts and hashes the new store's keys in the piece, clipped
// to its task's extent.
func (p *piece) verifyNew(ctx context.Context, db *pebble.DB) error {
	h := newPairHash()
	defer func() { p.newSum = hex.EncodeToString(h.Sum(nil)) }()
	s, ok := span{p.lo, p.hi}.clip(p.t.extent)
	if !p.t.keyed || !ok {
		return nil
	}
	it, err := db.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: s.lo, UpperBound: s.hi})
	if err != nil {
		return fmt.Errorf("rescale restore: read the new store: %w", err)
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		if p.newKeys%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("rescale restore: read the new store: %w", err)
		}
		hashKV(h, it.Key(), v)
		p.newKeys++
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("rescale restore: read the new store: %w", err)
	}
	return nil
}

// noKeys checks that the new store holds no key in s, where no old task
// put any.
func noKeys(ctx context.Context, db *pebble.DB, o engines.RescaleRequest, s span) error {
	it, err := db.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: s.lo, UpperBound: s.hi})
	if err != nil {
		return fmt.Errorf("rescale restore: read the new store: %w", err)
	}
	defer it.Close()
	if it.First() {
		k := it.Key()
		if !(span{o.Start, o.End}).contains(k) {
			return fmt.Errorf("rescale restore: the new store holds key %x outside the range [%x, %x)", k, o.Start, o.End)
		}
		return fmt.Errorf("rescale restore: the new store holds key %x, which no old task holds", k)
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("rescale restore: read the new store: %w", err)
	}
	return nil
}
