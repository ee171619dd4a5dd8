package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodekit-dev/nodekit/agents/nodekit/internal/cluster"
	"github.com/nodekit-dev/nodekit/agents/nodekit/internal/explain"
	"github.com/nodekit-dev/nodekit/rules"
)

// Upstream's node-local defaults.
const (
	defaultKubeletHealthz   = "http://127.0.0.1:10248/healthz"
	defaultRuntimeEndpoint  = "unix:///run/containerd/containerd.sock"
	defaultCNIConfDir       = "/etc/cni/net.d"
	defaultKubeProxyHealthz = "http://127.0.0.1:10256/healthz"
)

type explainFlags struct {
	kubeconfig, output                          string
	grace                                       time.Duration
	onNode                                      bool
	kubeletHealthz, runtimeEndpoint, cniConfDir string
	proxyHealthz, proxyMode, nftTable           string
	timeout                                     time.Duration
	stateDir, name, node                        string
	traceFrom                                   string
	inCluster                                   string
}

func runExplain(args []string) (int, error) {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	var f explainFlags
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, else the default nodekit cluster's, else ~/.kube/config)")
	fs.StringVar(&f.output, "o", "text", "output format: text or json")
	fs.DurationVar(&f.grace, "node-monitor-grace-period", explain.DefaultNodeMonitorGracePeriod, "the cluster's kube-controller-manager --node-monitor-grace-period")
	fs.BoolVar(&f.onNode, "on-node", false, "also check the node itself with upstream's default addresses (kubelet and kube-proxy healthz, containerd socket, /etc/cni/net.d, nftables table kube-proxy)")
	fs.StringVar(&f.kubeletHealthz, "kubelet-healthz-url", "", "the kubelet's healthz URL to check (implies a node-local check)")
	fs.StringVar(&f.runtimeEndpoint, "container-runtime-endpoint", "", "the CRI endpoint to check (implies a node-local check)")
	fs.StringVar(&f.cniConfDir, "cni-conf-dir", "", "the CNI configuration folder to check (implies a node-local check)")
	fs.StringVar(&f.proxyHealthz, "kube-proxy-healthz-url", "", "kube-proxy's healthz URL to check (implies a node-local check)")
	fs.StringVar(&f.proxyMode, "proxy-mode", "", "read the kernel's Service rules back: nftables, iptables or none (with --on-node: nftables)")
	fs.StringVar(&f.nftTable, "nft-table", "kube-proxy", "the nftables table kube-proxy writes")
	fs.DurationVar(&f.timeout, "timeout", 20*time.Second, "overall time limit")
	fs.StringVar(&f.name, "name", "nodekit", "the nodekit cluster to explain (when no --kubeconfig is given)")
	fs.StringVar(&f.stateDir, "state-dir", "", "the nodekit cluster's state dir (default: the one for --name)")
	fs.StringVar(&f.traceFrom, "trace-from", "", "explain service: trace a new connection from this client IP through the kernel's rules (needs --proxy-mode)")
	fs.StringVar(&f.inCluster, "nodekit-cluster", "", "set by nodekit itself when it explains inside a node of a nodekit cluster: the state dir, for next steps that fit it")
	fs.StringVar(&f.node, "node", "", "in a nodekit cluster: the node whose kube-proxy and rules explain service reads (default: the first)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: nodekit explain node NAME | service NS/NAME [flags]\n\n")
		fs.PrintDefaults()
	}
	// Flags may come before or after the positional arguments.
	var pos []string
	rest := args
	for len(rest) > 0 {
		if err := fs.Parse(rest); err != nil {
			return exitError, fmt.Errorf("%w: %v", errUsage, err)
		}
		rest = fs.Args()
		if len(rest) > 0 {
			pos = append(pos, rest[0])
			rest = rest[1:]
		}
	}
	if len(pos) != 2 {
		fs.Usage()
		return exitError, fmt.Errorf("%w: want a kind (node or service) and a name, got %q", errUsage, pos)
	}
	if f.output != "text" && f.output != "json" {
		return exitError, fmt.Errorf("%w: -o %q: want text or json", errUsage, f.output)
	}
	if f.onNode {
		f.kubeletHealthz = orDefault(f.kubeletHealthz, defaultKubeletHealthz)
		f.runtimeEndpoint = orDefault(f.runtimeEndpoint, defaultRuntimeEndpoint)
		f.cniConfDir = orDefault(f.cniConfDir, defaultCNIConfDir)
		f.proxyHealthz = orDefault(f.proxyHealthz, defaultKubeProxyHealthz)
		f.proxyMode = orDefault(f.proxyMode, "nftables")
	}
	// In a nodekit cluster, explain runs inside the node's namespace, where the node's
	// kubelet, runtime, kube-proxy and rules are.
	if f.kubeconfig == "" && os.Getenv("KUBECONFIG") == "" {
		dir := f.stateDir
		if dir == "" {
			dir = defaultStateDir(f.name)
		}
		if st, err := cluster.LoadState(dir); err == nil {
			return explainInNode(st, pos, &f)
		} else if f.stateDir != "" {
			return exitError, err
		}
	}
	client, err := clientFor(f.kubeconfig)
	if err != nil {
		return exitError, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()

	var d explain.Diagnosis
	switch pos[0] {
	case "node", "nodes", "no":
		ev := explain.GatherNode(ctx, pos[1], explain.NodeOptions{
			Client: client, GracePeriod: f.grace,
			KubeletHealthzURL: f.kubeletHealthz, RuntimeEndpoint: f.runtimeEndpoint, CNIConfDir: f.cniConfDir,
		})
		d = explain.DiagnoseNode(ev, time.Now())
	case "service", "services", "svc":
		ns, name, ok := strings.Cut(pos[1], "/")
		if !ok {
			ns, name = "default", pos[1]
		}
		if ns == "" || name == "" {
			return exitError, fmt.Errorf("%w: service %q: want NAMESPACE/NAME", errUsage, pos[1])
		}
		opts := explain.ServiceOptions{Client: client, KubeProxyHealthzURL: f.proxyHealthz}
		if f.traceFrom != "" {
			a, err := netip.ParseAddr(f.traceFrom)
			if err != nil || !a.Is4() {
				return exitError, fmt.Errorf("%w: --trace-from %q is not an IPv4 address", errUsage, f.traceFrom)
			}
			opts.TraceFrom = a
		}
		switch f.proxyMode {
		case "", "none":
		case "nftables":
			w, err := rules.NewNFTables(rules.NFTablesConfig{Table: f.nftTable})
			if err != nil {
				return exitError, fmt.Errorf("reading the kernel's rules: %w", err)
			}
			opts.Rules, opts.RulesBackend = w, "nftables table ip "+f.nftTable
		case "iptables":
			w, err := rules.NewIPTables(ctx, rules.IPTablesConfig{})
			if err != nil {
				return exitError, fmt.Errorf("reading the kernel's rules: %w", err)
			}
			opts.Rules, opts.RulesBackend = w, "iptables-nft"
		default:
			return exitError, fmt.Errorf("%w: --proxy-mode %q: want nftables, iptables or none", errUsage, f.proxyMode)
		}
		d = explain.DiagnoseService(explain.GatherService(ctx, ns, name, opts), time.Now())
	default:
		return exitError, fmt.Errorf("%w: cannot explain a %q: want node or service", errUsage, pos[0])
	}
	if f.inCluster != "" {
		if st, err := cluster.LoadState(f.inCluster); err == nil {
			d.Next = nodekitNext(d.Next, st, f.node)
		}
	}
	var out io.Writer = os.Stdout
	if f.output == "json" {
		err = d.WriteJSON(out)
	} else {
		err = d.WriteText(out)
	}
	if err != nil {
		return exitError, err
	}
	if !d.Healthy {
		return exitUnhealthy, nil
	}
	return exitOK, nil
}

// explainInNode runs `nodekit explain` again inside the node's network namespace with
// that node's addresses, or, when the node is not in the cluster, against the API only.
func explainInNode(st *cluster.State, pos []string, f *explainFlags) (int, error) {
	nodeName := f.node
	if pos[0] == "node" || pos[0] == "nodes" || pos[0] == "no" {
		nodeName = pos[1]
	} else if nodeName == "" && len(st.Nodes) > 0 {
		nodeName = st.Nodes[0].Name
	}
	var node *cluster.Node
	for i := range st.Nodes {
		if st.Nodes[i].Name == nodeName {
			node = &st.Nodes[i]
		}
	}
	self, err := os.Executable()
	if err != nil {
		return exitError, err
	}
	args := []string{"explain", pos[0], pos[1], "-o", f.output, "--node-monitor-grace-period", st.GracePeriod, "--timeout", f.timeout.String(),
		"--nodekit-cluster", st.StateDir, "--node", nodeName}
	if f.traceFrom != "" {
		args = append(args, "--trace-from", f.traceFrom)
	}
	var cmd *exec.Cmd
	if node == nil || os.Geteuid() != 0 {
		args = append(args, "--kubeconfig", filepath.Join(st.StateDir, "kubeconfig"))
		cmd = exec.Command(self, args...)
	} else {
		args = append(args, "--kubeconfig", filepath.Join(st.StateDir, "cp", cluster.FabricAdminKubeconfig),
			"--kubelet-healthz-url", defaultKubeletHealthz, "--container-runtime-endpoint", node.Runtime, "--cni-conf-dir", node.CNIConfig,
			"--kube-proxy-healthz-url", defaultKubeProxyHealthz, "--proxy-mode", "nftables")
		if node.NetNS == "" {
			// --host-network: the node's kubelet, runtime and rules are the machine's.
			cmd = exec.Command(self, args...)
		} else {
			cmd = exec.Command("nsenter", append([]string{"--net=/var/run/netns/" + node.NetNS, "--", self}, args...)...)
		}
	}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	if err != nil {
		return exitError, err
	}
	return exitOK, nil
}

// nodekitNext rewrites the generic next steps (systemd units, a node to log in to)
// into their equivalents in a nodekit cluster: the part's log file, nodekit restart,
// crictl inside the node's namespace.
func nodekitNext(next []string, st *cluster.State, nodeName string) []string {
	var node *cluster.Node
	for i := range st.Nodes {
		if st.Nodes[i].Name == nodeName {
			node = &st.Nodes[i]
		}
	}
	if node == nil {
		return next
	}
	logOf := func(part string) string { return filepath.Join(st.StateDir, "logs", node.Name+"-"+part+".log") }
	crictl := node.OnNode() + "crictl --config " + filepath.Join(node.Dir, "crictl.yaml")
	out := make([]string, 0, len(next)+1)
	for _, n := range next {
		switch {
		case strings.HasPrefix(n, "journalctl -u kubelet"):
			out = append(out, "tail -n 50 "+logOf("kubelet"), "nodekit restart kubelet --node "+node.Name+" --state-dir "+st.StateDir)
		case strings.HasPrefix(n, "systemctl restart kube-proxy"):
			out = append(out, "nodekit restart kube-proxy --node "+node.Name+" --state-dir "+st.StateDir, "tail -n 50 "+logOf("kube-proxy"))
		case strings.HasPrefix(n, "systemctl status containerd"):
			out = append(out, "nodekit restart containerd --node "+node.Name+" --state-dir "+st.StateDir, "tail -n 50 "+logOf("containerd"))
		case strings.HasPrefix(n, "crictl "):
			out = append(out, crictl+" "+strings.TrimPrefix(n, "crictl "))
		case strings.HasPrefix(n, "nft list table"):
			nft := strings.Split(n, "   #")[0]
			if node.NetNS != "" {
				nft = "ip netns exec " + node.NetNS + " " + nft
			}
			out = append(out, nft)
		default:
			out = append(out, n)
		}
	}
	return out
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// clientFor loads a kubeconfig the way kubectl does, falling back to the default
// nodekit cluster's when neither the flag nor $KUBECONFIG names one.
func clientFor(path string) (kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	} else if os.Getenv("KUBECONFIG") == "" {
		if p := defaultStateKubeconfig(); p != "" {
			rules.ExplicitPath = p
		}
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.Timeout = 10 * time.Second
	return kubernetes.NewForConfig(cfg)
}
