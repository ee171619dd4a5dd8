package podsync_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind (hooks
// outliving their grace period, kill workers, HTTP transports).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
