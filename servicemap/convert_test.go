package servicemap

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	netutils "k8s.io/utils/net"
)

// parseIP must accept exactly what kube-proxy's ParseIPSloppy accepts, with the
// result in its canonical 4- or 16-byte form.
func TestParseIPMatchesSloppy(t *testing.T) {
	for _, in := range []string{
		"10.0.0.1", "010.000.000.001", "10.0.0.01", "::ffff:10.0.0.1", "fd00::1", "FD00::0001",
		"fe80::1%eth0", "", " 10.0.0.1", "10.0.0.256", "10.0.0", "1.2.3.4.5", "::1.2.3.4", "not-an-ip",
	} {
		t.Run(in, func(t *testing.T) {
			got, ok := parseIP(in)
			want := netutils.ParseIPSloppy(in)
			if want == nil {
				assert.False(t, ok, "kube-proxy rejects %q", in)
				return
			}
			assert.True(t, ok, "kube-proxy accepts %q", in)
			w, _ := netip.AddrFromSlice(want)
			assert.Equal(t, w.Unmap(), got)
		})
	}
}
