package checkpoint_test

import (
	"testing"

	"go.uber.org/goleak"
)

// No goroutine of a Run outlives it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
