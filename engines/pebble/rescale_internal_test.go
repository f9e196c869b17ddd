package pebble

import (
	"bytes"
	"context"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ckpt-io/ckpt/engines"
)

// newStore writes kvs into a new Pebble store in a temporary directory.
func newStore(t *testing.T, kvs ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "db")
	db, err := pebble.Open(dir, &pebble.Options{Logger: quiet{}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kvs); i += 2 {
		if err := db.Set([]byte(kvs[i]), []byte(kvs[i+1]), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// rewritten is an old task whose rewrite read kvs (sorted) in one piece
// [lo, hi) of the range.
func rewritten(task, lo, hi string, kvs ...string) *oldTask {
	h := newPairHash()
	t := &oldTask{task: task, src: engines.RescaleSource{Checkpoint: 1}, rewrite: "test", copied: true}
	p := &piece{t: t, lo: []byte(lo), hi: []byte(hi)}
	for i := 0; i+1 < len(kvs); i += 2 {
		hashKV(h, []byte(kvs[i]), []byte(kvs[i+1]))
		p.keys++
	}
	p.sum = hex.EncodeToString(h.Sum(nil))
	p.first, p.last = []byte(kvs[0]), []byte(kvs[len(kvs)-2])
	t.pieces = []*piece{p}
	t.keysSpan()
	return t
}

func TestVerifyRescaledCatchesEveryDifferenceFromTheOldStores(t *testing.T) {
	ctx := context.Background()
	o := engines.RescaleRequest{Start: []byte("b"), End: []byte("m")}
	olds := func() []*oldTask {
		return []*oldTask{rewritten("t1", "b", "m", "b", "1", "c", "2"), rewritten("t2", "b", "m", "k", "3", "l", "4")}
	}
	for _, tc := range []struct {
		name  string
		store []string
		err   string
	}{
		{"the same keys and values pass", []string{"b", "1", "c", "2", "k", "3", "l", "4"}, ""},
		{"a key below the range", []string{"a", "0", "b", "1", "c", "2", "k", "3", "l", "4"}, "outside the range"},
		{"a key at the range's end", []string{"b", "1", "c", "2", "k", "3", "l", "4", "m", "5"}, "outside the range"},
		{"a key between the old tasks' keys", []string{"b", "1", "c", "2", "d", "9", "k", "3", "l", "4"}, "no old task holds"},
		{"a key inside one task's span", []string{"b", "1", "bb", "9", "c", "2", "k", "3", "l", "4"}, "task t1"},
		{"a missing key", []string{"b", "1", "k", "3", "l", "4"}, "task t1"},
		{"another value", []string{"b", "1", "c", "2", "k", "3", "l", "5"}, "task t2"},
		{"a task's keys missing", []string{"b", "1", "c", "2"}, "holds 0 keys"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := verifyRescaled(ctx, newStore(t, tc.store...), o, olds())
			if tc.err == "" {
				if err != nil || keys != 4 {
					t.Fatalf("verify: %d keys, %v", keys, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("verify: %v, want an error saying %q", err, tc.err)
			}
		})
	}
}

func TestRangeKeysAreRefusedNotDropped(t *testing.T) {
	dir := newStore(t, "a", "1")
	db, err := pebble.Open(dir, &pebble.Options{Logger: quiet{}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.RangeKeySet([]byte("b"), []byte("d"), nil, []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	ot := &oldTask{task: "t", src: engines.RescaleSource{Checkpoint: 1}, db: db}
	po := &pebble.Options{}
	po.EnsureDefaults()
	wopts := po.MakeWriterOptions(6, db.TableFormat())
	err = (&piece{t: ot, lo: []byte("a")}).copy(context.Background(), wopts, filepath.Join(t.TempDir(), "t"))
	if err == nil || !strings.Contains(err.Error(), "range keys") {
		t.Fatalf("copyRange over range keys: %v, want a refusal", err)
	}
	// Outside the range they do not matter.
	p := &piece{t: ot, hi: []byte("b")}
	if err := p.copy(context.Background(), wopts, filepath.Join(t.TempDir(), "t")); err != nil || p.keys != 1 {
		t.Fatalf("copy below the range keys: %d keys, %v", p.keys, err)
	}
}

func TestPiecesCoverEachTasksRangeWithoutGapsOrOverlap(t *testing.T) {
	keys := func(ss ...string) [][]byte {
		var out [][]byte
		for _, s := range ss {
			out = append(out, []byte(s))
		}
		return out
	}
	o := engines.RescaleRequest{Start: []byte("b"), End: []byte("y")}
	a := &oldTask{task: "a", splits: keys("c", "d", "e", "f", "g", "h", "i", "j")}
	b := &oldTask{task: "b", splits: keys("p")}
	c := &oldTask{task: "c"}
	ps := pieces([]*oldTask{a, b, c}, o, 4)
	count := map[*oldTask]int{}
	var prev *piece
	for _, p := range ps {
		count[p.t]++
		if prev == nil || prev.t != p.t {
			if !bytes.Equal(p.lo, o.Start) {
				t.Errorf("task %s's first piece starts at %q, want the range's start", p.t.task, p.lo)
			}
		} else if !bytes.Equal(prev.hi, p.lo) {
			t.Errorf("task %s: a piece ends at %q, the next starts at %q", p.t.task, prev.hi, p.lo)
		}
		if p.hi != nil && bytes.Compare(p.lo, p.hi) >= 0 {
			t.Errorf("task %s: empty piece [%q, %q)", p.t.task, p.lo, p.hi)
		}
		prev = p
	}
	for i, p := range ps {
		if (i+1 == len(ps) || ps[i+1].t != p.t) && !bytes.Equal(p.hi, o.End) {
			t.Errorf("task %s's last piece ends at %q, want the range's end", p.t.task, p.hi)
		}
	}
	if count[a] != 4 || count[b] != 2 || count[c] != 1 {
		t.Errorf("pieces per task: a %d, b %d, c %d; want 4 (at most n), 2 (one split), 1", count[a], count[b], count[c])
	}
}
