package manifests

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ckpt-io/ckpt/storage"
)

// commitJob stores checkpoint n of task listing tasks (nil: none), with
// one shared object of its own.
func commitJob(t *testing.T, s storage.Store, task string, n uint64, tasks ...string) {
	t.Helper()
	b := []byte(fmt.Sprintf("%s-%d", task, n))
	f := File{Name: "a.sst", Kind: Shared, Size: int64(len(b)), SHA256: sha(b), Key: SharedKey("job", sha(b), int64(len(b)))}
	put(t, s, f.Key, b)
	m := &Manifest{Job: "job", Task: task, Checkpoint: n, Created: time.Now(), Files: []File{f}, FullSize: f.Size,
		Tasks: SortedTasks(tasks)}
	enc, err := m.Encode(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := Commit(context.Background(), s, m, enc); err != nil {
		t.Fatal(err)
	}
}

func TestJobCheckpointStatus(t *testing.T) {
	ab := []string{"a", "b"}
	for _, c := range []struct {
		name     string
		lists    map[string][]string
		complete bool
		reason   string
	}{
		{"complete", map[string][]string{"a": ab, "b": ab}, true, ""},
		{"one task missing", map[string][]string{"a": ab}, false, "1 of 2 tasks have no complete checkpoint 3: [b]"},
		{"disagreeing sets", map[string][]string{"a": ab, "b": {"a", "b", "c"}, "c": {"a", "b", "c"}}, false, "tasks disagree at checkpoint 3"},
		{"a listed task lists none", map[string][]string{"a": ab, "b": nil}, false, "b lists none"},
		{"old manifests without tasks", map[string][]string{"a": nil, "b": nil}, false, "lists no tasks"},
		{"no manifests", map[string][]string{}, false, "lists no tasks"},
		{"a task outside the job without a list is ignored", map[string][]string{"a": ab, "b": ab, "z": nil}, true, ""},
		{"a task outside the job with another list", map[string][]string{"a": ab, "b": ab, "z": {"z"}}, false, "tasks disagree"},
	} {
		st := JobCheckpointStatus(3, c.lists)
		if st.Complete != c.complete || !strings.Contains(st.Reason, c.reason) || (c.complete && st.Reason != "") {
			t.Errorf("%s: complete %v reason %q; want %v, %q", c.name, st.Complete, st.Reason, c.complete, c.reason)
		}
	}
}

func TestCheckTasksRefusesBadLists(t *testing.T) {
	many := make([]string, MaxJobTasks+1)
	for i := range many {
		many[i] = fmt.Sprintf("t%d", i)
	}
	for name, tasks := range map[string][]string{
		"empty": {}, "without the task": {"b"}, "duplicate": {"a", "b", "b"},
		"bad name": {"a", "-b"}, "too many": append(many, "a"),
	} {
		if err := CheckTasks("a", tasks); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := CheckTasks("a", []string{"b", "a"}); err != nil {
		t.Errorf("a good list: %v", err)
	}
}

func TestAManifestsTasksAreChecked(t *testing.T) {
	for name, tasks := range map[string][]string{
		"without its task": {"b"}, "unsorted": {"orders-3", "b"}, "duplicate": {"orders-3", "orders-3"},
	} {
		m := sample()
		m.Tasks = tasks
		enc, err := m.Encode(0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Decode(enc); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	m := sample()
	m.Tasks = []string{"a", "orders-3"}
	enc, _ := m.Encode(0)
	if got, err := Decode(enc); err != nil || !slices.Equal(got.Tasks, m.Tasks) {
		t.Fatalf("round trip: %v %v", err, got)
	}
	old := sample() // no tasks: valid, not job-wide
	enc, _ = old.Encode(0)
	if strings.Contains(string(enc), `"tasks"`) {
		t.Fatal("a manifest without tasks writes the field")
	}
}

func TestJobReaderFindsTheNewestJobCompleteCheckpoint(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	for n := uint64(1); n <= 2; n++ {
		commitJob(t, s, "a", n, "a", "b")
		commitJob(t, s, "b", n, "a", "b")
	}
	commitJob(t, s, "a", 3, "a", "b") // b has no 3
	commitJob(t, s, "a", 4, "a", "b")
	commitJob(t, s, "b", 4, "a", "b", "c") // disagrees
	commitJob(t, s, "old", 5)              // an old manifest without tasks
	for task, want := range map[string]uint64{"a": 2, "b": 2, "old": 0, "nobody": 0} {
		n, err := NewestJobComplete(ctx, s, "job", task)
		if err != nil || n != want {
			t.Errorf("%s: newest job-complete %d %v, want %d", task, n, err, want)
		}
	}
	cat, _ := Scan(ctx, s, "job", "")
	jr := NewJobReader(s, cat)
	st, _ := jr.Status(ctx, 3)
	if st.Complete || !strings.Contains(st.Reason, "[b]") {
		t.Errorf("3: %+v", st)
	}
	st, _ = jr.Status(ctx, 4)
	if st.Complete || !strings.Contains(st.Reason, "disagree") {
		t.Errorf("4: %+v", st)
	}
	if st, ok, _ := jr.NewestJobCheckpoint(ctx); !ok || st.Checkpoint != 2 || !slices.Equal(st.Tasks, []string{"a", "b"}) {
		t.Errorf("newest job checkpoint %+v %v", st, ok)
	}
	// A retired manifest does not count.
	if err := Retire(ctx, s, "job", "b", 2); err != nil {
		t.Fatal(err)
	}
	if n, _ := NewestJobComplete(ctx, s, "job", "a"); n != 1 {
		t.Errorf("with b's 2 retired: %d, want 1", n)
	}
}

func TestRetentionProtects(t *testing.T) {
	refs := []Ref{{Task: "t", Checkpoint: 1}, {Task: "t", Checkpoint: 2}, {Task: "t", Checkpoint: 3}, {Task: "t", Checkpoint: 5}}
	retained, retire := Retention(refs, 1, 2)
	if fmt.Sprint(retained) != fmt.Sprint([]Ref{refs[1], refs[3]}) || fmt.Sprint(retire) != fmt.Sprint([]Ref{refs[0], refs[2]}) {
		t.Fatalf("retained %v retire %v", retained, retire)
	}
	retained, retire = Retention(refs, 2, 0, 5) // protecting a kept one, or none
	if len(retained) != 2 || len(retire) != 2 || retire[1].Checkpoint != 2 {
		t.Fatalf("retained %v retire %v", retained, retire)
	}
}

// The property: for any history of job-wide checkpoints, the pure
// decision agrees with a direct reading of the definition, and retention
// with its protection never retires the newest job-complete checkpoint.
func TestJobCompletenessAndRetentionProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		all := []string{"a", "b", "c"}
		lists := map[string][]string{}
		for _, task := range all {
			switch rapid.IntRange(0, 3).Draw(rt, "kind-"+task) {
			case 0: // no manifest
			case 1:
				lists[task] = nil
			case 2:
				lists[task] = []string{"a", "b", "c"}
			case 3:
				sub := rapid.SliceOfNDistinct(rapid.SampledFrom(all), 1, 3, rapid.ID[string]).Draw(rt, "sub-"+task)
				if !slices.Contains(sub, task) {
					sub = append(sub, task)
				}
				lists[task] = SortedTasks(sub)
			}
		}
		st := JobCheckpointStatus(7, lists)
		// Direct: some list S exists, every listed task of S has a manifest
		// listing exactly S, and every manifest that lists anything lists S.
		want := false
		for _, l := range lists {
			if l == nil {
				continue
			}
			ok := true
			for _, task := range l {
				if tl, has := lists[task]; !has || !slices.Equal(tl, l) {
					ok = false
				}
			}
			for _, other := range lists {
				if other != nil && !slices.Equal(other, l) {
					ok = false
				}
			}
			want = want || ok
		}
		if st.Complete != want {
			rt.Fatalf("lists %v: complete %v (%s), want %v", lists, st.Complete, st.Reason, want)
		}
		if !st.Complete && st.Reason == "" {
			rt.Fatalf("lists %v: incomplete without a reason", lists)
		}

		n := rapid.IntRange(1, 8).Draw(rt, "n")
		var refs []Ref
		for i := 1; i <= n; i++ {
			if rapid.Bool().Draw(rt, fmt.Sprint("has", i)) {
				refs = append(refs, Ref{Task: "t", Checkpoint: uint64(i)})
			}
		}
		keep := rapid.IntRange(0, 4).Draw(rt, "keep")
		var protect uint64
		if len(refs) > 0 {
			protect = rapid.SampledFrom(refs).Draw(rt, "protect").Checkpoint
		}
		retained, retire := Retention(refs, keep, protect)
		if len(retained)+len(retire) != len(refs) {
			rt.Fatalf("lost refs")
		}
		if slices.ContainsFunc(retire, func(r Ref) bool { return r.Checkpoint == protect }) {
			rt.Fatalf("retired the protected checkpoint %d", protect)
		}
		if len(refs) > 0 && !slices.Contains(retained, refs[len(refs)-1]) {
			rt.Fatalf("retired the newest")
		}
		if len(retained) > max(keep, 1)+1 {
			rt.Fatalf("kept %d with keep %d", len(retained), keep)
		}
	})
}

// Pending keeps the job-wide checkpoints above the newest job-complete one
// that are younger than the window: not old ones, not task-local ones.
func TestPendingKeepsYoungJobWideCheckpointsAboveTheNewestComplete(t *testing.T) {
	now := time.Now()
	m := func(n uint64, age time.Duration, tasks ...string) *Manifest {
		return &Manifest{Task: "a", Checkpoint: n, Created: now.Add(-age), Tasks: tasks}
	}
	ms := []*Manifest{
		m(1, time.Hour, "a", "b"),                    // old
		m(2, time.Minute, "a", "b"),                  // the newest job-complete
		m(3, time.Minute, "a", "b"),                  // pending
		m(4, time.Second),                            // not job-wide
		m(5, JobPendingWindow+time.Second, "a", "b"), // too old
		m(6, 0, "a", "b"),                            // pending
	}
	if got := Pending(ms, 2, now); fmt.Sprint(got) != "[3 6]" {
		t.Fatalf("Pending = %v, want [3 6]", got)
	}
	if got := Pending(ms, 0, now); fmt.Sprint(got) != "[2 3 6]" {
		t.Fatalf("Pending with no job-complete checkpoint = %v, want [2 3 6]", got)
	}
}
