package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/nodekit-dev/nodekit/internal/testenv"
)

// Interface names inside the node namespace.
const (
	BridgeName   = "nk-br0"
	ExternalLink = "nk-ext"
	podLinkName  = "eth0"
)

// Config shapes the environment. The zero value gives three pods.
type Config struct {
	// Pods is the number of pod namespaces. Zero means 3; at most 200.
	Pods int
	// PodCIDR is the pods' /24; the bridge takes .1 and pod i takes .10+i.
	// Empty means 10.244.1.0/24.
	PodCIDR string
	// ServiceCIDR is routed from the node namespace to the bridge so ClusterIP traffic
	// is routed (and DNATed). Empty means 10.96.0.0/16.
	ServiceCIDR string
	// ExternalCIDR is the /24 between the node (.1, NodeIP) and the client (.2).
	// Empty means 192.0.2.0/24 (TEST-NET-1).
	ExternalCIDR string
	// HTTPPort and UDPPort are the pods' server ports. Zero means 8080 and 9090.
	HTTPPort int
	UDPPort  int
	// IPv6 makes the environment dual-stack: every link also gets an IPv6
	// address (see IPv6PodCIDR and friends), the node forwards IPv6, and the pods'
	// servers answer on both families. False keeps it IPv4-only.
	IPv6 bool
}

func (c *Config) setDefaults() error {
	if c.Pods == 0 {
		c.Pods = 3
	}
	if c.Pods < 0 || c.Pods > 200 {
		return fmt.Errorf("netns: Pods=%d, want 1..200", c.Pods)
	}
	if c.PodCIDR == "" {
		c.PodCIDR = "10.244.1.0/24"
	}
	if c.ServiceCIDR == "" {
		c.ServiceCIDR = "10.96.0.0/16"
	}
	if c.ExternalCIDR == "" {
		c.ExternalCIDR = "192.0.2.0/24"
	}
	if c.HTTPPort == 0 {
		c.HTTPPort = 8080
	}
	if c.UDPPort == 0 {
		c.UDPPort = 9090
	}
	for _, p := range []string{c.PodCIDR, c.ExternalCIDR} {
		pfx, err := netip.ParsePrefix(p)
		if err != nil || !pfx.Addr().Is4() || pfx.Bits() != 24 {
			return fmt.Errorf("netns: %q is not an IPv4 /24", p)
		}
	}
	if _, err := netip.ParsePrefix(c.ServiceCIDR); err != nil {
		return fmt.Errorf("netns: ServiceCIDR %q: %w", c.ServiceCIDR, err)
	}
	return nil
}

// Env is one throw-away node with its pods and an external client.
type Env struct {
	// Node is the host's namespace: bridge, forwarding, and where rules go.
	Node *Namespace
	// Client is outside the cluster, one routed hop from the node.
	Client *Namespace
	// Pods are the endpoints, each with its servers running.
	Pods []*Pod

	// NodeIP is the node's address on the client link (for NodePort traffic).
	NodeIP netip.Addr
	// ClientIP is the client's address.
	ClientIP netip.Addr
	// GatewayIP is the bridge's address, the pods' default gateway.
	GatewayIP netip.Addr
	// PodCIDR and ServiceCIDR are as configured.
	PodCIDR     netip.Prefix
	ServiceCIDR netip.Prefix
	// StartupTime is how long New took.
	StartupTime time.Duration
	// The IPv6 counterparts of the addresses above, set when Config.IPv6 is
	// (zero otherwise).
	NodeIP6, ClientIP6, GatewayIP6 netip.Addr
	PodCIDR6, ServiceCIDR6         netip.Prefix

	cfg        Config
	namespaces []*Namespace
}

// New builds the environment and registers its teardown with tb.Cleanup. It ends the
// test through testenv.Unavailable when not root or when the kernel lacks network
// namespaces, veth or bridge; any other failure fails the test.
func New(tb testing.TB, cfg Config) *Env {
	tb.Helper()
	testenv.RequireRoot(tb)
	if err := cfg.setDefaults(); err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	e := &Env{cfg: cfg}
	tb.Cleanup(func() {
		if err := e.close(); err != nil {
			tb.Errorf("netns teardown: %v", err)
		}
	})
	if err := e.build(); err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
			testenv.Unavailable(tb, "network namespaces unusable here: %v", err)
		}
		tb.Fatalf("netns: %v", err)
	}
	e.StartupTime = time.Since(start)
	tb.Logf("netns: node, client and %d pods with HTTP and UDP servers up in %s", len(e.Pods), e.StartupTime.Round(time.Millisecond))
	return e
}

func (e *Env) newNamespace(name string) (*Namespace, error) {
	n, err := newNamespace(name)
	if err != nil {
		return nil, err
	}
	e.namespaces = append(e.namespaces, n)
	return n, nil
}

func (e *Env) build() error {
	podPfx := netip.MustParsePrefix(e.cfg.PodCIDR).Masked()
	extPfx := netip.MustParsePrefix(e.cfg.ExternalCIDR).Masked()
	e.PodCIDR = podPfx
	e.ServiceCIDR = netip.MustParsePrefix(e.cfg.ServiceCIDR).Masked()
	e.GatewayIP = nthAddr(podPfx, 1)
	e.NodeIP = nthAddr(extPfx, 1)
	e.ClientIP = nthAddr(extPfx, 2)

	var err error
	if e.Node, err = e.newNamespace("node"); err != nil {
		return err
	}
	if err := e.setupNode(); err != nil {
		return err
	}
	if e.Client, err = e.newNamespace("client"); err != nil {
		return err
	}
	if err := e.connect(e.Client, ExternalLink, e.NodeIP, e.ClientIP, 24, 0); err != nil {
		return err
	}
	if e.cfg.IPv6 {
		if err := e.setupIPv6(); err != nil {
			return err
		}
	}
	br, err := e.Node.nl.LinkByName(BridgeName)
	if err != nil {
		return fmt.Errorf("find bridge %s: %w", BridgeName, err)
	}
	for i := range e.cfg.Pods {
		name := fmt.Sprintf("pod-%d", i)
		ns, err := e.newNamespace(name)
		if err != nil {
			return err
		}
		ip := nthAddr(podPfx, 10+i)
		if err := e.connect(ns, fmt.Sprintf("veth-pod-%d", i), e.GatewayIP, ip, 24, br.Attrs().Index); err != nil {
			return err
		}
		pod := &Pod{Namespace: ns, IP: ip, HTTPPort: e.cfg.HTTPPort, UDPPort: e.cfg.UDPPort, dual: e.cfg.IPv6}
		if e.cfg.IPv6 {
			if err := e.addPodIPv6(pod, i); err != nil {
				return err
			}
		}
		e.Pods = append(e.Pods, pod)
		if err := pod.startServers(); err != nil {
			return err
		}
	}
	return nil
}

// setupNode sets the node's sysctls and creates its bridge and service route.
func (e *Env) setupNode() error {
	n := e.Node
	// Defaults first, so every interface created later inherits them.
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv4.conf.all.send_redirects", "0"},
		{"net.ipv4.conf.default.send_redirects", "0"},
		{"net.ipv4.conf.all.accept_redirects", "0"},
		{"net.ipv4.conf.default.accept_redirects", "0"},
		{"net.bridge.bridge-nf-call-iptables", "1"},
	} {
		if err := n.sysctl(kv[0], kv[1]); err != nil {
			return err
		}
	}
	lo, err := n.nl.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("node lo: %w", err)
	}
	if err := n.nl.LinkSetUp(lo); err != nil {
		return fmt.Errorf("node lo up: %w", err)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: BridgeName}}
	if err := n.nl.LinkAdd(br); err != nil {
		return fmt.Errorf("create bridge %s in node: %w", BridgeName, err)
	}
	if err := n.nl.AddrAdd(br, addr(e.GatewayIP, 24)); err != nil {
		return fmt.Errorf("address on %s: %w", BridgeName, err)
	}
	if err := n.nl.LinkSetUp(br); err != nil {
		return fmt.Errorf("bridge %s up: %w", BridgeName, err)
	}
	svc := e.ServiceCIDR
	route := &netlink.Route{
		LinkIndex: br.Attrs().Index,
		Dst:       &net.IPNet{IP: svc.Addr().AsSlice(), Mask: net.CIDRMask(svc.Bits(), 32)},
		Scope:     netlink.SCOPE_LINK,
	}
	if err := n.nl.RouteAdd(route); err != nil {
		return fmt.Errorf("route %s via %s in node: %w", svc, BridgeName, err)
	}
	return nil
}

// connect links peer to the node with a veth pair: hostName in the node (enslaved to
// the bridge at master when master != 0, else addressed with hostIP), eth0 in the
// peer with peerIP and a default route via hostIP.
func (e *Env) connect(peer *Namespace, hostName string, hostIP, peerIP netip.Addr, bits, master int) error {
	node := e.Node
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: hostName, MasterIndex: master},
		PeerName:      podLinkName,
		PeerNamespace: netlink.NsFd(peer.FD()),
	}
	if err := node.nl.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s to %s: %w", hostName, peer.Name, err)
	}
	host, err := node.nl.LinkByName(hostName)
	if err != nil {
		return fmt.Errorf("find veth %s: %w", hostName, err)
	}
	if master != 0 {
		if err := node.nl.LinkSetHairpin(host, true); err != nil {
			return fmt.Errorf("hairpin on %s: %w", hostName, err)
		}
	} else if err := node.nl.AddrAdd(host, addr(hostIP, bits)); err != nil {
		return fmt.Errorf("address on %s: %w", hostName, err)
	}
	if err := node.nl.LinkSetUp(host); err != nil {
		return fmt.Errorf("veth %s up: %w", hostName, err)
	}

	for _, name := range []string{"lo", podLinkName} {
		l, err := peer.nl.LinkByName(name)
		if err != nil {
			return fmt.Errorf("find %s in %s: %w", name, peer.Name, err)
		}
		if name == podLinkName {
			if err := peer.nl.AddrAdd(l, addr(peerIP, bits)); err != nil {
				return fmt.Errorf("address on %s in %s: %w", name, peer.Name, err)
			}
		}
		if err := peer.nl.LinkSetUp(l); err != nil {
			return fmt.Errorf("%s up in %s: %w", name, peer.Name, err)
		}
	}
	l, err := peer.nl.LinkByName(podLinkName)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", podLinkName, peer.Name, err)
	}
	gw := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: hostIP.AsSlice()}
	if err := peer.nl.RouteAdd(gw); err != nil {
		return fmt.Errorf("default route via %s in %s: %w", hostIP, peer.Name, err)
	}
	return nil
}

// Namespaces returns every namespace of the environment: node, client, then pods.
func (e *Env) Namespaces() []*Namespace { return append([]*Namespace(nil), e.namespaces...) }

// NodeRun runs a command (nft, iptables, iptables-legacy, conntrack, ...) in the node
// namespace and returns its standard output; see Namespace.Run.
func (e *Env) NodeRun(ctx context.Context, stdin, name string, args ...string) (string, error) {
	return e.Node.Run(ctx, stdin, name, args...)
}

// close stops the servers, deletes the links the harness made and releases the
// namespaces. Deleting the links first makes the teardown synchronous: the kernel
// destroys a namespace asynchronously once its last reference is gone.
func (e *Env) close() error {
	var errs []error
	for _, p := range e.Pods {
		errs = append(errs, p.stopServers())
	}
	if e.Node != nil && e.Node.nl != nil {
		links, err := e.Node.nl.LinkList()
		if err != nil {
			errs = append(errs, fmt.Errorf("list node links: %w", err))
		}
		for _, l := range links {
			if l.Type() == "veth" || l.Attrs().Name == BridgeName {
				if err := e.Node.nl.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
					errs = append(errs, fmt.Errorf("delete %s in node: %w", l.Attrs().Name, err))
				}
			}
		}
	}
	for i := len(e.namespaces) - 1; i >= 0; i-- {
		e.namespaces[i].close()
	}
	e.namespaces = nil
	return errors.Join(errs...)
}

func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Addr().As4()
	a[3] += byte(n)
	return netip.AddrFrom4(a)
}

func addr(ip netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(bits, 32)}}
}
