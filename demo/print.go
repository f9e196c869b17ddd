package demo

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/ckpt-io/ckpt/internal/human"
)

// print writes the human report: the checkpoint table with its notes,
// then the restores next to the duration of the checkpoint they restored.
func (r *Report) print(out io.Writer, root string, kept bool, lostWrites int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "ckpt demo: a Pebble store with %d keys (%s of keyed state), the agent, and file:// storage under %s\n",
		r.Keys, human.Bytes(r.StateBytes), root)
	fmt.Fprintf(&b, "each round overwrites a few percent of the keys (mostly recent ones), expires the oldest and adds new ones\n")
	fmt.Fprintf(&b, "(%.0f writes/s), then the app flushes its memtable and checkpoints through the agent\n\n", r.WritesPerSecond)

	spikes := r.spikes()
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "checkpoint\twrites\tcheckpoint size\tfull size\tfiles new\treused\tsync ms\tapp paused ms\ttotal ms\t\t")
	durations := map[uint64]int64{}
	for i, c := range r.Checkpoints {
		durations[c.Checkpoint] = c.DurationMS
		note := ""
		switch {
		case i == 0:
			note = "first: everything is new"
		case spikes[c.Checkpoint]:
			note = fmt.Sprintf("spike: compaction rewrote %s of old data into new files", human.Bytes(int64(c.CompactedBytes)))
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t\t%s\n",
			c.Checkpoint, c.Writes, human.Bytes(c.CheckpointSize), human.Bytes(c.FullSize),
			c.FilesUploaded, c.FilesReused, c.SyncMS, c.PauseMS, c.DurationMS, note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteString(`
checkpoint size is what a checkpoint uploaded, only the files no retained
checkpoint had (Flink's lastCheckpointSize); full size is every byte it
references, what a restore must fetch (lastCheckpointFullSize). Do not read
checkpoint size as the state size. Compaction rewrites old data into new
files, so checkpoint size has a sawtooth: expected, and shown, not hidden.
`)
	fmt.Fprintf(&b, "\ncrash: the store was closed and its directory deleted; the %d writes made after checkpoint %d are lost by design\n\n",
		lostWrites, r.Checkpoints[len(r.Checkpoints)-1].Checkpoint)

	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "restore from\tcheckpoint\tfiles\tbytes\tfrom local\tfrom storage\trestore ms\tverify ms\tcheckpoint ms\t\t")
	for _, x := range r.Restores {
		verdict := fmt.Sprintf("verified: all %d keys hold the values written before the checkpoint", x.Keys)
		if !x.Verified {
			verdict = "NOT VERIFIED: " + x.Error
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t\t%s\n",
			x.Source, x.Checkpoint, x.Files, human.Bytes(x.Bytes), human.Bytes(x.BytesLocal), human.Bytes(x.BytesRemote),
			x.DurationMS, x.VerifyMS, durations[x.Checkpoint], verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(&b, "\n(checkpoint ms: how long that checkpoint took end to end, for comparison)\n")
	if kept {
		fmt.Fprintf(&b, "done in %.1f s; everything is kept under %s\n", float64(r.DurationMS)/1000, root)
	} else {
		fmt.Fprintf(&b, "done in %.1f s; the temporary directory is removed on exit (keep it with --dir)\n", float64(r.DurationMS)/1000)
	}
	_, err := io.WriteString(out, b.String())
	return err
}
