package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
	"github.com/nodekit-dev/nodekit/rules"
)

// TestAgentCleansUpOtherModes: upstream's platformCleanup, through the binary
// on a dual-stack netns node. The agent runs in iptables mode, then nftables,
// then iptables again: each start removes the other mode's rules in both
// families (only the kubelet's KUBE-FIREWALL, which upstream leaves, stays) and
// the Service is served by the new mode over both families. Then --cleanup,
// with both modes' rules present, removes them all and exits 0, leaving the
// kubelet's chains and other tools' chains and tables; a foreign rule that
// keeps a chain from going makes it exit 1 with upstream's messages, after
// cleaning everything else.
func TestAgentCleansUpOtherModes(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	testenv.LookPath(t, "nft")
	testenv.LookPath(t, "ip6tables-save")
	cp := controlplane.Start(t, controlplane.Options{ControllerManager: true, ServiceCIDR6: netns.IPv6ServiceCIDR.String()})
	c := newClusterWith(t, cp, modeIPTables, netns.Config{Pods: 2, IPv6: true})
	pods := c.env.Pods
	for i := range 2 {
		c.runPod(fmt.Sprintf("web-%d", i), i, "web")
	}
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc, err := c.client.CoreV1().Services(c.ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: c.ns},
		Spec: corev1.ServiceSpec{
			Selector:       map[string]string{"app": "web"},
			IPFamilyPolicy: &policy, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports: []corev1.ServicePort{{Name: "p", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt(pods[0].HTTPPort)}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Len(t, svc.Spec.ClusterIPs, 2)
	want := []string{pods[0].IP.String(), pods[1].IP.String(), pods[0].IP6.String(), pods[1].IP6.String()}
	sortStrings(want)
	c.waitSlice("web", want...)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := c.env.NodeRun(ctx, "", name, args...)
		require.NoError(t, err, "%s %v: %s", name, args, out)
		return out
	}
	tables := func() string { return run("nft", "list", "tables") }
	// start runs the agent in mode until both families have synced and the
	// Service answers on both cluster IPs, from the pods of the mode.
	start := func(mode string) {
		t.Helper()
		c.mode = mode
		took := c.startAgent("--cluster-cidr=" + c.env.PodCIDR.String() + "," + c.env.PodCIDR6.String())
		for _, f := range []string{"IPv4", "IPv6"} {
			require.Eventually(t, func() bool {
				m, err := c.scrape()
				return err == nil && m[`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="`+f+`"}`] > 0
			}, 30*time.Second, 10*time.Millisecond, "%s: a full sync of the %s writer", mode, f)
		}
		for _, ip := range svc.Spec.ClusterIPs {
			addr := net.JoinHostPort(ip, "80")
			require.Eventually(t, func() bool {
				got := served(c.env.Client, addr, 6, 2*time.Second)
				return got[""] == 0 && len(got) == 2
			}, 30*time.Second, 50*time.Millisecond, "%s: %s served by both pods", mode, addr)
		}
		t.Logf("%s: started, both families synced and serving, in %s", mode, took)
	}
	stop := func() {
		t.Helper()
		c.agent.Stop(5 * time.Second)
	}

	start(modeIPTables)
	assert.Contains(t, run("iptables-save"), ":KUBE-SVC-")
	assert.Contains(t, run("ip6tables-save"), ":KUBE-SVC-")
	stop()

	start(modeNFTables)
	assert.Equal(t, slices.Sorted(slices.Values(kubeletFirewall)), kubeLines(run("iptables-save")),
		"iptables mode's chains and jumps are gone; the kubelet's KUBE-FIREWALL stays, as upstream leaves it")
	assert.Empty(t, kubeLines(run("ip6tables-save")), "ip6tables mode's chains and jumps are gone")
	assert.Contains(t, run("nft", "list", "table", "ip", "kube-proxy"), svc.Spec.ClusterIPs[0])
	assert.Contains(t, run("nft", "list", "table", "ip6", "kube-proxy"), svc.Spec.ClusterIPs[1])
	stop()

	start(modeIPTables)
	assert.NotContains(t, tables(), "kube-proxy", "the nftables tables of both families are gone")
	assert.Contains(t, run("iptables-save", "-t", "nat"), svc.Spec.ClusterIPs[0])
	assert.Contains(t, run("ip6tables-save", "-t", "nat"), svc.Spec.ClusterIPs[1])
	stop()

	// --cleanup with both modes' rules in place: the iptables mode's (just
	// written) and the nftables mode's, written here by the rules package.
	require.NoError(t, c.env.Node.Do(func() error {
		for _, f := range []rules.Family{rules.IPv4, rules.IPv6} {
			w, err := rules.NewNFTables(rules.NFTablesConfig{Family: f})
			if err != nil {
				return err
			}
			if err := w.Sync(ctx, &rules.State{}); err != nil {
				return err
			}
		}
		return nil
	}))
	// Chains --cleanup must leave: another tool's (with a jump), the
	// kubelet's canaries, another nftables table. Upstream's own mangle
	// canary goes.
	for _, args := range [][]string{
		{"iptables", "-w", "-N", "USER-CHAIN"},
		{"iptables", "-w", "-A", "INPUT", "-j", "USER-CHAIN"},
		{"iptables", "-w", "-t", "nat", "-N", "KUBE-KUBELET-CANARY"},
		{"iptables", "-w", "-t", "mangle", "-N", "KUBE-KUBELET-CANARY"},
		{"iptables", "-w", "-t", "mangle", "-N", "KUBE-PROXY-CANARY"},
		{"ip6tables", "-w", "-t", "mangle", "-N", "KUBE-PROXY-CANARY"},
		{"nft", "add", "table", "ip", "other"},
	} {
		run(args[0], args[1:]...)
	}
	require.Contains(t, tables(), "table ip kube-proxy")
	require.Contains(t, tables(), "table ip6 kube-proxy")
	keep := []string{":KUBE-KUBELET-CANARY - [0:0]", ":KUBE-KUBELET-CANARY - [0:0]"}
	keep = append(keep, kubeletFirewall...)
	slices.Sort(keep)

	cleanup := func() (string, int) {
		t.Helper()
		cmd := exec.CommandContext(ctx, agentBin, "--cleanup", "--netns="+c.env.Node.Path(), "-v=2")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			require.NoError(t, err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}

	// A foreign rule still jumping into KUBE-SERVICES keeps the nat table from
	// being cleaned: exit 1 with upstream's lines; the rest is cleaned anyway.
	run("iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES")
	out, code := cleanup()
	t.Logf("--cleanup with a foreign jump: exit %d\n%s", code, out)
	assert.Equal(t, 1, code)
	assert.Contains(t, out, `"Failed to execute iptables-restore" err=`)
	assert.Contains(t, out, `table="nat"`)
	assert.Contains(t, out, `"Error running ProxyServer" err="encountered an error while tearing down rules"`)
	assert.Contains(t, run("iptables-save", "-t", "nat"), ":KUBE-SERVICES")
	assert.NotContains(t, run("iptables-save", "-t", "filter"), ":KUBE-SERVICES", "filter is cleaned after nat failed")
	assert.Empty(t, kubeLines(run("ip6tables-save")), "IPv6 is cleaned after IPv4 failed")
	assert.NotContains(t, tables(), "kube-proxy", "nftables is cleaned after iptables failed")

	run("iptables", "-w", "-t", "nat", "-D", "PREROUTING", "-j", "KUBE-SERVICES")
	t0 := time.Now()
	out, code = cleanup()
	t.Logf("--cleanup: exit %d in %s\n%s", code, time.Since(t0), out)
	assert.Equal(t, 0, code)
	save := run("iptables-save")
	assert.Equal(t, keep, kubeLines(save), "only the kubelet's chains stay")
	assert.Contains(t, save, "-A INPUT -j USER-CHAIN", "another tool's jump stays")
	assert.Contains(t, save, ":USER-CHAIN")
	assert.Empty(t, kubeLines(run("ip6tables-save")))
	assert.NotContains(t, tables(), "kube-proxy")
	assert.Contains(t, tables(), "table ip other")

	// Nothing left to clean: still exit 0.
	t0 = time.Now()
	_, code = cleanup()
	assert.Equal(t, 0, code)
	t.Logf("--cleanup with nothing to clean: exit %d in %s", code, time.Since(t0))
}

// kubeletFirewall is what iptables mode leaves behind with localhost NodePorts:
// the kubelet's chain, which upstream's cleanup does not touch.
var kubeletFirewall = []string{
	":KUBE-FIREWALL - [0:0]",
	`-A INPUT -j KUBE-FIREWALL`,
	`-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`,
	`-A OUTPUT -j KUBE-FIREWALL`,
}

// kubeLines are an iptables-save listing's lines naming a KUBE- chain, sorted,
// counters cleared.
func kubeLines(save string) []string {
	var out []string
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "#") || !strings.Contains(l, "KUBE-") {
			continue
		}
		if i := strings.LastIndex(l, " ["); strings.HasPrefix(l, ":") && i > 0 {
			l = l[:i] + " [0:0]"
		}
		out = append(out, l)
	}
	slices.Sort(out)
	return out
}
