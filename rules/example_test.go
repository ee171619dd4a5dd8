package rules_test

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/nodekit-dev/nodekit/rules"
)

// A dry run: the exact nft payload for one ClusterIP service with two endpoints,
// without touching the kernel. Pipe the full text to `nft -f -` to apply it by hand.
func ExampleRenderNFTables() {
	st := &rules.State{Services: []rules.Service{{
		Namespace: "default", Name: "web", Protocol: rules.TCP,
		ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 80,
		Endpoints: []rules.Endpoint{
			{IP: netip.MustParseAddr("10.244.1.10"), Port: 8080},
			{IP: netip.MustParseAddr("10.244.1.11"), Port: 8080},
		},
	}}}
	payload, err := rules.RenderNFTables(rules.NFTablesConfig{Table: "nodekit"}, st)
	if err != nil {
		fmt.Println(err)
		return
	}
	// Print only the service's own lines; the rest is the fixed skeleton.
	for _, line := range strings.Split(payload, "\n") {
		if strings.Contains(line, "default/web") || strings.Contains(line, "10.96.0.10") {
			fmt.Println(line)
		}
	}
	// Output:
	// add chain ip nodekit service-PFISGYVC-default/web/tcp/
	// flush chain ip nodekit service-PFISGYVC-default/web/tcp/
	// add rule ip nodekit service-PFISGYVC-default/web/tcp/ meta l4proto tcp numgen random mod 2 0 dnat to 10.244.1.10:8080
	// add rule ip nodekit service-PFISGYVC-default/web/tcp/ meta l4proto tcp dnat to 10.244.1.11:8080
	// add element ip nodekit cluster-ips { 10.96.0.10 }
	// add element ip nodekit service-ips { 10.96.0.10 . tcp . 80 : goto service-PFISGYVC-default/web/tcp/ }
}
