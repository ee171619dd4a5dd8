package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCleanupModes: upstream's platformCleanup choice. Starting in a mode
// removes the other mode's rules only; --cleanup removes both.
func TestCleanupModes(t *testing.T) {
	for _, tc := range []struct {
		mode               string
		cleanup            bool
		iptables, nftables bool
	}{
		{modeNFTables, false, true, false},
		{modeIPTables, false, false, true},
		{modeNFTables, true, true, true},
		{modeIPTables, true, true, true},
	} {
		ipt, nft := cleanupModes(tc.mode, tc.cleanup)
		assert.Equal(t, tc.iptables, ipt, "mode %s, --cleanup=%v: iptables", tc.mode, tc.cleanup)
		assert.Equal(t, tc.nftables, nft, "mode %s, --cleanup=%v: nftables", tc.mode, tc.cleanup)
	}
}
