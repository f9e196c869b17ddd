package restore

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseKeyRange(t *testing.T) {
	for _, tc := range []struct {
		in         string
		start, end []byte
		err        string
	}{
		{in: "00:80", start: []byte{0}, end: []byte{0x80}},
		{in: ":80", end: []byte{0x80}},
		{in: "80:", start: []byte{0x80}},
		{in: ":"},
		{in: "80:40", err: "below"},
		{in: "40:40", err: "below"},
		{in: "4:", err: "hex"},
		{in: "zz:", err: "hex"},
		{in: ":zz", err: "hex"},
		{in: "40", err: "START:END"},
		{in: "1:2:3", err: "START:END"},
	} {
		start, end, err := ParseKeyRange(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseKeyRange(%q): error %v, want one saying %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !bytes.Equal(start, tc.start) || !bytes.Equal(end, tc.end) || (tc.start == nil) != (start == nil) || (tc.end == nil) != (end == nil) {
			t.Errorf("ParseKeyRange(%q) = %x, %x, %v", tc.in, start, end, err)
		}
	}
}

func TestMakeScratchRemovesOnlyStaleUnlockedScratchDirs(t *testing.T) {
	parent := t.TempDir()
	target := filepath.Join(parent, "store")
	old := time.Now().Add(-2 * staleAfter)
	stale := filepath.Join(parent, scratchPrefix("store")+"killed")
	young := filepath.Join(parent, scratchPrefix("store")+"young")
	other := filepath.Join(parent, scratchPrefix("other")+"killed")
	for _, d := range []string{stale, young, other} {
		if err := os.MkdirAll(filepath.Join(d, "old-0"), 0o755); err != nil {
			t.Fatal(err)
		}
		if d != young {
			os.Chtimes(d, old, old)
		}
	}
	busy, unlockBusy, err := makeScratch(target) // a rescale restore running
	if err != nil {
		t.Fatal(err)
	}
	defer unlockBusy()
	os.Chtimes(busy, old, old)
	scratch, unlock, err := makeScratch(target)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	for d, want := range map[string]bool{stale: false, young: true, other: true, busy: true, scratch: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", filepath.Base(d), err == nil, want)
		}
	}
}
