package wal

import (
	"context"
	"fmt"

	"github.com/ckpt-io/ckpt/manifests"
	"github.com/ckpt-io/ckpt/storage"
)

// Which WAL a restore may use (invariant 9: a fenced owner's commits are
// never used). The WAL of checkpoint n written by the owner of epoch e
// extends the store that owner had; once a newer owner took the task over,
// e may go on shipping (a partitioned zombie) writes that the new owner
// never saw. So the WAL of (n, e) is used only when e wrote n's valid
// manifest, and either e is the task's newest ownership epoch, or the next
// owner's record says its state was restored from exactly (n, e) up to
// manifest S (Owner.WALResumed): then only up to S, the writes the new
// owner went on from. A next owner whose record says anything else (or
// nothing) resumed from somewhere else, and no WAL of e is used: the
// restore falls back to the checkpoint, which loses no write the newer
// owners acknowledged after it that a checkpoint of theirs would not hold.

// Usable says how far the WAL of checkpoint n by epoch (the epoch of n's
// valid manifest) may be used: use false (and why) for none, else up to
// manifest upTo (0: the whole chain).
func Usable(ctx context.Context, s storage.Store, job, task string, n, epoch uint64) (use bool, upTo uint64, why string, err error) {
	owners, err := manifests.ListOwners(ctx, s, job, task, epoch)
	if err != nil {
		return false, 0, "", err
	}
	for _, k := range owners.Epochs {
		if k <= epoch {
			continue
		}
		rec := owners.Records[k]
		r := rec.WALResumed
		if r == nil || r.Checkpoint != n || r.Epoch != epoch || r.Seq == 0 {
			return false, 0, fmt.Sprintf("owner %d took the task over from epoch %d without resuming from its WAL of checkpoint %d", k, epoch, n), nil
		}
		return true, r.Seq, "", nil
	}
	return true, 0, "", nil
}

// UsableChain returns the WAL chain a restore of checkpoint n (whose valid
// manifest epoch wrote) uses: the manifests Usable allows, from seq 1 to
// the first missing one. why says why none is used when it is empty for
// another reason than an absent WAL. A chain shorter than the seq a newer
// owner resumed from is an error: those manifests were in storage, and the
// newer owner's writes went on from them.
func UsableChain(ctx context.Context, s storage.Store, job, task string, n, epoch uint64) (chain []*Manifest, why string, err error) {
	use, upTo, why, err := Usable(ctx, s, job, task, n, epoch)
	if err != nil || !use {
		return nil, why, err
	}
	chain, why, err = readChain(ctx, s, job, task, n, epoch, upTo)
	if err != nil {
		return nil, "", err
	}
	if upTo > 0 && uint64(len(chain)) < upTo {
		return nil, "", fmt.Errorf("wal of %s/%s checkpoint %d epoch %d: a newer owner resumed from manifest %d, but storage holds the chain only to %d: storage lost WAL manifests (restore with --to checkpoint to leave the WAL out)",
			job, task, n, epoch, upTo, len(chain))
	}
	return chain, why, nil
}

// readChain reads the WAL manifests of checkpoint n by epoch from seq 1 to
// the first missing one (or to upTo when upTo > 0). Unlike Chain it leaves
// the continuity of logs across manifests to Apply, which stops at a hole
// with the snapshot in view rather than failing the restore; a manifest
// that does not decode still fails it (a bad object in storage).
func readChain(ctx context.Context, s storage.Store, job, task string, n, epoch, upTo uint64) ([]*Manifest, string, error) {
	seqs, err := Seqs(ctx, s, job, task, n, epoch)
	if err != nil {
		return nil, "", err
	}
	var out []*Manifest
	for i, seq := range seqs {
		if upTo > 0 && seq > upTo {
			break
		}
		if seq != uint64(i+1) {
			return out, fmt.Sprintf("wal manifest %d is missing: manifest %d and later are not used", i+1, seq), nil
		}
		if err := ctx.Err(); err != nil {
			return nil, "", err
		}
		m, err := Load(ctx, s, job, task, n, epoch, seq)
		if err != nil {
			return nil, "", fmt.Errorf("%w (restore with --to checkpoint to leave the WAL out)", err)
		}
		out = append(out, m)
	}
	return out, "", nil
}
