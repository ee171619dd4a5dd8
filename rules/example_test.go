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

// externalTrafficPolicy Local: NodePort traffic from outside goes to this node's
// endpoint only, unmasqueraded; pods (the cluster CIDR) and the node itself are
// short-circuited to every endpoint.
func ExampleService_externalTrafficPolicyLocal() {
	local := rules.Endpoint{IP: netip.MustParseAddr("10.244.1.10"), Port: 8080}
	remote := rules.Endpoint{IP: netip.MustParseAddr("10.244.2.10"), Port: 8080}
	st := &rules.State{Services: []rules.Service{{
		Namespace: "default", Name: "web", Protocol: rules.TCP,
		ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: 80, NodePort: 30080,
		Endpoints:      []rules.Endpoint{local, remote},
		ExternalLocal:  true,
		LocalEndpoints: []rules.Endpoint{local},
	}}}
	payload, err := rules.RenderNFTables(rules.NFTablesConfig{Table: "nodekit", ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16")}, st)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, line := range strings.Split(payload, "\n") {
		if strings.HasPrefix(line, "add rule ip nodekit external-") || strings.HasPrefix(line, "add rule ip nodekit local-") {
			fmt.Println(line)
		}
	}
	// Output:
	// add rule ip nodekit local-PFISGYVC-default/web/tcp/ meta l4proto tcp dnat to 10.244.1.10:8080
	// add rule ip nodekit external-PFISGYVC-default/web/tcp/ ip saddr 10.244.0.0/16 goto service-PFISGYVC-default/web/tcp/ comment "short-circuit pod traffic"
	// add rule ip nodekit external-PFISGYVC-default/web/tcp/ fib saddr type local mark set mark or 0x4000 comment "masquerade local traffic"
	// add rule ip nodekit external-PFISGYVC-default/web/tcp/ fib saddr type local goto service-PFISGYVC-default/web/tcp/ comment "short-circuit local traffic"
	// add rule ip nodekit external-PFISGYVC-default/web/tcp/ goto local-PFISGYVC-default/web/tcp/
}
