package workload

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/cockroachdb/pebble/v2"
)

// maxExamples is how many mismatches a VerifyError describes.
const maxExamples = 5

// VerifyError reports how a store differs from the expected state.
type VerifyError struct {
	Expected int      // keys the state should hold
	Missing  int      // expected keys absent from the store
	Wrong    int      // keys present with a wrong value
	Extra    int      // keys in the store the state does not hold
	Examples []string // the first few mismatches, described
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("store differs from the expected state (%d keys): %d missing, %d wrong, %d extra: %s",
		e.Expected, e.Missing, e.Wrong, e.Extra, strings.Join(e.Examples, "; "))
}

func (e *VerifyError) add(format string, args ...any) {
	if len(e.Examples) < maxExamples {
		e.Examples = append(e.Examples, fmt.Sprintf(format, args...))
	}
}

// Verify checks db against exp in one scan: every expected key holds its
// expected value and no other key exists. It returns a *VerifyError naming
// the first few mismatches, or another error if the scan itself fails. The
// cost is one full iteration of the store plus regenerating every value.
func Verify(ctx context.Context, db *pebble.DB, exp *Expected) error {
	it, err := db.NewIterWithContext(ctx, nil)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	defer it.Close()
	ve := &VerifyError{Expected: exp.keys}
	seen := make([]bool, len(exp.versions))
	want := make([]byte, exp.valueSize)
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		if n++; n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("verify: %w", err)
			}
		}
		key := it.Key()
		id, isWorkloadKey := exp.keyer.decode(key)
		if !isWorkloadKey || int(id) >= len(exp.versions) || exp.versions[id] == 0 {
			ve.Extra++
			ve.add("extra key %q", key)
			continue
		}
		seen[id] = true
		v := exp.versions[id]
		value(want, exp.seed, id, v)
		got, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("verify: read %s: %w", key, err)
		}
		if !bytes.Equal(got, want) {
			ve.Wrong++
			ve.add("wrong value for %s: %s, want version %d", key, describe(got, exp.valueSize), v)
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("verify: scan: %w", err)
	}
	key := make([]byte, keySize)
	for id, v := range exp.versions {
		if v != 0 && !seen[id] {
			ve.Missing++
			exp.keyer.encode(key, uint32(id))
			ve.add("missing key %s (version %d)", key, v)
		}
	}
	if ve.Missing+ve.Wrong+ve.Extra > 0 {
		return ve
	}
	return nil
}

// describe explains a wrong value through its header when it has one.
func describe(got []byte, size int) string {
	if len(got) != size {
		return fmt.Sprintf("%d bytes instead of %d", len(got), size)
	}
	id := binary.LittleEndian.Uint64(got)
	version := binary.LittleEndian.Uint32(got[8:])
	return fmt.Sprintf("got a value with header (key id %d, version %d)", id, version)
}
