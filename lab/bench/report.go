package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ckpt-io/ckpt/internal/human"
)

// Report is what a run measured; its JSON is `ckpt-bench --json`. A figure
// whose section did not run (or failed: see Errors) is null.
type Report struct {
	Config            Config             `json:"config"`
	Amplification     *Amplification     `json:"amplification"`
	IncrementalVsFull *IncrementalVsFull `json:"incremental_vs_full"`
	Restore           *RestoreFigure     `json:"local_vs_remote_restore"`
	AppThroughput     *AppThroughput     `json:"app_throughput"`
	WAL               *WALShipping       `json:"wal_shipping"`
	Transfer          *Transfer          `json:"transfer"`
	EndToEnd          *EndToEnd          `json:"end_to_end"`
	Pause             []Pause            `json:"pause"`
	Memory            *Memory            `json:"memory"`
	Rescale           *Rescale           `json:"rescale"`
	Shapes            *Shapes            `json:"shapes"`
	Scale             *Scale             `json:"scale"`
	// Series is the raw per-checkpoint series of the incremental section.
	Series    []CheckpointSample `json:"series"`
	Targets   []Target           `json:"targets"`
	Errors    []string           `json:"errors"`
	DurationS float64            `json:"duration_s"`
}

// Config echoes what the run was asked for.
type Config struct {
	Storage     string   `json:"storage"`
	StateBytes  int64    `json:"state_bytes"`
	Churn       float64  `json:"churn"`
	Checkpoints int      `json:"checkpoints"`
	Quick       bool     `json:"quick"`
	Sections    []string `json:"sections"`
	Seed        uint64   `json:"seed"`
}

// Amplification is bytes written to storage over bytes of new shared
// files plus private files, per checkpoint (in Series) and over the run.
type Amplification struct {
	// Overall is the sum of bytes written over the sum of new bytes, all checkpoints.
	Overall float64 `json:"overall"`
	Max     float64 `json:"max"`
	Median  float64 `json:"median"`
	// BytesWritten and NewBytes are the sums behind Overall.
	BytesWritten int64 `json:"bytes_written"`
	NewBytes     int64 `json:"new_bytes"`
}

// IncrementalVsFull compares the incremental agent with one that uploads
// every file, on the same snapshots, over checkpoints 2..N (the first is
// a full upload for both).
type IncrementalVsFull struct {
	Churn float64 `json:"churn"`
	// BytesRatio and DurationRatio are sums over checkpoints 2..N.
	BytesRatio          float64 `json:"bytes_ratio"`
	DurationRatio       float64 `json:"duration_ratio"`
	MedianBytesRatio    float64 `json:"median_bytes_ratio"`
	MedianDurationRatio float64 `json:"median_duration_ratio"`
	IncrementalBytes    int64   `json:"incremental_bytes"`
	FullBytes           int64   `json:"full_bytes"`
	IncrementalMS       float64 `json:"incremental_ms"`
	FullMS              float64 `json:"full_ms"`
	// NewBytesRatio is the store's own floor: the bytes of the files each
	// checkpoint has and its parent has not, over the full size, summed
	// over checkpoints 2..N. No checkpoint that ships files can ship less.
	// LSMBytesRatio is what Pebble wrote (flushes and compactions) between
	// checkpoints, over the same full sizes.
	NewBytesRatio float64 `json:"new_bytes_ratio"`
	LSMBytesRatio float64 `json:"lsm_bytes_ratio"`
}

// CheckpointSample is one checkpoint of the incremental section.
type CheckpointSample struct {
	Checkpoint uint64 `json:"checkpoint"`
	Files      int    `json:"files"`
	// FullSize is every byte the checkpoint references; NewBytes the new
	// shared files plus the private files (what it must ship).
	FullSize int64 `json:"full_size"`
	NewBytes int64 `json:"new_bytes"`
	Writes   int   `json:"writes"`
	// FlushedBytes and CompactedBytes are the SST bytes Pebble wrote by
	// flushes and by compactions since the previous checkpoint: the new
	// files an incremental checkpoint must ship come from these.
	FlushedBytes   int64 `json:"lsm_flushed_bytes"`
	CompactedBytes int64 `json:"lsm_compacted_bytes"`
	// The incremental agent: bytes written to storage (objects and
	// manifest), its checkpoint_size, files uploaded and reused, the app's
	// pause (request sent to synced read), the agent's sync_ms and the
	// duration from request to completed.
	BytesWritten   int64   `json:"bytes_written"`
	CheckpointSize int64   `json:"checkpoint_size"`
	FilesUploaded  int     `json:"files_uploaded"`
	FilesReused    int     `json:"files_reused"`
	Amplification  float64 `json:"amplification"`
	PauseMS        float64 `json:"pause_ms"`
	SyncMS         int64   `json:"sync_ms"`
	DurationMS     float64 `json:"duration_ms"`
	// The full-upload agent on the same snapshot.
	FullBytesWritten int64   `json:"full_bytes_written"`
	FullDurationMS   float64 `json:"full_duration_ms"`
	BytesRatio       float64 `json:"bytes_ratio"`
	DurationRatio    float64 `json:"duration_ratio"`
}

// RestoreFigure times restores of one checkpoint from the local copy and
// from storage alone, each verified key by key against the workload model.
type RestoreFigure struct {
	Checkpoint uint64  `json:"checkpoint"`
	Files      int     `json:"files"`
	Bytes      int64   `json:"bytes"`
	LocalMS    float64 `json:"local_ms"`
	RemoteMS   float64 `json:"remote_ms"`
	Speedup    float64 `json:"speedup"`
	// LocalIdentityMS is the local restore with --verify-local=identity:
	// unchanged inodes trusted instead of hashed.
	LocalIdentityMS float64 `json:"local_identity_ms"`
	SpeedupIdentity float64 `json:"speedup_identity"`
	// SHA256BytesPerS is this machine's SHA-256 rate on all cores, and
	// SpeedupBound the most a restore that hashes every local byte can gain
	// over this remote restore: remote time / (bytes / SHA256BytesPerS).
	SHA256BytesPerS float64 `json:"sha256_bytes_per_s"`
	SpeedupBound    float64 `json:"speedup_bound_sha256"`
	// BLAKE3BytesPerS and SpeedupBoundBLAKE3 are the same for BLAKE3, the
	// hash of the files a format 2 manifest adds.
	BLAKE3BytesPerS    float64 `json:"blake3_bytes_per_s"`
	SpeedupBoundBLAKE3 float64 `json:"speedup_bound_blake3"`
	BytesLocal         int64   `json:"bytes_local"`
	BytesRemote        int64   `json:"bytes_remote"`
	LocalVerified      bool    `json:"local_verified"`
	RemoteVerified     bool    `json:"remote_verified"`
	Keys               int     `json:"keys"`
	Error              string  `json:"error,omitempty"`
}

// AppThroughput is the workload's write rate (wall clock, pauses
// included) with a checkpoint every interval against none.
type AppThroughput struct {
	IntervalMS         float64 `json:"interval_ms"`
	PhaseMS            float64 `json:"phase_ms"`
	WithoutWritesPerS  float64 `json:"without_writes_per_s"`
	WithWritesPerS     float64 `json:"with_writes_per_s"`
	Ratio              float64 `json:"ratio"`
	Checkpoints        int     `json:"checkpoints"`
	CheckpointsRefused int     `json:"checkpoints_refused"`
	// Agent says how the agent ran: a separate process, as a sidecar is
	// deployed, at a lower CPU priority than the app.
	Agent string `json:"agent"`
	// Storage is where the agent uploaded.
	Storage string `json:"storage,omitempty"`
	// OffNode is the same run with the storage off the app's disk and
	// cores (a file store on tmpfs); Reason says why it was not measured.
	OffNode *AppThroughput `json:"off_node,omitempty"`
	Reason  string         `json:"reason,omitempty"`
	// OwnCheckpoints is the same run with no agent: the app takes Pebble's
	// checkpoint every interval and removes it at once. Its ratio is what
	// the app's own snapshots cost, whoever ships them.
	OwnCheckpoints *AppThroughput `json:"own_checkpoints,omitempty"`
	// OwnCheckpointsHashing adds to it, in the phases with checkpoints, a
	// process at the agent's priority hashing HashLoadBytesPerS with
	// SHA-256: the bytes per second the agent shipped (storage off the
	// node), hashed and nothing else. Its ratio is the most an agent that
	// stores content-addressed objects could leave on this machine.
	OwnCheckpointsHashing *AppThroughput `json:"own_checkpoints_hashing,omitempty"`
	HashLoadBytesPerS     int64          `json:"hash_load_bytes_per_s,omitempty"`
	// OwnCheckpointsCopying ships the app's checkpoints with no agent: a
	// process at the agent's priority copies each checkpoint's new files
	// (by name and size) to tmpfs, where the agent off the node stores its
	// objects, reading and writing each byte once and doing nothing else
	// (CopyLoad). Its ratio is the most an agent shipping those files
	// there could leave on this machine.
	OwnCheckpointsCopying *AppThroughput `json:"own_checkpoints_copying,omitempty"`
	// ShippedMBPerS is what the agent wrote to storage per second over the
	// phases with checkpoints.
	ShippedMBPerS float64 `json:"shipped_mb_per_s"`
	// PauseP50MS and PauseMaxMS are what the app's checkpoint goroutine
	// waited per checkpoint (Pebble checkpoint, request to synced);
	// SnapshotP50MS the Pebble checkpoint alone.
	PauseP50MS      float64   `json:"pause_p50_ms"`
	SnapshotP50MS   float64   `json:"snapshot_p50_ms"`
	PauseMaxMS      float64   `json:"pause_max_ms"`
	PhaseWritesPerS []float64 `json:"phase_writes_per_s"`
	Phases          []string  `json:"phases"`
	// PhaseCores is the CPU each process used per phase, in cores (CPU
	// seconds over the phase's seconds; the machine has Cores): the app
	// (the bench process, whose other work is idle then), the agent, and
	// the storage server when the bench started it. OnCores and OffCores
	// sum them over the phases with and without checkpoints.
	Cores      int         `json:"cores"`
	PhaseCores []CoreShare `json:"phase_cores"`
	OnCores    CoreShare   `json:"on_cores"`
	OffCores   CoreShare   `json:"off_cores"`
	// PhaseStallMS is, per phase, how long Pebble held the app's writes
	// back while its flushes and compactions caught up (write stalls).
	PhaseStallMS []float64 `json:"phase_stall_ms"`
	// PhaseLSMWrittenMBPerS is what Pebble's flushes and compactions wrote
	// per second in each phase; PhaseShippedMBPerS what the phase's
	// checkpoints wrote to storage per second: the files that were new at a
	// checkpoint. Files written and compacted away again between two
	// checkpoints are never shipped, so the longer the interval, the smaller
	// the second against the first.
	PhaseLSMWrittenMBPerS []float64 `json:"phase_lsm_written_mb_per_s"`
	PhaseShippedMBPerS    []float64 `json:"phase_shipped_mb_per_s"`
	// AgentCPUSecondsPerGB is the agent's CPU time over the bytes it
	// shipped in the phases with checkpoints: its cost per byte, which the
	// throughput ratio only shows through the noise of the app's rate.
	AgentCPUSecondsPerGB float64 `json:"agent_cpu_s_per_gb"`
	// BlockRatios is the ratio of each off-on-on-off block alone.
	BlockRatios []float64 `json:"block_ratios"`
	// UploadLagMS is, per phase with checkpoints, how long after the
	// phase's end its last upload completed: what the agent had not caught
	// up with when the writes were counted.
	UploadLagMS []float64 `json:"upload_lag_ms"`
}

// CoreShare is CPU use in cores.
type CoreShare struct {
	App     float64 `json:"app"`
	Agent   float64 `json:"agent"`
	Storage float64 `json:"storage"`
}

// Transfer compares upload and restore throughput on the same data.
type Transfer struct {
	Files int    `json:"files"`
	Bytes int64  `json:"bytes"`
	Tools []Tool `json:"tools"`
	// Ratios of ckpt's throughput to rclone's.
	UploadVsRclone  float64 `json:"upload_vs_rclone"`
	RestoreVsRclone float64 `json:"restore_vs_rclone"`
}

// Tool is one tool's upload and restore of the transfer data.
type Tool struct {
	Tool      string `json:"tool"`
	Version   string `json:"version,omitempty"`
	Available bool   `json:"available"`
	// Reason says why a tool is missing or what failed.
	Reason string `json:"reason,omitempty"`
	// Where is where the tool wrote ("storage" or a note such as "local dir").
	Where            string  `json:"where,omitempty"`
	Bytes            int64   `json:"bytes"`
	UploadMS         float64 `json:"upload_ms"`
	RestoreMS        float64 `json:"restore_ms"`
	UploadBytesPerS  float64 `json:"upload_bytes_per_s"`
	RestoreBytesPerS float64 `json:"restore_bytes_per_s"`
	RestoreVerified  bool    `json:"restore_verified"`
	Note             string  `json:"note,omitempty"`
}

// EndToEnd is a checkpoint that adds 1.5% to the state, end to end.
type EndToEnd struct {
	StateBytes int64 `json:"state_bytes"`
	AddedBytes int64 `json:"added_bytes"`
	// CkptMS is flush + Pebble checkpoint + request until completed;
	// the parts follow.
	CkptMS     float64 `json:"ckpt_ms"`
	SnapshotMS float64 `json:"snapshot_ms"`
	// FlushMS is the part of SnapshotMS spent flushing the memtables.
	FlushMS        float64         `json:"flush_ms"`
	PauseMS        float64         `json:"pause_ms"`
	UploadMS       float64         `json:"upload_ms"`
	CheckpointSize int64           `json:"checkpoint_size"`
	FilesUploaded  int             `json:"files_uploaded"`
	Peers          []PeerIncrement `json:"peers"`
	Scaled         bool            `json:"scaled"`
}

// PeerIncrement is a peer's time to ship the same increment.
type PeerIncrement struct {
	Tool      string  `json:"tool"`
	Available bool    `json:"available"`
	Reason    string  `json:"reason,omitempty"`
	MS        float64 `json:"ms"`
}

// Pause is the app's pause at a number of files in the snapshot. Mode is
// "handoff" (the agent renames the dir: what client/pebble's Checkpoint
// sends) or "link" (the agent hard-links every file; the app keeps dir).
type Pause struct {
	Files   int       `json:"files"`
	Mode    string    `json:"mode"`
	Samples int       `json:"samples"`
	P50MS   float64   `json:"p50_ms"`
	P99MS   float64   `json:"p99_ms"`
	MaxMS   float64   `json:"max_ms"`
	RawMS   []float64 `json:"raw_ms"`
}

// Memory is the agent process's peak RSS while uploading a large checkpoint.
type Memory struct {
	CheckpointBytes int64   `json:"checkpoint_bytes"`
	Files           int     `json:"files"`
	FileBytes       int64   `json:"file_bytes"`
	PeakRSSBytes    int64   `json:"peak_rss_bytes"`
	BaselineRSS     int64   `json:"baseline_rss_bytes"`
	UploadMS        float64 `json:"upload_ms"`
	UploadBytesPerS float64 `json:"upload_bytes_per_s"`
	Scaled          bool    `json:"scaled"`
}

// Target is one figure against its target.
type Target struct {
	Name     string  `json:"name"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Op       string  `json:"op"` // "<=" or ">="
	Target   float64 `json:"target"`
	Measured bool    `json:"measured"`
	Pass     bool    `json:"pass"`
	// Scaled marks a figure measured at a smaller size than its target names.
	Scaled bool   `json:"scaled"`
	Note   string `json:"note,omitempty"`
}

func newReport(o Options) *Report {
	secs := o.Only
	if len(secs) == 0 {
		secs = Sections
	}
	return &Report{
		Config: Config{StateBytes: o.StateBytes, Churn: o.Churn, Checkpoints: o.Checkpoints, Quick: o.Quick, Sections: secs, Seed: o.Seed},
		Pause:  []Pause{}, Series: []CheckpointSample{}, Errors: []string{},
	}
}

// finish fills Targets from the figures.
func (r *Report) finish() {
	add := func(name string, measured bool, value float64, unit, op string, target float64, scaled bool, note string) {
		t := Target{Name: name, Unit: unit, Op: op, Target: target, Measured: measured, Scaled: scaled, Note: note}
		if measured && !math.IsNaN(value) && !math.IsInf(value, 0) {
			t.Value = round(value, 4)
			if op == "<=" {
				t.Pass = value <= target
			} else {
				t.Pass = value >= target
			}
		} else {
			t.Measured = false
		}
		r.Targets = append(r.Targets, t)
	}
	a := r.Amplification
	add("amplification (bytes written / new bytes, all checkpoints)", a != nil, val(a, func(a *Amplification) float64 { return a.Overall }), "x", "<=", 1.02, false, "")
	iv := r.IncrementalVsFull
	churnNote := ""
	if iv != nil && iv.Churn != 0.01 {
		churnNote = fmt.Sprintf("measured at churn %g; the target is stated at 1%%", iv.Churn)
	}
	bytesNote := churnNote
	if iv != nil {
		if bytesNote != "" {
			bytesNote += "; "
		}
		bytesNote += fmt.Sprintf("the files each checkpoint has and its parent has not are %.4f of its size (Pebble's flushes and compactions wrote %.4f between checkpoints): no incremental checkpoint of files ships less", iv.NewBytesRatio, iv.LSMBytesRatio)
	}
	add("incremental/full bytes per checkpoint", iv != nil, val(iv, func(v *IncrementalVsFull) float64 { return v.BytesRatio }), "x", "<=", 0.02, false, bytesNote)
	add("incremental/full duration per checkpoint", iv != nil, val(iv, func(v *IncrementalVsFull) float64 { return v.DurationRatio }), "x", "<=", 0.1, false, churnNote)
	for _, want := range []struct {
		files int
		ms    float64
	}{{1000, 5}, {10000, 50}} {
		var p *Pause
		for i := range r.Pause {
			if r.Pause[i].Files == want.files && r.Pause[i].Mode == "handoff" {
				p = &r.Pause[i]
			}
		}
		add(fmt.Sprintf("app pause p99 at %d files (handoff)", want.files), p != nil, val(p, func(p *Pause) float64 { return p.P99MS }), "ms", "<=", want.ms, false, "")
	}
	tr := r.Transfer
	rcloneOK := tr != nil && tr.UploadVsRclone > 0
	note := ""
	if tr != nil && !rcloneOK {
		note = "rclone missing or failed: see transfer.tools"
	}
	add("upload throughput vs rclone copy", rcloneOK, val(tr, func(t *Transfer) float64 { return t.UploadVsRclone }), "x", ">=", 2.0, false, note)
	add("remote-restore throughput vs rclone copy", rcloneOK, val(tr, func(t *Transfer) float64 { return t.RestoreVsRclone }), "x", ">=", 1.0, false, note)
	e := r.EndToEnd
	note = ""
	if e != nil && e.Scaled {
		note = fmt.Sprintf("scaled: the state is %s, the target is stated for 1 GiB (run with --state-bytes 1GiB)", human.Bytes(e.StateBytes))
	}
	add("checkpoint adding 1.5% to the state, end to end", e != nil, val(e, func(e *EndToEnd) float64 { return e.CkptMS / 1000 }), "s", "<=", 0.3, e != nil && e.Scaled, note)
	rs := r.Restore
	note = ""
	if rs != nil {
		note = fmt.Sprintf("every local byte hashed: BLAKE3 runs at %s/s on this machine's cores (SHA-256 %s/s), so no such restore of format 2 files can beat this remote one by more than %.1fx (%.1fx)",
			human.Bytes(int64(rs.BLAKE3BytesPerS)), human.Bytes(int64(rs.SHA256BytesPerS)), rs.SpeedupBoundBLAKE3, rs.SpeedupBound)
	}
	add("local restore speedup over remote restore (every local byte hashed)", rs != nil, val(rs, func(r *RestoreFigure) float64 { return r.Speedup }), "x", ">=", 15, false, note)
	add("local restore speedup over remote restore (--verify-local=identity)", rs != nil, val(rs, func(r *RestoreFigure) float64 { return r.SpeedupIdentity }), "x", ">=", 50, false,
		"unchanged inodes of the local copy trusted, the rest hashed; remote bytes always hashed")
	w := r.WAL
	note = ""
	if w != nil {
		note = fmt.Sprintf("WAL shipped every %s, a checkpoint every %s in both; write rates min/median/max %.0f/%.0f/%.0f with, %.0f/%.0f/%.0f without; load %s",
			msDuration(w.WALIntervalMS), msDuration(w.CheckpointEveryMS), w.WithMin, w.WithMedian, w.WithMax, w.WithoutMin, w.WithoutMedian, w.WithoutMax, strings.Join(w.Load, " -> "))
	}
	add("app throughput with WAL shipping / without", w != nil, val(w, func(w *WALShipping) float64 { return w.Ratio }), "x", ">=", 0.95, false, note)
	add("WAL bytes shipped per byte of WAL written", w != nil && w.WALBytes > 0, val(w, func(w *WALShipping) float64 { return w.ShippedPerWALByte }), "x", "<=", 1.05, false, "")
	at := r.AppThroughput
	note = ""
	if at != nil {
		note = fmt.Sprintf("a checkpoint every %s; storage server on the app's machine: it used %.2f cores, the agent %.2f, of %d, while checkpoints ran", msDuration(at.IntervalMS), at.OnCores.Storage, at.OnCores.Agent, at.Cores)
	}
	add("app throughput with checkpoints / without (storage server on the same machine)", at != nil, val(at, func(a *AppThroughput) float64 { return a.Ratio }), "x", ">=", 0.95, false, note)
	var off *AppThroughput
	note = ""
	if at != nil && at.OffNode != nil {
		if at.OffNode.Reason != "" {
			note = at.OffNode.Reason
		} else {
			off = at.OffNode
			note = fmt.Sprintf("a checkpoint every %s; storage off the app's disk and cores (file store on tmpfs), as in production: the agent used %.2f cores of %d, %.2f CPU-s per GB shipped", msDuration(off.IntervalMS), off.OnCores.Agent, off.Cores, off.AgentCPUSecondsPerGB)
		}
	}
	if at != nil && at.OwnCheckpoints != nil {
		note += fmt.Sprintf("; with no agent, Pebble's checkpoints alone leave %.3f", at.OwnCheckpoints.Ratio)
		if h := at.OwnCheckpointsHashing; h != nil {
			note += fmt.Sprintf(", and with a process hashing the %.0f MB/s the agent shipped, %.3f: the most an agent hashing its objects could leave here", float64(h.HashLoadBytesPerS)/1e6, h.Ratio)
		}
		if c := at.OwnCheckpointsCopying; c != nil {
			note += fmt.Sprintf("; with a process copying each checkpoint's new files to the same tmpfs (%.0f MB/s), nothing else, %.3f: the most an agent shipping them there could leave here", c.ShippedMBPerS, c.Ratio)
		}
	}
	add("app throughput with checkpoints / without (storage off the node)", off != nil, val(off, func(a *AppThroughput) float64 { return a.Ratio }), "x", ">=", 0.95, false, note)
	m := r.Memory
	note = ""
	if m != nil && m.Scaled {
		note = fmt.Sprintf("scaled: the checkpoint is %s, the target is stated for 4 GiB (run with --state-bytes 4GiB --only memory)", human.Bytes(m.CheckpointBytes))
	}
	add("agent peak RSS uploading a large checkpoint", m != nil, val(m, func(m *Memory) float64 { return float64(m.PeakRSSBytes) / (1 << 20) }), "MiB", "<=", 128, m != nil && m.Scaled, note)
	if sh := r.Shapes; sh != nil {
		note = ""
		if sh.Rclone != "" {
			note = sh.Rclone
		}
		for _, s := range sh.Shapes {
			add(fmt.Sprintf("shape %s: upload vs rclone copy", s.Name), s.UploadVsRclone > 0, s.UploadVsRclone, "x", ">=", 4, r.Config.Quick, note)
			add(fmt.Sprintf("shape %s: remote restore vs rclone copy", s.Name), s.RestoreVsRclone > 0 && s.Verified, s.RestoreVsRclone, "x", ">=", 1.5, r.Config.Quick, note)
		}
		if inc := sh.Increment; inc != nil {
			add(fmt.Sprintf("checkpoint adding %s to %s of large files, end to end", human.Bytes(inc.AddedBytes), human.Bytes(inc.StateBytes)), len(inc.CkptMS) > 0,
				inc.Ckpt.MedianMS/1000, "s", "<=", 0.05, r.Config.Quick, fmt.Sprintf("median of %d; rclone copy of the same file %.3f s; the floor on this server: one Put of the file %.3f s + its SHA-256 %.3f s (medians)",
					len(inc.CkptMS), inc.Rclone.MedianMS/1000, inc.ControlPut.MedianMS/1000, inc.ControlSHA256.MedianMS/1000))
		}
	}
	if sc := r.Scale; sc != nil {
		if n := len(sc.Incremental); n > 0 {
			in := sc.Incremental[n-1]
			note = fmt.Sprintf("a checkpoint adding %d files to %d, end to end, less the same %d files checkpointed alone; agent CPU %.1f us per unchanged file", sc.NewFiles, in.Files, sc.NewFiles, in.UnchangedFileCPUUS)
			add("incremental checkpoint cost per unchanged file", true, in.UnchangedFileUS, "us", "<=", 10, in.Files < 100000, note)
			add("manifest bytes per file", true, in.ManifestBytesPerFile, "B", "<=", 64, in.Files < 100000, fmt.Sprintf("at %d files", in.Files))
		}
		if n := len(sc.Objects); n > 0 {
			ob := sc.Objects[n-1]
			scaled := ob.Objects < 1000000
			if ob.Agent != nil {
				add("agent peak RSS in a job of many objects", true, float64(ob.Agent.PeakRSSBytes)/(1<<20), "MiB", "<=", 128, scaled,
					fmt.Sprintf("%d objects in the job; the agent's checkpoints and its job-wide GC sweep; its own memory (RssAnon) %.0f MiB, the rest the pages of the binary", ob.Objects, float64(ob.Agent.PeakAnonBytes)/(1<<20)))
			}
			for _, c := range ob.Commands {
				switch c.Name {
				case "gc (deletes)":
					add("gc time / listing time", ob.ListingMS > 0, c.MS/ob.ListingMS, "x", "<=", 1.5, scaled,
						fmt.Sprintf("%d objects: gc deleting %d in %.1f s, one listing of them %.1f s; gc max RSS %.0f MiB", ob.Objects, ob.Garbage, c.MS/1000, ob.ListingMS/1000, float64(c.MaxRSSBytes)/(1<<20)))
				case "verify":
					add("verify reads per live object", ob.Live > 0, float64(c.Requests["GET"]-int64(ob.Checkpoints))/float64(ob.Live), "x", "<=", 1, scaled,
						fmt.Sprintf("%d live objects named %d times by %d checkpoints", ob.Live, ob.References, ob.Checkpoints))
				}
			}
		}
	}
	if rs := r.Rescale; rs != nil {
		note = ""
		if rs.Scaled {
			note = fmt.Sprintf("scaled: the state is %s, the target is stated for 1 GiB (run with --rescale-bytes 1GiB --only rescale)", human.Bytes(rs.StateBytes))
		}
		for _, sc := range rs.Scenarios {
			add(fmt.Sprintf("rescale %d->%d: bytes fetched / old bytes in the new ranges", sc.From, sc.To), true, sc.BytesRatio, "x", "<=", 1.2, rs.Scaled, note)
			add(fmt.Sprintf("rescale %d->%d: time / plain restore of the same state", sc.From, sc.To), true, sc.TimeRatio, "x", "<=", 1.5, rs.Scaled, note)
		}
	}
}

func val[T any](p *T, f func(*T) float64) float64 {
	if p == nil {
		return 0
	}
	return f(p)
}

func round(v float64, digits int) float64 {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	p := math.Pow(10, float64(digits-1-int(math.Floor(math.Log10(math.Abs(v))))))
	return math.Round(v*p) / p
}

func rate(bps float64) string {
	if bps <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f MiB/s", bps/(1<<20))
}

// Print writes the human report: the targets table, then the detail.
func (r *Report) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ckpt-bench: storage %s, state %s, churn %g, %d checkpoints%s\n\n", r.Config.Storage,
		human.Bytes(r.Config.StateBytes), r.Config.Churn, r.Config.Checkpoints, map[bool]string{true: " (quick: scaled down)", false: ""}[r.Config.Quick])
	fmt.Fprintln(tw, "FIGURE\tMEASURED\tTARGET\tRESULT")
	for _, t := range r.Targets {
		v, res := "-", "not measured"
		if t.Measured {
			v = fmt.Sprintf("%g %s", t.Value, t.Unit)
			res = map[bool]string{true: "pass", false: "FAIL"}[t.Pass]
			if t.Scaled {
				res += " (scaled)"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s %g %s\t%s\n", t.Name, v, t.Op, t.Target, t.Unit, res)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range r.Targets {
		if t.Note != "" {
			fmt.Fprintf(w, "  note: %s: %s\n", t.Name, t.Note)
		}
	}

	if len(r.Series) > 0 {
		fmt.Fprintln(w, "\nPer checkpoint (incremental agent vs full-upload agent on the same snapshot):")
		tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "N\tfiles\tfull size\tflushed\tcompacted\tnew\twritten\tampl\tpause ms\tinc ms\tfull written\tfull ms\tbytes ratio\tdur ratio\t")
		for _, s := range r.Series {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.3f\t%.2f\t%.1f\t%s\t%.1f\t%.4f\t%.3f\t\n", s.Checkpoint, s.Files, human.Bytes(s.FullSize), human.Bytes(s.FlushedBytes), human.Bytes(s.CompactedBytes), human.Bytes(s.NewBytes),
				human.Bytes(s.BytesWritten), s.Amplification, s.PauseMS, s.DurationMS, human.Bytes(s.FullBytesWritten), s.FullDurationMS, s.BytesRatio, s.DurationRatio)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if tr := r.Transfer; tr != nil {
		fmt.Fprintf(w, "\nUpload and restore of the same %s in %d files:\n", human.Bytes(tr.Bytes), tr.Files)
		tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TOOL\tUPLOAD\tRESTORE\tWHERE\tNOTE")
		for _, t := range tr.Tools {
			if !t.Available {
				fmt.Fprintf(tw, "%s\tmissing\tmissing\t-\t%s\n", t.Tool, t.Reason)
				continue
			}
			note := strings.TrimSpace(t.Note + " " + t.Reason)
			fmt.Fprintf(tw, "%s\t%s (%.0f ms)\t%s (%.0f ms)\t%s\t%s\n", t.Tool, rate(t.UploadBytesPerS), t.UploadMS, rate(t.RestoreBytesPerS), t.RestoreMS, t.Where, note)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if e := r.EndToEnd; e != nil {
		fmt.Fprintf(w, "\nAdding %s to a %s state: ckpt %.0f ms end to end (snapshot %.0f ms, pause %.1f ms, upload %.0f ms, %s shipped)",
			human.Bytes(e.AddedBytes), human.Bytes(e.StateBytes), e.CkptMS, e.SnapshotMS, e.PauseMS, e.UploadMS, human.Bytes(e.CheckpointSize))
		for _, p := range e.Peers {
			if p.Available {
				fmt.Fprintf(w, "; %s %.0f ms", p.Tool, p.MS)
			} else {
				fmt.Fprintf(w, "; %s missing (%s)", p.Tool, p.Reason)
			}
		}
		fmt.Fprintln(w)
	}
	if rs := r.Restore; rs != nil {
		fmt.Fprintf(w, "\nRestore of checkpoint %d (%s, %d files): local %.1f ms (%.1f ms with --verify-local=identity), remote %.1f ms (%.1fx, %.1fx); verified local %v, remote %v\n",
			rs.Checkpoint, human.Bytes(rs.Bytes), rs.Files, rs.LocalMS, rs.LocalIdentityMS, rs.RemoteMS, rs.Speedup, rs.SpeedupIdentity, rs.LocalVerified, rs.RemoteVerified)
	}
	for _, a := range []*AppThroughput{r.AppThroughput, offNode(r.AppThroughput)} {
		if a == nil {
			continue
		}
		fmt.Fprintf(w, "\nApp throughput, storage %s: %.0f writes/s with a checkpoint every %.0f ms (%d taken; app waited p50 %.1f ms of which flush+snapshot %.1f ms), %.0f without (phases %v: %.0f); cores with checkpoints: app %.2f, agent %.2f (%.2f CPU-s per GB shipped), storage server %.2f; uploads done %v ms after each phase; ratio per off-on-on-off block %v; MB/s written by Pebble %v, shipped %v\n",
			a.Storage, a.WithWritesPerS, a.IntervalMS, a.Checkpoints, a.PauseP50MS, a.SnapshotP50MS, a.WithoutWritesPerS, a.Phases, a.PhaseWritesPerS,
			a.OnCores.App, a.OnCores.Agent, a.AgentCPUSecondsPerGB, a.OnCores.Storage, a.UploadLagMS, a.BlockRatios, a.PhaseLSMWrittenMBPerS, a.PhaseShippedMBPerS)
	}
	if at := r.AppThroughput; at != nil {
		for _, c := range []*AppThroughput{at.OwnCheckpoints, at.OwnCheckpointsHashing, at.OwnCheckpointsCopying} {
			if c != nil {
				fmt.Fprintf(w, "App throughput, control (%s): ratio %.3f (%.0f writes/s with checkpoints, %.0f without; per block %v); cores with checkpoints: app %.2f, other process %.2f",
					c.Agent, c.Ratio, c.WithWritesPerS, c.WithoutWritesPerS, c.BlockRatios, c.OnCores.App, c.OnCores.Agent)
				if c.ShippedMBPerS > 0 {
					fmt.Fprintf(w, "; shipped %.0f MB/s, %.2f CPU-s per GB", c.ShippedMBPerS, c.AgentCPUSecondsPerGB)
				}
				fmt.Fprintln(w)
			}
		}
	}
	for _, p := range r.Pause {
		fmt.Fprintf(w, "App pause at %d files, %s: p50 %.2f ms, p99 %.2f ms, max %.2f ms (%d samples)\n", p.Files, p.Mode, p.P50MS, p.P99MS, p.MaxMS, p.Samples)
	}
	if m := r.Memory; m != nil {
		fmt.Fprintf(w, "\nAgent process uploading %s in %d files: peak RSS %s (at start %s), %s\n",
			human.Bytes(m.CheckpointBytes), m.Files, human.Bytes(m.PeakRSSBytes), human.Bytes(m.BaselineRSS), rate(m.UploadBytesPerS))
	}
	if rs := r.Rescale; rs != nil {
		fmt.Fprintf(w, "\nRescale: %d old tasks, %s of state (%d keys), checkpoints %s; plain restores %s in %.0f ms\n",
			rescaleOld, human.Bytes(rs.StateBytes), rs.Keys, human.Bytes(rs.CheckpointBytes), human.Bytes(rs.PlainBytes), rs.PlainMS)
		for _, sc := range rs.Scenarios {
			fmt.Fprintf(w, "  %d->%d: %.0f ms (slowest task %.0f ms), %s fetched for %s in range (%.2fx), plain restore of that state %.0f ms (%.2fx), %d keys, verified %v\n",
				sc.From, sc.To, sc.MS, sc.MaxTaskMS, human.Bytes(sc.Bytes), human.Bytes(sc.BytesInRange), sc.BytesRatio, sc.PlainSameStateMS, sc.TimeRatio, sc.Keys, sc.Verified)
		}
	}
	r.printShapes(w)
	if sc := r.Scale; sc != nil {
		for _, in := range sc.Incremental {
			fmt.Fprintf(w, "\nScale, %d files of %s: a checkpoint adding %d files %.1f ms end to end (alone %.1f ms: %.1f us per unchanged file; agent CPU %.0f ms, alone %.0f ms: %.1f us per file), pause p50 %.2f ms, manifest %s (%.0f B/file), agent peak RSS %s",
				in.Files, human.Bytes(sc.FileBytes), sc.NewFiles, in.E2EMS, in.ControlMS, in.UnchangedFileUS, in.CPUMS, in.ControlCPUMS, in.UnchangedFileCPUUS, in.PauseMS, human.Bytes(in.ManifestBytes), in.ManifestBytesPerFile, human.Bytes(in.PeakRSSBytes))
		}
		for _, ob := range sc.Objects {
			fmt.Fprintf(w, "\nScale, a job of %d objects (%d live, %d checkpoints), listed in %.1f s:", ob.Objects, ob.Live, ob.Checkpoints, ob.ListingMS/1000)
			for _, c := range ob.Commands {
				fmt.Fprintf(w, "\n  ckpt %s: %.1f s, %d requests %v, max RSS %s", c.Name, c.MS/1000, c.RequestsTotal, c.Requests, human.Bytes(c.MaxRSSBytes))
			}
			if a := ob.Agent; a != nil {
				fmt.Fprintf(w, "\n  agent: checkpoints %v ms, GC sweep %.1f s, peak RSS %s", a.CheckpointMS, a.SweepMS/1000, human.Bytes(a.PeakRSSBytes))
			}
		}
		if sc.ObjectsReason != "" {
			fmt.Fprintf(w, "\nScale, jobs of many objects: %s", sc.ObjectsReason)
		}
		fmt.Fprintln(w)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "\nerror: %s\n", e)
	}
	return nil
}

// msDuration formats a figure in milliseconds as a duration ("1s").
func msDuration(ms float64) string { return time.Duration(ms * float64(time.Millisecond)).String() }

// offNode is a's run with the storage off the node, if it was measured.
func offNode(a *AppThroughput) *AppThroughput {
	if a == nil || a.OffNode == nil || a.OffNode.Reason != "" {
		return nil
	}
	return a.OffNode
}

// percentile of sorted-or-not xs (nearest rank).
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	k := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(k, len(s)-1))]
}

func ms(d interface{ Seconds() float64 }) float64 { return round(d.Seconds()*1000, 4) }
