package protocol

import (
	"github.com/ckpt-io/ckpt/internal/names"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/manifests"
)

// The protocol checks task names itself (to need nothing but the standard
// library); it must agree with manifests.ValidName, message included.
func TestTaskNamesAgreeWithManifests(t *testing.T) {
	for _, name := range []string{"t", "orders-3", "A.b_c-9", strings.Repeat("a", 128), strings.Repeat("a", 129),
		"", "-t", ".t", "a/b", "a b", "é", "a\n", "\na"} {
		got, want := names.Valid("task", name), manifests.ValidName("task", name)
		if (got == nil) != (want == nil) || (got != nil && got.Error() != want.Error()) {
			t.Errorf("%q: protocol says %v, manifests %v", name, got, want)
		}
	}
}
