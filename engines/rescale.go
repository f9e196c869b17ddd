package engines

import "context"

// Rescaler is an Engine that can build a new store from parts of old
// ones: a rescale restore (`ckpt restore --rescale-from`), where a job's
// key space moves to more or fewer tasks than its checkpoint was taken
// with, and a new task's store is built from the key range it owns out of
// the old tasks' checkpoints. An engine that cannot do this does not
// implement Rescaler, and a rescale restore of its stores is refused,
// naming the engines that can. The built-in pebble engine (package
// engines/pebble) is one; engines served by plugins are not.
//
// The caller (package restore) chooses the checkpoints, fetches and
// verifies the files, and makes the result appear whole; the engine
// decides which files it needs and builds the store. The contract:
//
//   - The engine reads the old stores only from files it had fetched into
//     its scratch directory through req.Fetch, which writes each file
//     checked against its checkpoint's manifest (size and hash) or fails.
//     It may fetch the files of a source in any number of calls (its
//     private files first, then only the data files it needs), but each
//     file at most once into a directory.
//   - It writes only below req.Scratch and into req.Target. Target is an
//     empty directory the caller renames into place once Rescale returns
//     with no error, so a failed or cancelled Rescale leaves nothing
//     anyone sees; Scratch is on Target's filesystem (files may be linked
//     from one to the other) and the caller removes it afterwards.
//   - The new store holds exactly the keys (and their values) that the
//     old stores show in [req.Start, req.End), and no other. Sources whose
//     keys in the range overlap each other are an error: rescale restores
//     stores that partition the key space.
//   - Before it returns, the engine opens the new store and checks it
//     against the old stores, and says so in RescaleReport.Verified.
//   - It honours ctx, and returns with nothing open and no goroutine of
//     its own still running. Its errors name the task and checkpoint
//     (and file, where there is one) they are about.
type Rescaler interface {
	Engine
	// HoldsKeys reports, per source of req, whether its store holds keys
	// in [req.Start, req.End): an empty string when it holds none, else
	// where it holds one (such as "its table 000012.sst meets it"). It
	// fetches as little as it can (a pebble store: its private files
	// alone) and ignores req.Target. A rescale from some tasks of a
	// checkpoint asks it of the others, so that their keys are not lost
	// without a word.
	HoldsKeys(ctx context.Context, req RescaleRequest) ([]string, error)
	// Rescale builds the new store in req.Target from req.Sources, keeping
	// their keys in [req.Start, req.End), and checks it (see the contract
	// above).
	Rescale(ctx context.Context, req RescaleRequest) (*RescaleReport, error)
}

// RescaleRequest is one rescale restore, as the engine sees it.
type RescaleRequest struct {
	// Sources are the old tasks' checkpoints.
	Sources []RescaleSource
	// Start and End bound the range [Start, End); nil is open.
	Start, End []byte
	// Target is the empty directory the new store is built in.
	Target string
	// Scratch is an empty directory on Target's filesystem for the
	// engine's own use: the old stores' files are fetched below it.
	Scratch string
	// Fetch writes the named files of the sources into directories below
	// Scratch, each checked against its manifest, in parallel.
	Fetch Fetcher
}

// RescaleSource is one old task's checkpoint.
type RescaleSource struct {
	Task       string
	Checkpoint uint64
	// Files are the checkpoint's files, as its manifest lists them.
	Files []SourceFile
}

// SourceFile is one file of an old checkpoint.
type SourceFile struct {
	Name string
	Kind Kind
	Size int64
}

// Fetcher writes files of a rescale's sources where the engine asks, each
// verified; it fails when any of them does not arrive whole and right.
type Fetcher func(ctx context.Context, files []FetchFile) error

// FetchFile asks for one file of one source.
type FetchFile struct {
	// Source is the index of the source in RescaleRequest.Sources.
	Source int
	// Name is one of its Files' names.
	Name string
	// Dir is an existing directory below RescaleRequest.Scratch that does
	// not hold a file of that name.
	Dir string
}

// RescaleReport is what a rescale built.
type RescaleReport struct {
	// Sources has one entry per source of the request, in its order.
	Sources []SourceReport
	// Keys counts the new store's keys.
	Keys int64
	// Verified is true when the new store was opened after it was built
	// and checked against the old stores, key by key or by sums over them.
	Verified bool
	// FetchMS, BuildMS and VerifyMS split the time: fetching the old
	// files (and reading what to fetch), building the new store, checking
	// it.
	FetchMS, BuildMS, VerifyMS int64
}

// SourceReport is what one old task contributed.
type SourceReport struct {
	// Keys counts its keys in the range; First and Last are the first and
	// last of them (nil when none).
	Keys        int64
	First, Last []byte
	// BytesInRange is the engine's estimate of the old store's bytes in
	// the range.
	BytesInRange int64
	// TablesIngested and BytesIngested count the old data files taken
	// into the new store unchanged (their bytes are the old objects'),
	// DeltaKeys the keys written above them from the task's newer data.
	// Rewritten says why the task's keys were rewritten instead; empty
	// when its files were taken unchanged.
	TablesIngested int
	BytesIngested  int64
	DeltaKeys      int64
	Rewritten      string
}
