// Package cluster brings up, supervises and tears down the local cluster `nodekit up`
// makes: a fabric network namespace with a bridge, a control-plane namespace (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler) and one namespace per node
// (containerd with a CNI bridge, and the node's kubelet and kube-proxy when their
// binaries are given). By default the machine's own network namespace is never
// changed: the one thing in it is a TCP forwarder on 127.0.0.1 to the API server.
// Config.HostNetwork is the exception (host.go): one node and the control plane run in
// the machine's own namespace, as on a kubeadm single-node cluster.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/internal/containerdconf"
)

// Fixed addressing inside the cluster's own namespaces (nothing here is visible on the
// machine's network).
const (
	FabricCIDR     = "172.30.0.0/24"
	fabricGateway  = "172.30.0.1"
	ControlPlaneIP = "172.30.0.2"
	ServiceCIDR    = "10.96.0.0/16"
	ClusterCIDR    = "10.244.0.0/16"
	APIServerPort  = 6443
	// KubernetesServiceIP is the first address of ServiceCIDR.
	KubernetesServiceIP = "10.96.0.1"
	cniBinDir           = "/usr/lib/cni"
)

// ErrPrerequisite marks a missing tool, binary or image.
var ErrPrerequisite = errors.New("missing prerequisite")

// Config is one `nodekit up`.
type Config struct {
	// Name prefixes the network namespaces (nk-NAME-...). Empty means "nodekit".
	Name string
	// StateDir holds everything of the cluster. Required.
	StateDir string
	// Nodes is the number of nodes; zero means 1.
	Nodes int
	// APIPort is the port on 127.0.0.1 kubectl reaches the API server through. Zero
	// means 6443.
	APIPort int
	// PeersDir holds etcd, kube-apiserver, kube-controller-manager and kube-scheduler.
	PeersDir string
	// ImagesDir holds images.tsv and the image tars hack/setup-containerd.sh builds.
	ImagesDir string
	// KubeletBinary and KubeProxyBinary are nodekit's agents; empty leaves the nodes
	// with containerd only.
	KubeletBinary, KubeProxyBinary string
	// ContainerdDir holds the containerd, containerd-shim-runc-v2 and ctr every node
	// runs (hack/build-containerd.sh builds containerd 2.x there). Empty means the
	// machine's, found on $PATH (Debian's 1.6).
	ContainerdDir string
	// CoreDNSImageTar is the CoreDNS image hack/build-coredns.sh builds (CoreDNSImage);
	// empty leaves the DNS add-on out.
	CoreDNSImageTar string
	// NodeMonitorGracePeriod is kube-controller-manager's flag; zero means upstream's 50s.
	NodeMonitorGracePeriod time.Duration
	// HostNetwork runs the one node and the control plane in the machine's own network
	// namespace instead of namespaces of their own (see host.go). False: namespaces.
	HostNetwork bool
	// NodeIP is the host-network node's address; empty means the address of the
	// interface with the default route. Only with HostNetwork.
	NodeIP string
	// Log receives progress lines. Nil means none.
	Log io.Writer
}

func (c *Config) defaults() error {
	if c.Name == "" {
		c.Name = "nodekit"
	}
	if c.Nodes == 0 {
		c.Nodes = 1
	}
	if c.Nodes < 1 || c.Nodes > 200 {
		return fmt.Errorf("--nodes %d: want 1 to 200", c.Nodes)
	}
	if c.HostNetwork && c.Nodes != 1 {
		return fmt.Errorf("--host-network runs exactly one node (the machine itself): --nodes %d", c.Nodes)
	}
	if c.NodeIP != "" && !c.HostNetwork {
		return errors.New("--node-ip is for --host-network only (namespaced nodes get fabric addresses)")
	}
	if c.APIPort == 0 {
		c.APIPort = APIServerPort
	}
	if c.NodeMonitorGracePeriod == 0 {
		c.NodeMonitorGracePeriod = 50 * time.Second
	}
	if c.StateDir == "" {
		return errors.New("no state dir")
	}
	abs, err := filepath.Abs(c.StateDir)
	if err != nil {
		return err
	}
	c.StateDir = abs
	if c.Log == nil {
		c.Log = io.Discard
	}
	// Namespace names: "nk-" + name + "-node-200" must stay a sane file name.
	if len(c.Name) > 32 || strings.ContainsAny(c.Name, "/ \t\n") {
		return fmt.Errorf("cluster name %q: want at most 32 characters, no slashes or spaces", c.Name)
	}
	return nil
}

// Images is what images.tsv lists.
type Images struct {
	Pause, PauseTar     string
	Busybox, BusyboxTar string
}

// CheckPrerequisites names the first thing `up` cannot do without.
func CheckPrerequisites(c *Config) (*Images, error) {
	tools := []string{"ip", "nsenter", "runc"}
	containerd := []string{"containerd", "containerd-shim-runc-v2", "ctr"}
	if c.ContainerdDir == "" {
		tools = append(tools, containerd...)
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%w: %s is not installed (hack/up.sh installs it)", ErrPrerequisite, tool)
		}
	}
	if c.ContainerdDir != "" {
		if !filepath.IsAbs(c.ContainerdDir) {
			return nil, fmt.Errorf("%w: --containerd-dir %s: want an absolute path", ErrPrerequisite, c.ContainerdDir)
		}
		for _, b := range containerd {
			if st, err := os.Stat(filepath.Join(c.ContainerdDir, b)); err != nil || st.Mode()&0o111 == 0 {
				return nil, fmt.Errorf("%w: %s not found in --containerd-dir %s (hack/build-containerd.sh builds it)", ErrPrerequisite, b, c.ContainerdDir)
			}
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			return nil, fmt.Errorf("%w: CNI plugin %s missing in %s (apt-get install containernetworking-plugins)", ErrPrerequisite, p, cniBinDir)
		}
	}
	if c.PeersDir == "" {
		return nil, fmt.Errorf("%w: no peers folder: pass --peers-dir or set NODEKIT_PEERS_DIR (hack/build-peers.sh prints it)", ErrPrerequisite)
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if st, err := os.Stat(filepath.Join(c.PeersDir, b)); err != nil || st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("%w: %s not found in %s (hack/build-peers.sh builds it)", ErrPrerequisite, b, c.PeersDir)
		}
	}
	for _, b := range []string{c.KubeletBinary, c.KubeProxyBinary} {
		if b == "" {
			continue
		}
		if st, err := os.Stat(b); err != nil || st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("%w: agent binary %s not found", ErrPrerequisite, b)
		}
	}
	if c.CoreDNSImageTar != "" {
		if _, err := os.Stat(c.CoreDNSImageTar); err != nil {
			return nil, fmt.Errorf("%w: CoreDNS image %s not found (hack/build-coredns.sh builds it)", ErrPrerequisite, c.CoreDNSImageTar)
		}
	}
	if c.ImagesDir == "" {
		return nil, fmt.Errorf("%w: no images folder: pass --images-dir or set NODEKIT_IMAGES_DIR (hack/setup-containerd.sh prints it)", ErrPrerequisite)
	}
	b, err := os.ReadFile(filepath.Join(c.ImagesDir, "images.tsv"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v (hack/setup-containerd.sh builds the images)", ErrPrerequisite, err)
	}
	im := &Images{}
	for line := range strings.Lines(string(b)) {
		f := strings.Split(strings.TrimSpace(line), "\t")
		if len(f) != 3 {
			continue
		}
		tar := filepath.Join(c.ImagesDir, f[2])
		if _, err := os.Stat(tar); err != nil {
			return nil, fmt.Errorf("%w: image tar %s missing (hack/setup-containerd.sh)", ErrPrerequisite, tar)
		}
		switch f[0] {
		case "pause":
			im.Pause, im.PauseTar = f[1], tar
		case "busybox":
			im.Busybox, im.BusyboxTar = f[1], tar
		}
	}
	if im.Pause == "" || im.Busybox == "" {
		return nil, fmt.Errorf("%w: %s lacks the pause or busybox image", ErrPrerequisite, filepath.Join(c.ImagesDir, "images.tsv"))
	}
	return im, nil
}

// Cluster is a cluster being brought up or running in this process.
type Cluster struct {
	cfg    Config
	st     *State
	images *Images
	ca     *authority
	// Listener is the forwarder's socket on 127.0.0.1:APIPort.
	Listener net.Listener
	// MirrorListener is the registry mirror's socket in the fabric namespace (nil with
	// HostNetwork): served by Serve, or handed to the supervisor with Listener.
	MirrorListener net.Listener
	dialer         *NSDialer
	// host is set with Config.HostNetwork: what checkHost found.
	host *hostFacts
	// mu guards st while the control plane and the nodes' runtimes start side by side.
	mu sync.Mutex
}

// HasKubelet reports whether the nodes run a kubelet.
func (c *Cluster) HasKubelet() bool { return c.cfg.KubeletBinary != "" }

// State is the recorded state.
func (c *Cluster) State() *State { return c.st }

// Kubeconfig is the admin kubeconfig for kubectl on the machine.
func (c *Cluster) Kubeconfig() string { return filepath.Join(c.cfg.StateDir, "kubeconfig") }

func (c *Cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.cfg.Log, "nodekit up: "+format+"\n", args...)
}

func (c *Cluster) ns(suffix string) string { return "nk-" + c.cfg.Name + "-" + suffix }

// cpNS is the control plane's network namespace, "" for the machine's own.
func (c *Cluster) cpNS() string {
	if c.host != nil {
		return ""
	}
	return c.ns("cp")
}

// apiEndpoint is where the API server listens and what it advertises (the kubernetes
// Service's endpoint): 172.30.0.2:6443 in its namespace; on the machine's network the
// node's address and --api-port, with no forwarder in between.
func (c *Cluster) apiEndpoint() (ip string, port int) {
	if c.host != nil {
		return c.host.IP, c.cfg.APIPort
	}
	return ControlPlaneIP, APIServerPort
}

// Up checks everything it can before touching anything (prerequisites, the state dir,
// the port, namespace names), then builds the cluster step by step, recording each
// step; on failure it tears down what it made. The returned Cluster's forwarder is
// not running yet: call Serve (foreground) or hand Listener to a supervisor.
func Up(ctx context.Context, cfg Config) (*Cluster, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	images, err := CheckPrerequisites(&cfg)
	if err != nil {
		return nil, err
	}
	if cfg.HostNetwork {
		// What the probe and down use to read and remove kube-proxy's tables and
		// portmap's chains in the machine's namespace (kube-proxy itself execs nft too).
		for _, tool := range []string{"nft", "iptables", "iptables-save"} {
			if _, err := exec.LookPath(tool); err != nil {
				return nil, fmt.Errorf("%w: %s is not installed (--host-network needs it)", ErrPrerequisite, tool)
			}
		}
		c, err := claimHost(cfg, images, machineProbe{})
		if err != nil {
			return nil, err
		}
		return c.buildOrTearDown(ctx)
	}
	c := &Cluster{cfg: cfg, images: images}
	if err := checkFree(cfg.StateDir); err != nil {
		return nil, err
	}
	for _, suffix := range append([]string{"fabric", "cp"}, nodeNames(cfg.Nodes)...) {
		if _, err := os.Stat(nsPath(c.ns(suffix))); err == nil {
			return nil, fmt.Errorf("%w: network namespace %s exists: another cluster named %q runs (pick another --name, or run nodekit down on its state dir)", ErrNameInUse, c.ns(suffix), cfg.Name)
		}
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.APIPort)))
	if err != nil {
		return nil, fmt.Errorf("%w: 127.0.0.1:%d: %v (pick another with --api-port)", ErrPortInUse, cfg.APIPort, err)
	}
	if err := claim(cfg.StateDir, cfg.Name); err != nil {
		l.Close()
		return nil, err
	}
	c.Listener = l
	c.st = c.newState()
	return c.buildOrTearDown(ctx)
}

// claimHost is Up's first half for Config.HostNetwork: the machine is checked
// (read-only, through probe) before the state dir is claimed, and what the node will
// change outside the state dir goes into the first state written. Nothing is started:
// the caller builds. There is no forwarder: the API server listens on the machine's
// network itself.
func claimHost(cfg Config, images *Images, probe hostProbe) (*Cluster, error) {
	if err := checkFree(cfg.StateDir); err != nil {
		return nil, err
	}
	facts, err := checkHost(&cfg, probe)
	if err != nil {
		return nil, err
	}
	if err := claim(cfg.StateDir, cfg.Name); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, images: images, host: facts}
	c.st = c.newState()
	if err := c.st.save(); err != nil {
		return nil, err
	}
	return c, nil
}

// newState is the state before anything is made.
func (c *Cluster) newState() *State {
	ip, _ := c.apiEndpoint()
	st := &State{Name: c.cfg.Name, StateDir: c.cfg.StateDir, APIPort: c.cfg.APIPort, ControlPlaneIP: ip, GracePeriod: c.cfg.NodeMonitorGracePeriod.String(),
		ContainerdDir: c.cfg.ContainerdDir}
	if c.host != nil {
		st.HostNetwork = true
		changes := c.host.Changes
		st.Host = &changes
	}
	return st
}

func (c *Cluster) buildOrTearDown(ctx context.Context) (*Cluster, error) {
	if err := c.st.save(); err != nil {
		if c.Listener != nil {
			c.Listener.Close()
		}
		return nil, err
	}
	if err := c.build(ctx); err != nil {
		c.logf("failed: %v; tearing down what was made", err)
		if c.Listener != nil {
			c.Listener.Close()
		}
		if c.MirrorListener != nil {
			c.MirrorListener.Close()
		}
		if c.dialer != nil {
			c.dialer.Close()
		}
		if derr := Down(context.Background(), c.cfg.StateDir, c.cfg.Log); derr != nil {
			err = errors.Join(err, fmt.Errorf("tear-down after the failure: %w", derr))
		}
		return nil, err
	}
	return c, nil
}

func nodeNames(n int) []string {
	out := make([]string, n)
	for i := range n {
		out[i] = "node-" + strconv.Itoa(i+1)
	}
	return out
}

func (c *Cluster) build(ctx context.Context) error {
	begin := time.Now()
	if err := c.pki(); err != nil {
		return err
	}
	if err := c.network(ctx); err != nil {
		return err
	}
	if c.host == nil {
		c.logf("network namespaces ready (%s)", time.Since(begin).Round(time.Millisecond))
		d, err := NewNSDialer(nsPath(c.cpNS()))
		if err != nil {
			return err
		}
		c.dialer = d
		if err := c.startMirror(c.imageTars()); err != nil {
			return err
		}
	} else {
		c.logf("node %s on the machine's network at %s", c.host.NodeName, c.host.IP)
	}
	// containerd on every node starts while the control plane comes up.
	nodeErr := make(chan error, 1)
	go func() { nodeErr <- c.startRuntimes(ctx) }()
	if err := c.controlPlane(ctx); err != nil {
		<-nodeErr
		return err
	}
	c.logf("control plane ready (%s)", time.Since(begin).Round(time.Millisecond))
	if err := <-nodeErr; err != nil {
		return err
	}
	c.logf("containerd ready on %d node(s) (%s)", len(c.st.Nodes), time.Since(begin).Round(time.Millisecond))
	if c.cfg.CoreDNSImageTar != "" {
		cfg, err := c.adminREST()
		if err != nil {
			return err
		}
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		if err := poll(ctx, time.Minute, 200*time.Millisecond, func(ctx context.Context) error { return deployCoreDNS(ctx, client) }); err != nil {
			return err
		}
		c.logf("CoreDNS add-on deployed (kube-dns at %s)", ClusterDNS)
	}
	if c.cfg.KubeletBinary != "" || c.cfg.KubeProxyBinary != "" {
		if err := c.agents(ctx); err != nil {
			return err
		}
	}
	if err := c.waitDefaultServiceAccount(ctx); err != nil {
		return err
	}
	return c.st.save()
}

// waitDefaultServiceAccount waits until kube-controller-manager's serviceaccount
// controller has made the default namespace's "default" ServiceAccount: until then the
// ServiceAccount admission plugin refuses every pod there, so a cluster is not ready for
// a user's first `kubectl run` before it exists (kind waits for it too).
func (c *Cluster) waitDefaultServiceAccount(ctx context.Context) error {
	cfg, err := c.adminREST()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return poll(ctx, time.Minute, 100*time.Millisecond, func(ctx context.Context) error {
		_, err := client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("the default ServiceAccount: %w", err)
		}
		return nil
	})
}

func (c *Cluster) path(parts ...string) string {
	return filepath.Join(append([]string{c.cfg.StateDir}, parts...)...)
}

func (c *Cluster) pki() error {
	ca, err := newAuthority("nodekit-ca-" + c.cfg.Name)
	if err != nil {
		return err
	}
	c.ca = ca
	// As kubeadm: a CA of its own for the aggregation layer, whose one client certificate
	// (CN front-proxy-client) kube-apiserver presents when it proxies to an aggregated API
	// server; those trust the X-Remote-* headers only from that name under that CA.
	frontProxyCA, err := newAuthority("nodekit-front-proxy-ca-" + c.cfg.Name)
	if err != nil {
		return err
	}
	frontProxyCert, frontProxyKey, err := frontProxyCA.issue(frontProxyClientCN, nil, nil, nil)
	if err != nil {
		return err
	}
	saKey, err := serviceAccountKey()
	if err != nil {
		return err
	}
	apiIP, apiPort := c.apiEndpoint()
	servingCert, servingKey, err := ca.issue("kube-apiserver", nil,
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(apiIP), net.ParseIP(KubernetesServiceIP)},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"})
	if err != nil {
		return err
	}
	kubeletClientCert, kubeletClientKey, err := ca.issue("kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil)
	if err != nil {
		return err
	}
	if err := writeFiles(map[string][]byte{
		c.path("pki", "ca.crt"): ca.certPEM, c.path("pki", "ca.key"): ca.keyPEM,
		c.path("pki", "sa.key"):        saKey,
		c.path("pki", "apiserver.crt"): servingCert, c.path("pki", "apiserver.key"): servingKey,
		c.path("pki", "apiserver-kubelet-client.crt"): kubeletClientCert, c.path("pki", "apiserver-kubelet-client.key"): kubeletClientKey,
		c.path("pki", "front-proxy-ca.crt"): frontProxyCA.certPEM, c.path("pki", "front-proxy-ca.key"): frontProxyCA.keyPEM,
		c.path("pki", "front-proxy-client.crt"): frontProxyCert, c.path("pki", "front-proxy-client.key"): frontProxyKey,
	}); err != nil {
		return err
	}
	local := "https://127.0.0.1:" + strconv.Itoa(apiPort)
	for _, k := range []struct{ file, cn, group string }{
		{"admin.kubeconfig", "kubernetes-admin", "system:masters"},
		{"controller-manager.kubeconfig", "system:kube-controller-manager", ""},
		{"scheduler.kubeconfig", "system:kube-scheduler", ""},
	} {
		var groups []string
		if k.group != "" {
			groups = []string{k.group}
		}
		if err := ca.writeKubeconfig(c.path("cp", k.file), c.cfg.Name, local, k.cn, groups...); err != nil {
			return err
		}
	}
	// On the host network the "fabric" address is the node's: the kubeconfig explain
	// uses on the node works the same way.
	fabric := "https://" + net.JoinHostPort(apiIP, strconv.Itoa(apiPort))
	if err := ca.writeKubeconfig(c.path("cp", FabricAdminKubeconfig), c.cfg.Name, fabric, "kubernetes-admin", "system:masters"); err != nil {
		return err
	}
	// What kubectl on the machine uses: the forwarder on 127.0.0.1 (on the host
	// network, the API server itself).
	return ca.writeKubeconfig(c.Kubeconfig(), c.cfg.Name, "https://127.0.0.1:"+strconv.Itoa(c.cfg.APIPort), "kubernetes-admin", "system:masters")
}

func (c *Cluster) addNS(ctx context.Context, suffix string) (string, error) {
	name := c.ns(suffix)
	if err := ip(ctx, "netns", "add", name); err != nil {
		return "", err
	}
	c.st.Namespaces = append(c.st.Namespaces, name)
	if err := c.st.save(); err != nil {
		return "", err
	}
	return name, ip(ctx, "-n", name, "link", "set", "lo", "up")
}

// attach joins namespace ns to the fabric bridge with a veth whose inner end is eth0
// with addr/24. Both ends are created inside the fabric namespace and the inner one is
// moved: nothing passes through the machine's namespace.
func (c *Cluster) attach(ctx context.Context, ns, short, addr string) error {
	fabric := c.ns("fabric")
	outer, inner := "v-"+short, "i-"+short
	steps := [][]string{
		{"-n", fabric, "link", "add", outer, "type", "veth", "peer", "name", inner},
		{"-n", fabric, "link", "set", inner, "netns", ns},
		{"-n", fabric, "link", "set", outer, "master", "br0", "up"},
		{"-n", ns, "link", "set", inner, "name", "eth0"},
		{"-n", ns, "addr", "add", addr + "/24", "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "route", "add", "default", "via", fabricGateway},
	}
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

// nodeLayout is every node's record before anything is made: in namespace
// nk-NAME-node-N at fabric address 172.30.0.(10+N), or, on the host network, the one
// node named after the machine at its address, in the machine's namespace ("").
func (c *Cluster) nodeLayout() []Node {
	node := func(name, ip, podCIDR, ns string) Node {
		dir := c.path("nodes", name)
		return Node{
			Name: name, IP: ip, PodCIDR: podCIDR, NetNS: ns, Dir: dir,
			Runtime: "unix://" + filepath.Join(dir, "containerd.sock"), CNIConfig: filepath.Join(dir, "cni"),
		}
	}
	if c.host != nil {
		return []Node{node(c.host.NodeName, c.host.IP, "10.244.1.0/24", "")}
	}
	var out []Node
	for i, name := range nodeNames(c.cfg.Nodes) {
		out = append(out, node(name, fmt.Sprintf("172.30.0.%d", 11+i), fmt.Sprintf("10.244.%d.0/24", i+1), c.ns(name)))
	}
	return out
}

func (c *Cluster) network(ctx context.Context) error {
	if c.host != nil {
		// Nothing to make: the node's network is the machine's. Its CNI bridge appears
		// with the first pod; State.Host already records it.
		c.st.Nodes = c.nodeLayout()
		return c.st.save()
	}
	fabric, err := c.addNS(ctx, "fabric")
	if err != nil {
		return err
	}
	for _, s := range [][]string{
		{"-n", fabric, "link", "add", "br0", "type", "bridge"},
		{"-n", fabric, "addr", "add", fabricGateway + "/24", "dev", "br0"},
		{"-n", fabric, "link", "set", "br0", "up"},
	} {
		if err := ip(ctx, s...); err != nil {
			return err
		}
	}
	cp, err := c.addNS(ctx, "cp")
	if err != nil {
		return err
	}
	if err := c.attach(ctx, cp, "cp", ControlPlaneIP); err != nil {
		return err
	}
	for i, n := range c.nodeLayout() {
		ns, err := c.addNS(ctx, n.Name)
		if err != nil {
			return err
		}
		if err := c.attach(ctx, ns, fmt.Sprintf("n%d", i+1), n.IP); err != nil {
			return err
		}
		c.st.Nodes = append(c.st.Nodes, n)
		// Forwarding for pods; no ICMP redirects: pod traffic between nodes goes by the
		// routes below, not by the fabric's gateway.
		if err := inNS(ctx, ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward; echo 0 > /proc/sys/net/ipv4/conf/all/send_redirects"); err != nil {
			return err
		}
	}
	// Every namespace on the fabric reaches every node's pod CIDR through that node.
	for _, n := range c.st.Nodes {
		for _, ns := range append([]string{cp}, nsNames(c.st.Nodes)...) {
			if ns == n.NetNS {
				continue
			}
			if err := ip(ctx, "-n", ns, "route", "add", n.PodCIDR, "via", n.IP); err != nil {
				return err
			}
		}
	}
	return c.st.save()
}

func nsNames(nodes []Node) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.NetNS
	}
	return out
}

func (c *Cluster) record(name, node, logPath string, cmd *exec.Cmd) error {
	p := Process{Name: name, PID: cmd.Process.Pid, Node: node, Log: logPath, Command: cmd.Args}
	// nsenter execs the binary: the start time read now is the binary's.
	st, err := startTime(p.PID)
	if err != nil {
		return fmt.Errorf("%s exited at once (see %s): %w", name, logPath, err)
	}
	p.StartTime = st
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.Processes = append(c.st.Processes, p)
	return c.st.save()
}

// process is the recorded process name on node ("" for the control plane).
func (c *Cluster) process(name, node string) Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.st.Processes {
		if p.Name == name && p.Node == node {
			return p
		}
	}
	return Process{}
}

// launch is one long-running process of the plan: which binary, with which
// arguments, in which network namespace ("" is the machine's own).
type launch struct {
	Name string
	// Node is the node it serves, "" for the control plane.
	Node  string
	NetNS string
	Bin   string
	Args  []string
}

func (l launch) logPath(c *Cluster) string {
	if l.Node == "" {
		return c.path("logs", l.Name+".log")
	}
	return c.path("logs", l.Node+"-"+l.Name+".log")
}

// start runs l and records it in the state.
func (c *Cluster) start(l launch) error {
	logPath := l.logPath(c)
	cmd, err := startIn(l.NetNS, logPath, l.Bin, l.Args...)
	if err != nil {
		return err
	}
	return c.record(l.Name, l.Node, logPath, cmd)
}

// controlPlaneLaunches are etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler, in start order. etcd, kube-controller-manager and kube-scheduler
// listen on loopback only (in the control plane's namespace, or the machine's);
// kube-apiserver on every address, as kubeadm's does, advertising apiEndpoint.
func (c *Cluster) controlPlaneLaunches() []launch {
	cp := c.cpNS()
	peer := func(b string) string { return filepath.Join(c.cfg.PeersDir, b) }
	pki := func(f string) string { return c.path("pki", f) }
	apiIP, apiPort := c.apiEndpoint()
	kcm := c.path("cp", "controller-manager.kubeconfig")
	sched := c.path("cp", "scheduler.kubeconfig")
	return []launch{
		{Name: "etcd", NetNS: cp, Bin: peer("etcd"), Args: []string{
			"--data-dir=" + c.path("cp", "etcd"),
			"--listen-client-urls=http://127.0.0.1:2379",
			"--listen-peer-urls=http://127.0.0.1:2380",
		}},
		{Name: "kube-apiserver", NetNS: cp, Bin: peer("kube-apiserver"), Args: []string{
			"--etcd-servers=http://127.0.0.1:2379",
			"--bind-address=0.0.0.0",
			"--advertise-address=" + apiIP,
			"--secure-port=" + strconv.Itoa(apiPort),
			"--tls-cert-file=" + pki("apiserver.crt"), "--tls-private-key-file=" + pki("apiserver.key"),
			"--client-ca-file=" + pki("ca.crt"),
			"--kubelet-client-certificate=" + pki("apiserver-kubelet-client.crt"), "--kubelet-client-key=" + pki("apiserver-kubelet-client.key"),
			"--kubelet-preferred-address-types=InternalIP,Hostname",
			"--authorization-mode=Node,RBAC",
			"--enable-admission-plugins=NodeRestriction",
			"--service-cluster-ip-range=" + ServiceCIDR,
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + pki("sa.key"),
			"--service-account-signing-key-file=" + pki("sa.key"),
			"--allow-privileged=true",
			// The aggregation layer, with kubeadm's flags and values.
			"--requestheader-client-ca-file=" + pki("front-proxy-ca.crt"),
			"--requestheader-allowed-names=" + frontProxyClientCN,
			"--requestheader-username-headers=X-Remote-User",
			"--requestheader-group-headers=X-Remote-Group",
			"--requestheader-extra-headers-prefix=X-Remote-Extra-",
			"--proxy-client-cert-file=" + pki("front-proxy-client.crt"), "--proxy-client-key-file=" + pki("front-proxy-client.key"),
			// Webhooks and aggregated APIs are Services; the control plane's namespace has
			// no kube-proxy, but it has a route to every pod CIDR, so kube-apiserver calls
			// their endpoints' pod IPs instead of the ClusterIP.
			"--enable-aggregator-routing=true",
		}},
		{Name: "kube-controller-manager", NetNS: cp, Bin: peer("kube-controller-manager"), Args: []string{
			"--kubeconfig=" + kcm, "--authentication-kubeconfig=" + kcm, "--authorization-kubeconfig=" + kcm,
			"--bind-address=127.0.0.1",
			"--leader-elect=false",
			"--use-service-account-credentials=true",
			"--root-ca-file=" + pki("ca.crt"),
			"--requestheader-client-ca-file=" + pki("front-proxy-ca.crt"),
			"--service-account-private-key-file=" + pki("sa.key"),
			"--cluster-signing-cert-file=" + pki("ca.crt"), "--cluster-signing-key-file=" + pki("ca.key"),
			"--service-cluster-ip-range=" + ServiceCIDR,
			"--cluster-cidr=" + ClusterCIDR,
			"--node-monitor-grace-period=" + c.cfg.NodeMonitorGracePeriod.String(),
		}},
		{Name: "kube-scheduler", NetNS: cp, Bin: peer("kube-scheduler"), Args: []string{
			"--kubeconfig=" + sched, "--authentication-kubeconfig=" + sched, "--authorization-kubeconfig=" + sched,
			"--bind-address=127.0.0.1",
			"--leader-elect=false",
		}},
	}
}

func (c *Cluster) controlPlane(ctx context.Context) error {
	ls := c.controlPlaneLaunches()
	for _, l := range ls[:2] {
		if err := c.start(l); err != nil {
			return err
		}
	}
	if err := c.waitAPI(ctx); err != nil {
		return err
	}
	for _, l := range ls[2:] {
		if err := c.start(l); err != nil {
			return err
		}
	}
	return nil
}

// AdminRESTConfig is the admin identity, dialing the API server inside the
// control-plane namespace directly (not through the forwarder); on the host network,
// plainly.
func (c *Cluster) adminREST() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.path("cp", "admin.kubeconfig"))
	if err != nil {
		return nil, err
	}
	if c.dialer != nil {
		cfg.Dial = c.dialer.DialContext
	}
	cfg.Timeout = 5 * time.Second
	return cfg, nil
}

func (c *Cluster) waitAPI(ctx context.Context) error {
	cfg, err := c.adminREST()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	apiserver := c.process("kube-apiserver", "")
	return poll(ctx, 2*time.Minute, 100*time.Millisecond, func(ctx context.Context) error {
		if !apiserver.Alive() {
			return fmt.Errorf("%w: kube-apiserver exited (see %s)", errGiveUp, apiserver.Log)
		}
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("/readyz: %w", err)
		}
		if string(body) != "ok" {
			return fmt.Errorf("/readyz said %q", body)
		}
		return nil
	})
}

var errGiveUp = errors.New("gave up")

// poll runs check every interval until it succeeds, returns errGiveUp, or timeout.
func poll(ctx context.Context, timeout, interval time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		attempt, acancel := context.WithTimeout(ctx, 3*time.Second)
		last = check(attempt)
		acancel()
		if last == nil || errors.Is(last, errGiveUp) {
			return last
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(interval):
		}
	}
}

func (c *Cluster) startRuntimes(ctx context.Context) error {
	// One look at the binary every node runs picks the configuration layout.
	version, err := containerdconf.BinaryVersion(ctx, c.st.containerdBinary("containerd"))
	if err != nil {
		return err
	}
	for i := range c.st.Nodes {
		if err := c.startRuntime(ctx, &c.st.Nodes[i], version); err != nil {
			return fmt.Errorf("node %s: %w", c.st.Nodes[i].Name, err)
		}
	}
	for i := range c.st.Nodes {
		n := c.st.Nodes[i]
		if err := c.waitRuntime(ctx, n); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		for _, tar := range c.imageTars() {
			if err := importImage(ctx, c.st, n, tar); err != nil {
				return fmt.Errorf("node %s: %w", n.Name, err)
			}
		}
	}
	return nil
}

// imageTars are the images up imports into every node (and the mirror serves).
func (c *Cluster) imageTars() []string {
	tars := []string{c.images.PauseTar, c.images.BusyboxTar}
	if c.cfg.CoreDNSImageTar != "" {
		tars = append(tars, c.cfg.CoreDNSImageTar)
	}
	return tars
}

// containerdBinary is the path of containerd, containerd-shim-runc-v2 or ctr the
// cluster runs: from State.ContainerdDir, or the name alone for $PATH.
func (st *State) containerdBinary(name string) string {
	if st.ContainerdDir == "" {
		return name
	}
	return filepath.Join(st.ContainerdDir, name)
}

func importImage(ctx context.Context, st *State, n Node, tar string) error {
	out, err := exec.CommandContext(ctx, st.containerdBinary("ctr"), "--address", strings.TrimPrefix(n.Runtime, "unix://"), "--namespace", "k8s.io", "images", "import", tar).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s: %w: %s", tar, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (c *Cluster) startRuntime(ctx context.Context, n *Node, version containerdconf.Version) error {
	for _, d := range []string{"root", "state", "runc", "opt", "certs.d", "cni", "cni-ipam"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return err
		}
	}
	rc := containerdconf.Config{
		Root:          filepath.Join(n.Dir, "root"),
		State:         filepath.Join(n.Dir, "state"),
		Socket:        strings.TrimPrefix(n.Runtime, "unix://"),
		Opt:           filepath.Join(n.Dir, "opt"),
		SandboxImage:  c.images.Pause,
		StreamAddress: n.IP,
		RuncRoot:      filepath.Join(n.Dir, "runc"),
		CNIBinDir:     cniBinDir,
		CNIConfDir:    n.CNIConfig,
		CertsDir:      filepath.Join(n.Dir, "certs.d"),
	}
	if c.cfg.ContainerdDir != "" {
		rc.Shim = filepath.Join(c.cfg.ContainerdDir, "containerd-shim-runc-v2")
	}
	conf := rc.Render(version)
	if err := os.WriteFile(filepath.Join(n.Dir, "containerd.toml"), []byte(conf), 0o644); err != nil {
		return err
	}
	if c.st.Mirror != "" {
		regs, err := registriesOf(c.imageTars())
		if err != nil {
			return err
		}
		if err := writeMirrorHosts(*n, c.st.Mirror, regs); err != nil {
			return err
		}
	}
	// Written before containerd starts: a file moved in later was not noticed. No
	// ipMasq: pod-to-pod traffic is routed, not masqueraded; the node's own rules are
	// kube-proxy's. portmap gives containers' hostPorts, as the CNI configurations
	// kubeadm clusters use do (containerd passes the sandbox's port mappings to it);
	// its iptables rules live in the node's namespace like everything else.
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "nodekit",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    },
    {
      "type": "portmap",
      "capabilities": {"portMappings": true}
    }
  ]
}
`, n.PodCIDR, filepath.Join(n.Dir, "cni-ipam"))
	if err := os.WriteFile(filepath.Join(n.CNIConfig, "10-nodekit.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	crictl := fmt.Sprintf("runtime-endpoint: %s\nimage-endpoint: %s\ntimeout: 30\n", n.Runtime, n.Runtime)
	if err := os.WriteFile(filepath.Join(n.Dir, "crictl.yaml"), []byte(crictl), 0o644); err != nil {
		return err
	}
	logPath := c.path("logs", n.Name+"-containerd.log")
	cmd, err := startIn(n.NetNS, logPath, c.st.containerdBinary("containerd"), "--config", filepath.Join(n.Dir, "containerd.toml"))
	if err != nil {
		return err
	}
	return c.record("containerd", n.Name, logPath, cmd)
}

func (c *Cluster) waitRuntime(ctx context.Context, n Node) error {
	proc := c.process("containerd", n.Name)
	return poll(ctx, time.Minute, 50*time.Millisecond, func(ctx context.Context) error {
		if !proc.Alive() {
			return fmt.Errorf("%w: containerd exited (see %s)", errGiveUp, proc.Log)
		}
		return RuntimeReady(ctx, n.Runtime)
	})
}

// RuntimeReady asks the CRI runtime at endpoint for Status and wants RuntimeReady.
func RuntimeReady(ctx context.Context, endpoint string) error {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return err
	}
	for _, cond := range resp.GetStatus().GetConditions() {
		if cond.GetType() == runtimeapi.RuntimeReady && cond.GetStatus() {
			return nil
		}
	}
	return fmt.Errorf("RuntimeReady is not true: %v", resp.GetStatus())
}

// Serve runs the forwarder and the registry mirror until ctx ends. On the host network
// there is neither: it only waits.
func (c *Cluster) Serve(ctx context.Context) error {
	if c.Listener == nil {
		<-ctx.Done()
		return nil
	}
	defer c.dialer.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mirrored := make(chan error, 1)
	go func() {
		if c.MirrorListener == nil {
			mirrored <- nil
			return
		}
		// Its request log goes to a file, not to the terminal up runs in.
		logFile, err := os.OpenFile(c.path("logs", "mirror.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			mirrored <- fmt.Errorf("registry mirror: %w", err)
			return
		}
		defer logFile.Close()
		err = ServeMirror(ctx, c.cfg.StateDir, c.MirrorListener, logFile)
		if err != nil {
			err = fmt.Errorf("registry mirror: %w", err)
		}
		mirrored <- err
	}()
	err := Forward(ctx, c.Listener, c.dialer, net.JoinHostPort(ControlPlaneIP, strconv.Itoa(APIServerPort)))
	cancel()
	return errors.Join(err, <-mirrored)
}

// ReadyzThroughForwarder asks /readyz the way kubectl on the machine does.
func ReadyzThroughForwarder(ctx context.Context, kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.Timeout = 5 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return err
	}
	if string(body) != "ok" {
		return fmt.Errorf("/readyz said %q", body)
	}
	return nil
}
