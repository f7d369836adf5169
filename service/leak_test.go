package service

import (
	"testing"

	"github.com/filewrite/filewrite/internal/testutil"
)

// TestMain fails the package when its tests leave goroutines running.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
