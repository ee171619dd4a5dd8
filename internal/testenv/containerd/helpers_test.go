package containerd

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/vishvananda/netlink"
)

func TestOverlaps(t *testing.T) {
	cidr := func(s string) *net.IPNet {
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	subnet := cidr("10.222.7.0/24")
	tests := []struct {
		name   string
		routes []netlink.Route
		want   bool
	}{
		{"no routes", nil, false},
		{"default route as nil", []netlink.Route{{Dst: nil}}, false},
		{"default route as 0.0.0.0/0", []netlink.Route{{Dst: cidr("0.0.0.0/0")}}, false},
		{"unrelated", []netlink.Route{{Dst: cidr("192.0.2.0/24")}}, false},
		{"wider route covers it", []netlink.Route{{Dst: cidr("10.0.0.0/8")}}, true},
		{"narrower route inside it", []netlink.Route{{Dst: cidr("10.222.7.128/25")}}, true},
		{"same", []netlink.Route{{Dst: cidr("10.222.7.0/24")}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, overlaps(subnet, tt.routes))
		})
	}
}
