package cluster

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// These tests prove --host-network without running it: the brief forbids touching
// the machine's own network namespace, so the machine is a fakeProbe and the plan is
// read from the functions up executes.

// fakeProbe is a machine as hostProbe sees it. Its zero value (plus an address and a
// host name) is a clean machine.
type fakeProbe struct {
	ports    []int
	links    []string
	tables   []string
	chains   []string
	kubelets []string
	ip       net.IP
	ipErr    error
	local    []net.IP
	hostname string
	forward  string
}

func (f *fakeProbe) ListeningTCPPorts() (map[int]bool, error) {
	m := map[int]bool{}
	for _, p := range f.ports {
		m[p] = true
	}
	return m, nil
}

func (f *fakeProbe) LinkExists(name string) (bool, error) {
	for _, l := range f.links {
		if l == name {
			return true, nil
		}
	}
	return false, nil
}
func (f *fakeProbe) NFTables() ([]string, error)       { return f.tables, nil }
func (f *fakeProbe) NATChains() ([]string, error)      { return f.chains, nil }
func (f *fakeProbe) Kubelets() ([]string, error)       { return f.kubelets, nil }
func (f *fakeProbe) DefaultIP() (net.IP, error)        { return f.ip, f.ipErr }
func (f *fakeProbe) LocalIPs() ([]net.IP, error)       { return f.local, nil }
func (f *fakeProbe) Hostname() (string, error)         { return f.hostname, nil }
func (f *fakeProbe) ReadSysctl(string) (string, error) { return f.forward + "\n", nil }

func cleanMachine() *fakeProbe {
	return &fakeProbe{
		ports:    []int{22, 53},
		links:    []string{"lo", "eth0"},
		tables:   []string{"inet filter"},
		chains:   []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING", "DOCKER"},
		ip:       net.ParseIP("192.0.2.10"),
		local:    []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("192.0.2.10"), net.ParseIP("198.51.100.7")},
		hostname: "Worker-7",
		forward:  "0",
	}
}

func hostConfig(t *testing.T) Config {
	t.Helper()
	cfg := Config{Name: "hn", StateDir: filepath.Join(t.TempDir(), "state"), HostNetwork: true, PeersDir: "/peers",
		KubeletBinary: "/bin/nk/kubelet", KubeProxyBinary: "/bin/nk/kube-proxy"}
	require.NoError(t, cfg.defaults())
	return cfg
}

func TestCheckHostRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    func(*Config)
		change func(*fakeProbe)
		inUse  bool
		want   string
	}{
		{name: "nodes", cfg: func(c *Config) { c.Nodes = 2 }, want: "--host-network runs exactly one node (the machine itself): --nodes 2"},
		{name: "api port", change: func(f *fakeProbe) { f.ports = append(f.ports, 6443) }, inUse: true, want: "TCP port 6443, which kube-apiserver (--api-port) needs"},
		{name: "other api port", cfg: func(c *Config) { c.APIPort = 16443 }, change: func(f *fakeProbe) { f.ports = append(f.ports, 16443) }, inUse: true, want: "TCP port 16443"},
		{name: "kubelet port", change: func(f *fakeProbe) { f.ports = append(f.ports, 10250) }, inUse: true, want: "TCP port 10250, which the kubelet's API needs"},
		{name: "kubelet healthz", change: func(f *fakeProbe) { f.ports = append(f.ports, 10248) }, inUse: true, want: "TCP port 10248"},
		{name: "kube-proxy healthz", change: func(f *fakeProbe) { f.ports = append(f.ports, 10256) }, inUse: true, want: "TCP port 10256, which kube-proxy's healthz needs"},
		{name: "kube-proxy metrics", change: func(f *fakeProbe) { f.ports = append(f.ports, 10249) }, inUse: true, want: "TCP port 10249, which kube-proxy's metrics (127.0.0.1) needs"},
		{name: "etcd", change: func(f *fakeProbe) { f.ports = append(f.ports, 2379) }, inUse: true, want: "TCP port 2379, which etcd (client, 127.0.0.1) needs"},
		{name: "controller-manager", change: func(f *fakeProbe) { f.ports = append(f.ports, 10257) }, inUse: true, want: "TCP port 10257"},
		{name: "cni bridge", change: func(f *fakeProbe) { f.links = append(f.links, "cni0") }, inUse: true, want: "interface cni0 exists"},
		{name: "kube-proxy nftables", change: func(f *fakeProbe) { f.tables = append(f.tables, "ip kube-proxy") }, inUse: true, want: "nftables table ip kube-proxy exists"},
		{name: "kube-proxy nftables ip6", change: func(f *fakeProbe) { f.tables = append(f.tables, "ip6 kube-proxy") }, inUse: true, want: "nftables table ip6 kube-proxy exists"},
		{name: "kube-proxy iptables", change: func(f *fakeProbe) { f.chains = append(f.chains, "KUBE-SERVICES") }, inUse: true, want: "chain KUBE-SERVICES exists"},
		{name: "portmap", change: func(f *fakeProbe) { f.chains = append(f.chains, "CNI-HOSTPORT-DNAT") }, inUse: true, want: "chain CNI-HOSTPORT-DNAT exists"},
		{name: "kubelet running", change: func(f *fakeProbe) {
			f.kubelets = []string{"4242 /usr/bin/kubelet --config=/var/lib/kubelet/config.yaml"}
		}, inUse: true, want: "a kubelet already runs on this machine (pid 4242 /usr/bin/kubelet"},
		{name: "no default route", change: func(f *fakeProbe) { f.ip, f.ipErr = nil, errors.New("no default routes found") }, want: "no default routes found; pass --node-ip"},
		{name: "IPv6 address", change: func(f *fakeProbe) { f.ip = net.ParseIP("2001:db8::1") }, want: "2001:db8::1 is not IPv4"},
		{name: "node IP not local", cfg: func(c *Config) { c.NodeIP = "203.0.113.9" }, want: "--node-ip 203.0.113.9 is not an address of this machine's interfaces"},
		{name: "node IP not IPv4", cfg: func(c *Config) { c.NodeIP = "nonsense" }, want: `--node-ip "nonsense": want an IPv4 address`},
		{name: "host name", change: func(f *fakeProbe) { f.hostname = "under_score" }, want: `host name "under_score" cannot name a Node`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := hostConfig(t)
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			probe := cleanMachine()
			if tc.change != nil {
				tc.change(probe)
			}
			_, err := checkHost(&cfg, probe)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, tc.inUse, errors.Is(err, ErrHostInUse), "%v", err)

			// Up refuses before it claims the state dir or makes anything. (claimHost
			// never starts anything, so a missing refusal fails here harmlessly.)
			_, err = claimHost(cfg, &Images{}, probe)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			_, statErr := os.Stat(cfg.StateDir)
			assert.True(t, os.IsNotExist(statErr), "the state dir must not be made by a refused up: %v", statErr)
		})
	}
}

func TestCheckHostOnACleanMachine(t *testing.T) {
	cfg := hostConfig(t)
	facts, err := checkHost(&cfg, cleanMachine())
	require.NoError(t, err)
	assert.Equal(t, "192.0.2.10", facts.IP, "the default route's address")
	assert.Equal(t, "worker-7", facts.NodeName, "the host name in lower case, as kubeadm names the node")
	assert.Equal(t, HostChanges{
		Links:            []string{"cni0"},
		NFTables:         []string{"ip kube-proxy", "ip6 kube-proxy"},
		NATChainPrefixes: []string{"CNI-HOSTPORT-", "CNI-DN-"},
		Sysctls:          []Sysctl{{Path: "/proc/sys/net/ipv4/ip_forward", Value: "0"}},
	}, facts.Changes)

	// Up's first half claims the state dir with the changes already recorded, before
	// anything starts (claimHost starts nothing).
	c, err := claimHost(cfg, &Images{}, cleanMachine())
	require.NoError(t, err)
	assert.Nil(t, c.Listener)
	st, err := LoadState(cfg.StateDir)
	require.NoError(t, err)
	assert.True(t, st.HostNetwork)
	require.NotNil(t, st.Host)
	assert.Equal(t, facts.Changes, *st.Host)
	assert.Equal(t, "192.0.2.10", st.ControlPlaneIP)
	assert.Empty(t, st.Processes)
	assert.Empty(t, st.Namespaces)
	_, err = claimHost(cfg, &Images{}, cleanMachine())
	assert.ErrorIs(t, err, ErrInUse, "a second up on the same state dir")

	cfg.NodeIP = "198.51.100.7"
	facts, err = checkHost(&cfg, cleanMachine())
	require.NoError(t, err)
	assert.Equal(t, "198.51.100.7", facts.IP, "--node-ip wins over the default route")
}

func TestConfigHostNetworkDefaults(t *testing.T) {
	c := Config{StateDir: "x", HostNetwork: true, Nodes: 3}
	assert.ErrorContains(t, c.defaults(), "--host-network runs exactly one node")
	c = Config{StateDir: "x", NodeIP: "192.0.2.1"}
	assert.ErrorContains(t, c.defaults(), "--node-ip is for --host-network only")
}

// planFor builds the cluster's plan as up would, without starting anything: the
// state, the PKI and kubeconfigs (written into a temp state dir), the nodes, and every
// process's namespace and command line.
type plan struct {
	c        *Cluster
	launches []launch
	argv     [][]string
}

func planFor(t *testing.T, cfg Config, facts *hostFacts) plan {
	t.Helper()
	c := &Cluster{cfg: cfg, host: facts}
	c.st = c.newState()
	require.NoError(t, os.MkdirAll(cfg.StateDir, 0o700))
	require.NoError(t, c.pki())
	c.st.Nodes = c.nodeLayout()
	p := plan{c: c, launches: c.controlPlaneLaunches()}
	for i := range c.st.Nodes {
		n := &c.st.Nodes[i]
		n.CgroupRoot = cgroupRootFor(cfg.Name, n.Name)
		p.launches = append(p.launches, c.kubeletLaunch(n), c.kubeProxyLaunch(n))
	}
	for _, l := range p.launches {
		p.argv = append(p.argv, argvIn(l.NetNS, l.Bin, l.Args...))
	}
	return p
}

func kubeconfigServer(t *testing.T, path string) string {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(path)
	require.NoError(t, err)
	require.Len(t, kc.Clusters, 1)
	for _, cl := range kc.Clusters {
		return cl.Server
	}
	return ""
}

func TestHostNetworkPlan(t *testing.T) {
	cfg := hostConfig(t)
	cfg.APIPort = 16443
	facts, err := checkHost(&cfg, cleanMachine())
	require.NoError(t, err)
	p := planFor(t, cfg, facts)
	st := p.c.st

	assert.True(t, st.HostNetwork)
	assert.Empty(t, st.Namespaces, "no network namespace is made")
	assert.Equal(t, "192.0.2.10", st.ControlPlaneIP)
	require.NotNil(t, st.Host)
	assert.Equal(t, facts.Changes, *st.Host, "what down undoes is recorded with the first state")
	require.Len(t, st.Nodes, 1)
	n := st.Nodes[0]
	assert.Equal(t, Node{Name: "worker-7", IP: "192.0.2.10", PodCIDR: "10.244.1.0/24", NetNS: "",
		Dir: filepath.Join(cfg.StateDir, "nodes", "worker-7"), Runtime: "unix://" + filepath.Join(cfg.StateDir, "nodes", "worker-7", "containerd.sock"),
		CNIConfig: filepath.Join(cfg.StateDir, "nodes", "worker-7", "cni"), CgroupRoot: "/nodekit-hn-worker-7"}, n)
	assert.Equal(t, "the machine's network", n.Where())
	assert.Equal(t, "", n.OnNode())

	byName := map[string]launch{}
	for i, l := range p.launches {
		byName[l.Name] = l
		assert.Equal(t, "", l.NetNS, "%s runs in the machine's namespace", l.Name)
		assert.Equal(t, l.Bin, p.argv[i][0], "%s is started directly, not through nsenter", l.Name)
	}
	assert.Equal(t, []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"}, names(p.launches))
	assert.Subset(t, byName["etcd"].Args, []string{"--listen-client-urls=http://127.0.0.1:2379", "--listen-peer-urls=http://127.0.0.1:2380"}, "etcd on loopback only")
	assert.Subset(t, byName["kube-apiserver"].Args, []string{"--bind-address=0.0.0.0", "--advertise-address=192.0.2.10", "--secure-port=16443", "--etcd-servers=http://127.0.0.1:2379"})
	assert.Subset(t, byName["kube-controller-manager"].Args, []string{"--bind-address=127.0.0.1"})
	assert.Subset(t, byName["kube-scheduler"].Args, []string{"--bind-address=127.0.0.1"})
	assert.Subset(t, byName["kubelet"].Args, []string{"--node-ip=192.0.2.10", "--hostname-override=worker-7", "--container-runtime-endpoint=" + n.Runtime})
	assert.Subset(t, byName["kube-proxy"].Args, []string{"--hostname-override=worker-7", "--proxy-mode=nftables", "--healthz-bind-address=0.0.0.0:10256", "--metrics-bind-address=127.0.0.1:10249"})
	assert.Equal(t, "/bin/nk/kubelet", byName["kubelet"].Bin)

	// Everyone reaches the API server: kubectl and the control plane on loopback, the
	// agents (and explain on the node) at the advertised address, pods through the
	// kubernetes Service whose endpoint is that address; the certificate covers both.
	assert.Equal(t, "https://127.0.0.1:16443", kubeconfigServer(t, filepath.Join(cfg.StateDir, "kubeconfig")))
	assert.Equal(t, "https://127.0.0.1:16443", kubeconfigServer(t, filepath.Join(cfg.StateDir, "cp", "admin.kubeconfig")))
	assert.Equal(t, "https://127.0.0.1:16443", kubeconfigServer(t, filepath.Join(cfg.StateDir, "cp", "controller-manager.kubeconfig")))
	assert.Equal(t, "https://192.0.2.10:16443", kubeconfigServer(t, filepath.Join(cfg.StateDir, "cp", FabricAdminKubeconfig)))
	assert.Equal(t, "https://192.0.2.10:16443", p.c.agentServer())
	assert.ElementsMatch(t, []string{"127.0.0.1", "192.0.2.10", KubernetesServiceIP}, servingIPs(t, filepath.Join(cfg.StateDir, "pki", "apiserver.crt")))

	cfgREST, err := p.c.adminREST()
	require.NoError(t, err)
	assert.Nil(t, cfgREST.Dial, "no namespace dialer: the API server is on the machine's loopback")
	assert.Nil(t, p.c.Listener, "no forwarder")
}

// TestDefaultPlanUnchanged pins the namespaced plan and shows that, for a machine
// named node-1 and the default API port, --host-network changes only where each
// process runs, the advertised address and the node's address.
func TestDefaultPlanUnchanged(t *testing.T) {
	cfg := Config{Name: "hn", StateDir: filepath.Join(t.TempDir(), "state"), PeersDir: "/peers",
		KubeletBinary: "/bin/nk/kubelet", KubeProxyBinary: "/bin/nk/kube-proxy", Nodes: 2}
	require.NoError(t, cfg.defaults())
	p := planFor(t, cfg, nil)
	st := p.c.st
	assert.False(t, st.HostNetwork)
	assert.Nil(t, st.Host)
	assert.Equal(t, ControlPlaneIP, st.ControlPlaneIP)
	require.Len(t, st.Nodes, 2)
	for i, n := range st.Nodes {
		assert.Equal(t, []string{"node-1", "node-2"}[i], n.Name)
		assert.Equal(t, []string{"172.30.0.11", "172.30.0.12"}[i], n.IP)
		assert.Equal(t, []string{"10.244.1.0/24", "10.244.2.0/24"}[i], n.PodCIDR)
		assert.Equal(t, "nk-hn-"+n.Name, n.NetNS)
		assert.Equal(t, "nsenter --net=/var/run/netns/nk-hn-"+n.Name+" ", n.OnNode())
	}
	for i, l := range p.launches {
		want := "nk-hn-cp"
		if l.Node != "" {
			want = "nk-hn-" + l.Node
		}
		assert.Equal(t, want, l.NetNS, l.Name)
		assert.Equal(t, []string{"nsenter", "--net=/var/run/netns/" + want, "--", l.Bin}, p.argv[i][:4], l.Name)
	}
	assert.Equal(t, []string{"--etcd-servers=http://127.0.0.1:2379", "--bind-address=0.0.0.0", "--advertise-address=172.30.0.2", "--secure-port=6443"}, p.launches[1].Args[:4])
	assert.Equal(t, []string{"--config=" + filepath.Join(cfg.StateDir, "nodes", "node-1", "kubelet.yaml"), "--kubeconfig=" + filepath.Join(cfg.StateDir, "nodes", "node-1", "kubelet.kubeconfig"),
		"--hostname-override=node-1", "--node-ip=172.30.0.11"}, p.launches[4].Args[:4])
	assert.Equal(t, "https://127.0.0.1:6443", kubeconfigServer(t, filepath.Join(cfg.StateDir, "kubeconfig")))
	assert.Equal(t, "https://127.0.0.1:6443", kubeconfigServer(t, filepath.Join(cfg.StateDir, "cp", "admin.kubeconfig")))
	assert.Equal(t, "https://172.30.0.2:6443", kubeconfigServer(t, filepath.Join(cfg.StateDir, "cp", FabricAdminKubeconfig)))
	assert.Equal(t, "https://172.30.0.2:6443", p.c.agentServer())
	assert.ElementsMatch(t, []string{"127.0.0.1", ControlPlaneIP, KubernetesServiceIP}, servingIPs(t, filepath.Join(cfg.StateDir, "pki", "apiserver.crt")))

	// The same machine on its own network, named node-1, with the default API port.
	hcfg := cfg
	hcfg.Nodes, hcfg.HostNetwork, hcfg.StateDir = 1, true, filepath.Join(t.TempDir(), "state")
	probe := cleanMachine()
	probe.hostname = "node-1"
	facts, err := checkHost(&hcfg, probe)
	require.NoError(t, err)
	h := planFor(t, hcfg, facts)
	one := p.launches[:6]
	require.Len(t, h.launches, len(one))
	for i := range one {
		d, hl := one[i], h.launches[i]
		assert.Equal(t, "", hl.NetNS)
		var diff []string
		for j := range d.Args {
			a := strings.ReplaceAll(d.Args[j], cfg.StateDir, "STATE")
			b := strings.ReplaceAll(hl.Args[j], hcfg.StateDir, "STATE")
			if a != b {
				diff = append(diff, a+" -> "+b)
			}
		}
		want := map[string][]string{
			"kube-apiserver": {"--advertise-address=172.30.0.2 -> --advertise-address=192.0.2.10"},
			"kubelet":        {"--node-ip=172.30.0.11 -> --node-ip=192.0.2.10"},
		}[d.Name]
		assert.Equal(t, want, diff, "%s: the only differences", d.Name)
	}
	assert.Equal(t, p.c.kubeletConfig(&p.c.st.Nodes[0]), strings.ReplaceAll(h.c.kubeletConfig(&h.c.st.Nodes[0]), hcfg.StateDir, cfg.StateDir), "the same KubeletConfiguration")
}

// Each node's kubelet owns its pod log folder: its garbage collector removes the
// folders of pods it does not run, so nodes sharing /var/log/pods removed each
// other's pods' logs (a conformance run saw `kubectl logs` fail on that).
func TestNodesHaveTheirOwnPodLogsDir(t *testing.T) {
	cfg := Config{Name: "logs", StateDir: filepath.Join(t.TempDir(), "state"), PeersDir: "/peers",
		KubeletBinary: "/bin/nk/kubelet", KubeProxyBinary: "/bin/nk/kube-proxy", Nodes: 2}
	require.NoError(t, cfg.defaults())
	p := planFor(t, cfg, nil)
	require.Len(t, p.c.st.Nodes, 2)
	var dirs []string
	for i := range p.c.st.Nodes {
		n := &p.c.st.Nodes[i]
		var kc struct {
			PodLogsDir string `json:"podLogsDir"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(p.c.kubeletConfig(n)), &kc))
		assert.Equal(t, filepath.Join(n.Dir, "pod-logs"), kc.PodLogsDir, "node %s", n.Name)
		dirs = append(dirs, kc.PodLogsDir)
	}
	assert.NotEqual(t, dirs[0], dirs[1])
}

func names(ls []launch) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Name)
	}
	return out
}

func servingIPs(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	blk, _ := pem.Decode(b)
	require.NotNil(t, blk)
	cert, err := x509.ParseCertificate(blk.Bytes)
	require.NoError(t, err)
	var out []string
	for _, ip := range cert.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}

func TestArgvIn(t *testing.T) {
	assert.Equal(t, []string{"/bin/x", "-a"}, argvIn("", "/bin/x", "-a"))
	assert.Equal(t, []string{"nsenter", "--net=/var/run/netns/nk-a-cp", "--", "/bin/x", "-a"}, argvIn("nk-a-cp", "/bin/x", "-a"))
}

// natAfterHostNode is `iptables-save -t nat` on a machine with Docker's chains and a
// host-network node with one hostPort pod (portmap v1.1's rules).
const natAfterHostNode = `# Generated by iptables-nft-save v1.8.9 (nf_tables) on Thu Dec  3 10:00:00 2026
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-DN-1a2b3c4d5e6f7a8b9c0d1 - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-HOSTPORT-MASQ - [0:0]
:CNI-HOSTPORT-SETMARK - [0:0]
:DOCKER - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
-A CNI-DN-1a2b3c4d5e6f7a8b9c0d1 -s 10.244.1.0/24 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-1a2b3c4d5e6f7a8b9c0d1 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.244.1.5:80
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"nodekit\" id: \"abc\"" -m multiport --dports 8080 -j CNI-DN-1a2b3c4d5e6f7a8b9c0d1
-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000
-A DOCKER -i docker0 -j RETURN
COMMIT
`

func TestHostCleanup(t *testing.T) {
	h := &HostChanges{Links: []string{"cni0"}, NFTables: []string{"ip kube-proxy", "ip6 kube-proxy"}, NATChainPrefixes: []string{"CNI-HOSTPORT-", "CNI-DN-"}}
	exists := func(name string) bool { return name == "cni0" || name == "eth0" }
	got := hostCleanup(h, exists, []string{"inet filter", "ip kube-proxy", "ip nat"}, natAfterHostNode)
	want := [][]string{
		{"ip", "link", "delete", "cni0"},
		{"nft", "delete", "table", "ip", "kube-proxy"},
		{"iptables", "-t", "nat", "-D", "PREROUTING", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "CNI-HOSTPORT-DNAT"},
		{"iptables", "-t", "nat", "-D", "OUTPUT", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "CNI-HOSTPORT-DNAT"},
		{"iptables", "-t", "nat", "-D", "POSTROUTING", "-m", "comment", "--comment", "CNI portfwd requiring masquerade", "-j", "CNI-HOSTPORT-MASQ"},
		{"iptables", "-t", "nat", "-F", "CNI-DN-1a2b3c4d5e6f7a8b9c0d1"},
		{"iptables", "-t", "nat", "-F", "CNI-HOSTPORT-DNAT"},
		{"iptables", "-t", "nat", "-F", "CNI-HOSTPORT-MASQ"},
		{"iptables", "-t", "nat", "-F", "CNI-HOSTPORT-SETMARK"},
		{"iptables", "-t", "nat", "-X", "CNI-DN-1a2b3c4d5e6f7a8b9c0d1"},
		{"iptables", "-t", "nat", "-X", "CNI-HOSTPORT-DNAT"},
		{"iptables", "-t", "nat", "-X", "CNI-HOSTPORT-MASQ"},
		{"iptables", "-t", "nat", "-X", "CNI-HOSTPORT-SETMARK"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("cleanup commands (-want +got):\n%s", d)
	}
	for _, c := range got {
		assert.NotContains(t, strings.Join(c, " "), "DOCKER", "another tool's rules are left alone")
		assert.NotContains(t, strings.Join(c, " "), "eth0")
	}

	// Nothing left (a second down): nothing to do.
	assert.Empty(t, hostCleanup(h, func(string) bool { return false }, []string{"inet filter"}, "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n"))
	// A namespaced cluster records no host changes: down does nothing to the machine.
	assert.Empty(t, hostCleanup(nil, exists, []string{"ip kube-proxy"}, natAfterHostNode))
}

func TestSysctlsToRestore(t *testing.T) {
	h := &HostChanges{Sysctls: []Sysctl{{Path: ipForwardSysctl, Value: "0"}}}
	read := func(v string) func(string) (string, error) {
		return func(string) (string, error) { return v + "\n", nil }
	}
	assert.Equal(t, h.Sysctls, sysctlsToRestore(h, read("1")), "the bridge plugin turned forwarding on: put it back")
	assert.Empty(t, sysctlsToRestore(h, read("0")), "unchanged: leave it")
	assert.Empty(t, sysctlsToRestore(nil, read("1")))
}

func TestParseProbeOutputs(t *testing.T) {
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 3500007F:0035 00000000:0000 0A 00000000:00000000 00:00000000 00000000   991        0 1 1 0000000000000000 100 0 0 10 0
   1: 00000000:2A02 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1A0B 0100007F:B3C2 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
`
	ports := map[int]bool{}
	parseListeningPorts(tcp, ports)
	assert.Equal(t, map[int]bool{53: true, 10754: true}, ports, "LISTEN sockets only; 0x1A0B (6667) is an established connection")
	tcp6 := `  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:2A03 00000000000000000000000000000000:0000 0A 00000000:00000000
`
	parseListeningPorts(tcp6, ports)
	assert.True(t, ports[10755])

	assert.Equal(t, []string{"inet filter", "ip kube-proxy", "ip6 kube-proxy"},
		parseNFTables("table inet filter\ntable ip kube-proxy\ntable ip6 kube-proxy\n"))
}
