package cluster

// --host-network: one node on the machine's own network namespace, as the node of a
// kubeadm single-node cluster runs. The difference from the default layout is kept
// small on purpose: a Node whose NetNS is "" lives in the machine's namespace, and so
// does the control plane when State.HostNetwork is set. Everything else (the
// containerd configuration, the CNI list, the agents' flags) is the same code.
//
// Because the machine's namespace is shared with everything else on it, `up` first
// checks (hostProbe, read-only) that nothing it would make or bind is there already,
// and records in State.Host what the node's plugins will change lazily (the cni0
// bridge, kube-proxy's tables, portmap's chains, ip_forward), so that `down` removes
// exactly that. No test runs this mode for real: the brief forbids touching the
// machine's own namespace; the unit tests drive it with a fake probe.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ErrHostInUse marks a machine where --host-network would collide with something that
// is already there (a port, a CNI bridge, kube-proxy's tables, a kubelet).
var ErrHostInUse = errors.New("the machine is in use")

// cniBridge is the bridge the CNI list's bridge plugin makes on the node.
const cniBridge = "cni0"

// kubeProxyTables are the nftables tables nodekit's kube-proxy writes (one per family;
// the IPv6 one only where the kernel has IPv6).
var kubeProxyTables = []string{"ip kube-proxy", "ip6 kube-proxy"}

// portmapChainPrefixes name the nat-table chains the portmap plugin makes: its
// top-level chains, which it never deletes, and one per container.
var portmapChainPrefixes = []string{"CNI-HOSTPORT-", "CNI-DN-"}

// ipForwardSysctl is the one kernel setting the node changes: the bridge plugin with
// isGateway turns IPv4 forwarding on.
const ipForwardSysctl = "/proc/sys/net/ipv4/ip_forward"

// hostPorts are the TCP ports the host-network node binds besides the API port, each
// with its owner, as on a kubeadm node.
var hostPorts = []struct {
	port  int
	owner string
}{
	{2379, "etcd (client, 127.0.0.1)"},
	{2380, "etcd (peer, 127.0.0.1)"},
	{10248, "the kubelet's healthz (127.0.0.1)"},
	{10250, "the kubelet's API"},
	{10249, "kube-proxy's metrics (127.0.0.1)"},
	{10256, "kube-proxy's healthz"},
	{10257, "kube-controller-manager (127.0.0.1)"},
	{10259, "kube-scheduler (127.0.0.1)"},
}

// HostChanges is what a host-network node changes on the machine outside the state
// dir, recorded before the change is made so that `down` undoes it even after a crash.
type HostChanges struct {
	// Links are interfaces in the machine's namespace the node's CNI makes; deleting
	// one takes its addresses and routes with it.
	Links []string `json:"links,omitempty"`
	// NFTables are "FAMILY NAME" tables kube-proxy writes.
	NFTables []string `json:"nftables,omitempty"`
	// NATChainPrefixes name the iptables nat chains portmap makes.
	NATChainPrefixes []string `json:"natChainPrefixes,omitempty"`
	// Sysctls are kernel settings to put back, with their values before up.
	Sysctls []Sysctl `json:"sysctls,omitempty"`
}

// Sysctl is one /proc/sys file and the value to write back.
type Sysctl struct {
	Path  string `json:"path"`
	Value string `json:"value"`
}

// hostProbe reads what is on the machine. Every method only reads; the real one uses
// /proc, net.Interfaces, `nft list tables` and `iptables-save`.
type hostProbe interface {
	// ListeningTCPPorts lists the TCP ports something listens on (any address, IPv4 or IPv6).
	ListeningTCPPorts() (map[int]bool, error)
	// LinkExists reports whether the machine's namespace has an interface of that name.
	LinkExists(name string) (bool, error)
	// NFTables lists the nftables tables as "FAMILY NAME".
	NFTables() ([]string, error)
	// NATChains lists the iptables nat table's chains.
	NATChains() ([]string, error)
	// Kubelets lists the running processes named kubelet, as "PID CMDLINE".
	Kubelets() ([]string, error)
	// DefaultIP is the address of the interface with the default route.
	DefaultIP() (net.IP, error)
	// LocalIPs lists the addresses assigned to the machine's interfaces.
	LocalIPs() ([]net.IP, error)
	// Hostname is the machine's host name.
	Hostname() (string, error)
	// ReadSysctl reads a /proc/sys file.
	ReadSysctl(path string) (string, error)
}

// hostFacts is what checkHost found and up uses.
type hostFacts struct {
	// IP is the node's address on the machine's network.
	IP string
	// NodeName is the machine's host name in lower case, as kubeadm names the node.
	NodeName string
	// Changes are recorded in the state before anything is made.
	Changes HostChanges
}

// checkHost refuses, naming the cause, a machine where the host-network node would
// collide with what is there, and otherwise returns the node's name, address and the
// changes to record. It only reads.
func checkHost(cfg *Config, p hostProbe) (*hostFacts, error) {
	if cfg.Nodes != 1 {
		return nil, fmt.Errorf("--host-network runs exactly one node (the machine itself): --nodes %d", cfg.Nodes)
	}
	listening, err := p.ListeningTCPPorts()
	if err != nil {
		return nil, fmt.Errorf("read the machine's listening ports: %w", err)
	}
	ports := append([]struct {
		port  int
		owner string
	}{{cfg.APIPort, "kube-apiserver (--api-port)"}}, hostPorts...)
	for _, hp := range ports {
		if listening[hp.port] {
			return nil, fmt.Errorf("%w: TCP port %d, which %s needs on the machine's network, is already in use (see ss -ltnp 'sport = :%d')", ErrHostInUse, hp.port, hp.owner, hp.port)
		}
	}
	if ok, err := p.LinkExists(cniBridge); err != nil {
		return nil, err
	} else if ok {
		return nil, fmt.Errorf("%w: interface %s exists: another CNI bridge (another cluster's node, or a runtime's network) is on this machine", ErrHostInUse, cniBridge)
	}
	tables, err := p.NFTables()
	if err != nil {
		return nil, fmt.Errorf("list the machine's nftables tables: %w", err)
	}
	for _, t := range tables {
		for _, ours := range kubeProxyTables {
			if t == ours {
				return nil, fmt.Errorf("%w: nftables table %s exists: a kube-proxy runs or ran here (nft list table %s)", ErrHostInUse, t, t)
			}
		}
	}
	chains, err := p.NATChains()
	if err != nil {
		return nil, fmt.Errorf("list the machine's iptables nat chains: %w", err)
	}
	for _, ch := range chains {
		if ch == "KUBE-SERVICES" {
			return nil, fmt.Errorf("%w: iptables nat chain KUBE-SERVICES exists: a kube-proxy (iptables mode) runs or ran here", ErrHostInUse)
		}
		if isPortmapChain(ch) {
			return nil, fmt.Errorf("%w: iptables nat chain %s exists: the CNI portmap plugin of another runtime uses this machine, and down could not tell its rules from ours", ErrHostInUse, ch)
		}
	}
	kubelets, err := p.Kubelets()
	if err != nil {
		return nil, err
	}
	if len(kubelets) > 0 {
		return nil, fmt.Errorf("%w: a kubelet already runs on this machine (pid %s)", ErrHostInUse, strings.Join(kubelets, "; pid "))
	}
	facts := &hostFacts{}
	if cfg.NodeIP != "" {
		ip := net.ParseIP(cfg.NodeIP)
		if ip == nil || ip.To4() == nil {
			return nil, fmt.Errorf("--node-ip %q: want an IPv4 address", cfg.NodeIP)
		}
		local, err := p.LocalIPs()
		if err != nil {
			return nil, err
		}
		found := false
		for _, l := range local {
			found = found || l.Equal(ip)
		}
		if !found {
			return nil, fmt.Errorf("--node-ip %s is not an address of this machine's interfaces", cfg.NodeIP)
		}
		facts.IP = ip.To4().String()
	} else {
		ip, err := p.DefaultIP()
		if err != nil {
			return nil, fmt.Errorf("the machine's address (the default route's interface): %w; pass --node-ip", err)
		}
		if ip.To4() == nil {
			return nil, fmt.Errorf("the machine's address %s is not IPv4 and the cluster is IPv4 only; pass --node-ip", ip)
		}
		facts.IP = ip.To4().String()
	}
	host, err := p.Hostname()
	if err != nil {
		return nil, err
	}
	facts.NodeName = strings.ToLower(host)
	if errs := validation.IsDNS1123Subdomain(facts.NodeName); len(errs) > 0 {
		return nil, fmt.Errorf("host name %q cannot name a Node: %s", facts.NodeName, strings.Join(errs, "; "))
	}
	fwd, err := p.ReadSysctl(ipForwardSysctl)
	if err != nil {
		return nil, err
	}
	facts.Changes = HostChanges{
		Links:            []string{cniBridge},
		NFTables:         append([]string(nil), kubeProxyTables...),
		NATChainPrefixes: append([]string(nil), portmapChainPrefixes...),
		Sysctls:          []Sysctl{{Path: ipForwardSysctl, Value: strings.TrimSpace(fwd)}},
	}
	return facts, nil
}

func isPortmapChain(ch string) bool {
	for _, p := range portmapChainPrefixes {
		if strings.HasPrefix(ch, p) {
			return true
		}
	}
	return false
}

// hostCleanup lists the commands that undo h given what is on the machine now: the
// links that exist, the nftables tables listed, and the nat table as iptables-save
// prints it. Jumps into portmap's chains from other chains are deleted first, then
// the chains are flushed and deleted. Each command is idempotent in effect: what no
// longer exists is not named.
func hostCleanup(h *HostChanges, linkExists func(string) bool, tables []string, natDump string) [][]string {
	if h == nil {
		return nil
	}
	var cmds [][]string
	for _, l := range h.Links {
		if linkExists(l) {
			cmds = append(cmds, []string{"ip", "link", "delete", l})
		}
	}
	present := map[string]bool{}
	for _, t := range tables {
		present[t] = true
	}
	for _, t := range h.NFTables {
		if present[t] {
			cmds = append(cmds, append([]string{"nft", "delete", "table"}, strings.Fields(t)...))
		}
	}
	ours := func(ch string) bool {
		for _, p := range h.NATChainPrefixes {
			if strings.HasPrefix(ch, p) {
				return true
			}
		}
		return false
	}
	var chains []string
	sc := bufio.NewScanner(strings.NewReader(natDump))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, ":"):
			if name := strings.Fields(line[1:]); len(name) > 0 && ours(name[0]) {
				chains = append(chains, name[0])
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if len(f) < 2 || ours(f[1]) {
				continue
			}
			for i := range f {
				if (f[i] == "-j" || f[i] == "--jump" || f[i] == "-g" || f[i] == "--goto") && i+1 < len(f) && ours(f[i+1]) {
					// iptables-save quotes arguments with spaces (comments); -D wants
					// them as single arguments.
					args, err := splitSaveLine(line)
					if err == nil {
						args[0] = "-D"
						cmds = append(cmds, append([]string{"iptables", "-t", "nat"}, args...))
					}
					break
				}
			}
		}
	}
	sort.Strings(chains)
	for _, ch := range chains {
		cmds = append(cmds, []string{"iptables", "-t", "nat", "-F", ch})
	}
	for _, ch := range chains {
		cmds = append(cmds, []string{"iptables", "-t", "nat", "-X", ch})
	}
	return cmds
}

// splitSaveLine splits one iptables-save rule line into arguments, honouring the
// double quotes iptables-save puts around arguments with spaces.
func splitSaveLine(line string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inQuote, has := false, false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case ch == '\\' && inQuote && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case ch == '"':
			inQuote, has = !inQuote, true
		case ch == ' ' && !inQuote:
			if has || cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
				has = false
			}
		default:
			cur.WriteByte(ch)
		}
	}
	if inQuote {
		return nil, fmt.Errorf("unbalanced quotes in %q", line)
	}
	if has || cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out, nil
}

// undoHost runs hostCleanup's commands against the machine and puts the recorded
// sysctls back. It runs after every process of the cluster has stopped.
func undoHost(ctx context.Context, h *HostChanges, logf func(string, ...any)) error {
	if h == nil {
		return nil
	}
	var errs []error
	linkExists := func(name string) bool {
		_, err := net.InterfaceByName(name)
		return err == nil
	}
	tables, err := listNFTables(ctx)
	if err != nil && len(h.NFTables) > 0 {
		errs = append(errs, err)
	}
	dump, err := natSave(ctx)
	if err != nil && len(h.NATChainPrefixes) > 0 {
		errs = append(errs, err)
	}
	for _, c := range hostCleanup(h, linkExists, tables, dump) {
		out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out))))
			continue
		}
		logf("%s", strings.Join(c, " "))
	}
	for _, s := range sysctlsToRestore(h, func(p string) (string, error) {
		b, err := os.ReadFile(p)
		return string(b), err
	}) {
		if err := os.WriteFile(s.Path, []byte(s.Value+"\n"), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore %s: %w", s.Path, err))
			continue
		}
		logf("restored %s to %s", s.Path, s.Value)
	}
	return errors.Join(errs...)
}

// sysctlsToRestore are the recorded settings whose value now differs from the one
// before up (what cannot be read is written back too).
func sysctlsToRestore(h *HostChanges, read func(string) (string, error)) []Sysctl {
	if h == nil {
		return nil
	}
	var out []Sysctl
	for _, s := range h.Sysctls {
		if cur, err := read(s.Path); err == nil && strings.TrimSpace(cur) == s.Value {
			continue
		}
		out = append(out, s)
	}
	return out
}

func listNFTables(ctx context.Context) ([]string, error) {
	out, err := exec.CommandContext(ctx, "nft", "list", "tables").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("nft list tables: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return parseNFTables(string(out)), nil
}

// parseNFTables reads `nft list tables` ("table ip kube-proxy" lines).
func parseNFTables(out string) []string {
	var tables []string
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "table" {
			tables = append(tables, f[1]+" "+f[2])
		}
	}
	return tables
}

func natSave(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "iptables-save", "-t", "nat").Output()
	if err != nil {
		return "", fmt.Errorf("iptables-save -t nat: %w", err)
	}
	return string(out), nil
}

// parseListeningPorts reads /proc/net/tcp or tcp6 and returns the local ports of the
// sockets in LISTEN state (st 0A).
func parseListeningPorts(data string, into map[int]bool) {
	for line := range strings.Lines(data) {
		f := strings.Fields(line)
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		i := strings.LastIndexByte(f[1], ':')
		if i < 0 {
			continue
		}
		if port, err := strconv.ParseUint(f[1][i+1:], 16, 16); err == nil {
			into[int(port)] = true
		}
	}
}

// machineProbe is the real hostProbe. It reads /proc and asks the tools; it never
// opens a socket or changes anything.
type machineProbe struct{}

func (machineProbe) ListeningTCPPorts() (map[int]bool, error) {
	ports := map[int]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) && strings.HasSuffix(f, "6") {
			continue
		}
		if err != nil {
			return nil, err
		}
		parseListeningPorts(string(b), ports)
	}
	return ports, nil
}

func (machineProbe) LinkExists(name string) (bool, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return false, err
	}
	for _, i := range ifs {
		if i.Name == name {
			return true, nil
		}
	}
	return false, nil
}

func (machineProbe) NFTables() ([]string, error) { return listNFTables(context.Background()) }

func (machineProbe) NATChains() ([]string, error) {
	dump, err := natSave(context.Background())
	if err != nil {
		return nil, err
	}
	var chains []string
	for line := range strings.Lines(dump) {
		if strings.HasPrefix(line, ":") {
			if f := strings.Fields(line[1:]); len(f) > 0 {
				chains = append(chains, f[0])
			}
		}
	}
	return chains, nil
}

func (machineProbe) Kubelets() ([]string, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "kubelet" {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out = append(out, e.Name()+" "+strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	return out, nil
}

// DefaultIP is upstream's choice of a daemon's address (kube-apiserver's default
// --advertise-address, kubeadm's default advertise address): a global address of the
// interface the default route leaves by.
func (machineProbe) DefaultIP() (net.IP, error) { return utilnet.ChooseHostInterface() }

func (machineProbe) LocalIPs() ([]net.IP, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			out = append(out, n.IP)
		}
	}
	return out, nil
}

func (machineProbe) Hostname() (string, error) { return os.Hostname() }

func (machineProbe) ReadSysctl(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}
