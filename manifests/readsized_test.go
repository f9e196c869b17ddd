package manifests

import (
	"strings"
	"testing"
)

func TestReadSizedReadsWhateverTheHintSays(t *testing.T) {
	body := strings.Repeat("manifest bytes ", 1000)
	for _, hint := range []int64{0, -1, 10, int64(len(body)), int64(len(body)) + 5, 1 << 30} {
		got, err := readSized(strings.NewReader(body), hint, int64(len(body))+1)
		if err != nil || string(got) != body {
			t.Errorf("hint %d: %d bytes, %v", hint, len(got), err)
		}
	}
	got, err := readSized(strings.NewReader(body), int64(len(body)), 100)
	if err != nil || len(got) != 100 {
		t.Errorf("limit 100: %d bytes, %v", len(got), err)
	}
}
