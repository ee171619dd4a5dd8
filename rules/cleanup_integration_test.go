package rules_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
	"github.com/nodekit-dev/nodekit/rules"
)

// TestIPTablesCleanupRealKernel: with both iptables backends, Cleanup removes
// every chain and jump a sync with every kind of chain wrote (SVC, SEP, EXT,
// SVL, FW, the filter chains), and leaves the kubelet's KUBE-FIREWALL and
// another tool's chain and jump; the restores the kernel takes are the ones
// the unit tests check.
func TestIPTablesCleanupRealKernel(t *testing.T) {
	for _, mode := range []rules.IPTablesMode{rules.IPTablesNFT, rules.IPTablesLegacy} {
		t.Run(string(mode), func(t *testing.T) {
			testenv.RequireRoot(t)
			testenv.RequireLong(t)
			ipt := "iptables"
			if mode == rules.IPTablesLegacy {
				ipt = "iptables-legacy"
			}
			testenv.LookPath(t, ipt+"-restore")
			env := netns.New(t, netns.Config{Pods: 2})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			run := func(name string, args ...string) string {
				t.Helper()
				out, err := env.NodeRun(ctx, "", name, args...)
				require.NoError(t, err, "%s %v: %s", name, args, out)
				return out
			}
			run(ipt, "-w", "-N", "USER-CHAIN")
			run(ipt, "-w", "-A", "INPUT", "-j", "USER-CHAIN")
			var w *rules.IPTables
			require.NoError(t, env.Node.Do(func() error {
				var err error
				w, err = rules.NewIPTables(ctx, rules.IPTablesConfig{Mode: mode, ClusterCIDR: env.PodCIDR, LocalhostNodePorts: true})
				return err
			}))
			ep := func(i int) rules.Endpoint { return rules.Endpoint{IP: env.Pods[i].IP, Port: env.Pods[i].HTTPPort} }
			st := &rules.State{Services: []rules.Service{
				{Namespace: "default", Name: "web", Protocol: rules.TCP, ClusterIP: webVIP, Port: 80, NodePort: 30080,
					Endpoints: []rules.Endpoint{ep(0), ep(1)}},
				{Namespace: "default", Name: "lb", Protocol: rules.TCP, ClusterIP: dnsVIP, Port: 80, NodePort: 30081,
					LoadBalancerIPs:          []netip.Addr{netip.MustParseAddr("192.0.2.50")},
					LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
					ExternalLocal:            true, Endpoints: []rules.Endpoint{ep(0), ep(1)}, LocalEndpoints: []rules.Endpoint{ep(1)}},
			}}
			require.NoError(t, env.Node.Do(func() error { return w.Sync(ctx, st) }))
			before := run(ipt + "-save")
			for _, c := range []string{":KUBE-SVC-", ":KUBE-SEP-", ":KUBE-EXT-", ":KUBE-SVL-", ":KUBE-FW-", ":KUBE-PROXY-FIREWALL", ":KUBE-FIREWALL"} {
				require.Contains(t, before, c, "the sync wrote a %s chain", c)
			}

			require.NoError(t, env.Node.Do(func() error { return w.Cleanup(ctx) }))
			after := run(ipt + "-save")
			var kube []string
			for _, l := range strings.Split(after, "\n") {
				if strings.Contains(l, "KUBE-") {
					kube = append(kube, strings.Fields(l)[0]+" "+strings.Fields(l)[1])
				}
			}
			slices.Sort(kube)
			assert.Equal(t, []string{"-A INPUT", "-A KUBE-FIREWALL", "-A OUTPUT", ":KUBE-FIREWALL -"}, kube,
				"only the kubelet's chain and its two jumps stay:\n%s", after)
			assert.Contains(t, after, "-A INPUT -j USER-CHAIN")

			// The writer syncs again from scratch.
			require.NoError(t, env.Node.Do(func() error { return w.Sync(ctx, st) }))
			assert.Contains(t, run(ipt+"-save", "-t", "nat"), ":KUBE-SVL-")
		})
	}
}
