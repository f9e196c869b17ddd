package restore

import "testing"

// A restore that names its checkpoint gets that checkpoint as it was
// taken (a check against the app's state at N, a savepoint's point);
// only a restore of the newest, by default, goes on into its WAL.
func TestDefaultToIsLatestOnlyForTheNewestCheckpoint(t *testing.T) {
	for _, c := range []struct {
		to            string
		n             uint64
		jobConsistent bool
		want          string
	}{
		{"", 0, false, ToLatest},
		{"", 7, false, ToCheckpoint},
		{"", 0, true, ToCheckpoint},
		{ToLatest, 7, false, ToLatest},
		{ToCheckpoint, 0, false, ToCheckpoint},
	} {
		if got := DefaultTo(c.to, c.n, c.jobConsistent); got != c.want {
			t.Errorf("DefaultTo(%q, %d, %v) = %q, want %q", c.to, c.n, c.jobConsistent, got, c.want)
		}
	}
}
