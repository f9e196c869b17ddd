package workload

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// small is a workload that loads in a blink but still flushes (2 MiB of
// state through a 1 MiB memtable).
func small(seed uint64) Options {
	return Options{Seed: seed, StateBytes: 2 << 20, ValueSize: 256, Churn: 0.1, MemTableSize: 1 << 20}
}

func open(t *testing.T, opts Options) *Workload {
	t.Helper()
	w, err := Open(filepath.Join(t.TempDir(), "db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func rounds(t *testing.T, w *Workload, n int) {
	t.Helper()
	for range n {
		if _, err := w.Round(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestKeysRoundTrip(t *testing.T) {
	key := make([]byte, keySize)
	for _, k := range []keyer{{1, false}, {1, true}, {42, true}, {1 << 63, true}} {
		for _, id := range []uint32{0, 1, 2, 1000, 1<<32 - 1} {
			k.encode(key, id)
			got, ok := k.decode(key)
			if !ok || got != id {
				t.Fatalf("%+v: key %s decodes to %d, %v; want %d", k, key, got, ok, id)
			}
		}
		if _, ok := k.decode([]byte("k/zzzzzzzzzzzzzzzz")); ok {
			t.Fatal("a key with non-hex digits decoded")
		}
	}
	var prev []byte
	for id := range uint32(100) {
		keyer{}.encode(key, id)
		if string(key) <= string(prev) {
			t.Fatalf("key %s of id %d does not sort after %s", key, id, prev)
		}
		prev = append(prev[:0], key...)
	}
}

func TestRoundsKeepTheStateNearItsTarget(t *testing.T) {
	w := open(t, small(1))
	first, err := w.Round(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	target := w.targetKeys()
	if first.Inserts != target || first.Overwrites != 0 || first.Deletes != 0 {
		t.Fatalf("first round = %+v, want a load of %d keys", first, target)
	}
	second, err := w.Round(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if second.Overwrites == 0 || second.Deletes == 0 || second.Inserts != second.Deletes {
		t.Fatalf("second round = %+v, want overwrites, deletes and as many inserts as deletes", second)
	}
	st := w.Stats()
	if st.Keys != target || st.Rounds != 2 || st.Writes() != int64(first.Writes()+second.Writes()) {
		t.Fatalf("stats = %+v, want %d keys after 2 rounds", st, target)
	}
	if st.WritesPerSecond() <= 0 {
		t.Fatalf("writes/s = %v", st.WritesPerSecond())
	}
	if err := Verify(context.Background(), w.DB(), w.Snapshot()); err != nil {
		t.Fatal(err)
	}
}

func TestExpiryDeletesTheOldestKeys(t *testing.T) {
	w := open(t, small(4))
	rounds(t, w, 3)
	exp := w.Snapshot()
	deleted := 0
	for id, v := range exp.versions {
		if v != 0 {
			break
		}
		deleted = id + 1
	}
	var total int
	for _, v := range exp.versions {
		if v == 0 {
			total++
		}
	}
	if deleted == 0 || deleted != total {
		t.Fatalf("%d keys deleted, of which the %d oldest form a prefix: want every delete to take the oldest key", total, deleted)
	}
}

func TestScatterSpreadsKeysAndDeletes(t *testing.T) {
	o := small(4)
	o.Scatter = true
	w := open(t, o)
	rounds(t, w, 3)
	exp := w.Snapshot()
	if exp.versions[0] == 0 && exp.versions[1] == 0 && exp.versions[2] == 0 {
		t.Fatal("scattered deletes took the oldest keys")
	}
	if err := Verify(context.Background(), w.DB(), exp); err != nil {
		t.Fatal(err)
	}
}

func TestTheSameSeedWritesTheSameState(t *testing.T) {
	a, b := open(t, small(7)), open(t, small(7))
	rounds(t, a, 3)
	rounds(t, b, 3)
	if !slices.Equal(a.Snapshot().versions, b.Snapshot().versions) {
		t.Fatal("two workloads with one seed modelled different states")
	}
	if err := Verify(context.Background(), b.DB(), a.Snapshot()); err != nil {
		t.Fatalf("store b against a's model: %v", err)
	}
	c := open(t, small(8))
	rounds(t, c, 3)
	if err := Verify(context.Background(), c.DB(), a.Snapshot()); err == nil {
		t.Fatal("a store written with another seed verified")
	}
}

func TestVerifyCatches(t *testing.T) {
	someKey := func(w *Workload) []byte {
		k := make([]byte, keySize)
		w.keys().encode(k, w.live[0])
		return k
	}
	cases := []struct {
		name    string
		corrupt func(w *Workload) error
		check   func(ve *VerifyError) bool
	}{
		{"a missing key", func(w *Workload) error {
			return w.DB().Delete(someKey(w), pebble.Sync)
		}, func(ve *VerifyError) bool { return ve.Missing == 1 && ve.Wrong == 0 && ve.Extra == 0 }},
		{"a wrong value", func(w *Workload) error {
			v := make([]byte, w.opts.ValueSize)
			id := w.live[0]
			value(v, w.opts.Seed, id, w.versions[id]+1)
			return w.DB().Set(someKey(w), v, pebble.Sync)
		}, func(ve *VerifyError) bool { return ve.Missing == 0 && ve.Wrong == 1 && ve.Extra == 0 }},
		{"a value of the wrong size", func(w *Workload) error {
			return w.DB().Set(someKey(w), []byte("short"), pebble.Sync)
		}, func(ve *VerifyError) bool { return ve.Wrong == 1 }},
		{"an extra key", func(w *Workload) error {
			return w.DB().Set([]byte("stray"), []byte("x"), pebble.Sync)
		}, func(ve *VerifyError) bool { return ve.Missing == 0 && ve.Wrong == 0 && ve.Extra == 1 }},
		{"a deleted key come back", func(w *Workload) error {
			for id, v := range w.versions {
				if v == 0 {
					k := make([]byte, keySize)
					w.keys().encode(k, uint32(id))
					val := make([]byte, w.opts.ValueSize)
					value(val, w.opts.Seed, uint32(id), 1)
					return w.DB().Set(k, val, pebble.Sync)
				}
			}
			return errors.New("no deleted key")
		}, func(ve *VerifyError) bool { return ve.Extra == 1 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := open(t, small(3))
			rounds(t, w, 2)
			exp := w.Snapshot()
			if err := Verify(context.Background(), w.DB(), exp); err != nil {
				t.Fatalf("before: %v", err)
			}
			if err := c.corrupt(w); err != nil {
				t.Fatal(err)
			}
			err := Verify(context.Background(), w.DB(), exp)
			var ve *VerifyError
			if !errors.As(err, &ve) {
				t.Fatalf("Verify = %v, want a *VerifyError", err)
			}
			if !c.check(ve) || len(ve.Examples) == 0 {
				t.Fatalf("Verify = %+v", ve)
			}
			t.Log(err)
		})
	}
}

func TestAPastSnapshotVerifiesAPebbleCheckpoint(t *testing.T) {
	w := open(t, small(5))
	rounds(t, w, 2)
	at2 := w.Snapshot()
	chk := filepath.Join(t.TempDir(), "chk")
	if err := w.DB().Checkpoint(chk, pebble.WithFlushedWAL()); err != nil {
		t.Fatal(err)
	}
	rounds(t, w, 2)
	db, err := pebble.Open(chk, PebbleOptions(0))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := Verify(context.Background(), db, at2); err != nil {
		t.Fatalf("checkpoint after round 2 against the round-2 state: %v", err)
	}
	if err := Verify(context.Background(), db, w.Snapshot()); err == nil {
		t.Fatal("checkpoint after round 2 verified against the round-4 state")
	}
	if at2.Round() != 2 || at2.Keys() != w.targetKeys() || at2.Bytes() <= 0 {
		t.Fatalf("snapshot: round %d, %d keys, %d bytes", at2.Round(), at2.Keys(), at2.Bytes())
	}
}

func TestRoundsFlushAndCompact(t *testing.T) {
	for _, scatter := range []bool{false, true} {
		t.Run(fmt.Sprintf("scatter=%v", scatter), func(t *testing.T) {
			o := small(9)
			o.Scatter = scatter
			roundsFlushAndCompact(t, open(t, o))
		})
	}
}

// roundsFlushAndCompact runs rounds until Pebble reports a flush and a
// compaction. Both run in the background, so each round gives them a
// moment to finish before the metrics are read.
func roundsFlushAndCompact(t *testing.T, w *Workload) {
	settled := func(done func(m *pebble.Metrics) bool) bool {
		for range 50 {
			if done(w.DB().Metrics()) {
				return true
			}
			time.Sleep(10 * time.Millisecond)
		}
		return false
	}
	rounds(t, w, 1)
	if !settled(func(m *pebble.Metrics) bool { return m.Flush.Count >= 1 }) {
		t.Fatalf("no flush after loading %d bytes through a %d-byte memtable", w.opts.StateBytes, w.opts.MemTableSize)
	}
	for i := 0; i < 30 && !settled(func(m *pebble.Metrics) bool { return m.Compact.Count >= 1 }); i++ {
		rounds(t, w, 1)
	}
	m := w.DB().Metrics()
	if m.Compact.Count < 1 {
		t.Fatalf("no compaction after %d rounds (%d flushes)", w.Stats().Rounds, m.Flush.Count)
	}
	if l := w.LSM(); l.Flushes < 1 || l.Compactions < 1 || l.FlushedBytes == 0 || l.Tables == 0 {
		t.Fatalf("LSM() = %+v, disagrees with the metrics", l)
	}
	t.Logf("%d rounds: %d flushes, %d compactions", w.Stats().Rounds, m.Flush.Count, m.Compact.Count)
	if err := Verify(context.Background(), w.DB(), w.Snapshot()); err != nil {
		t.Fatal(err)
	}
}

func TestRoundStopsOnACancelledContext(t *testing.T) {
	w := open(t, small(2))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := w.Round(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Round = %v, want context.Canceled", err)
	}
	if err := Verify(context.Background(), w.DB(), w.Snapshot()); err != nil {
		t.Fatalf("model and store disagree after a cancelled round: %v", err)
	}
}

func TestOpenRefusesAStoreItDidNotWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	db, err := pebble.Open(dir, PebbleOptions(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("x"), []byte("y"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := Open(dir, Options{}); err == nil {
		t.Fatal("Open accepted a non-empty store")
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []Options{{ValueSize: 4}, {Churn: 2}, {StateBytes: -1}, {DeleteFraction: -0.1}} {
		if _, err := Open(filepath.Join(t.TempDir(), "db"), o); err == nil {
			t.Errorf("Open(%+v) succeeded", o)
		}
	}
}
