package rules

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// IPTablesMode picks the iptables binaries.
type IPTablesMode string

const (
	// IPTablesNFT uses iptables, iptables-restore and iptables-save, which on
	// current distributions (Debian 12 included) are the nf_tables backend.
	IPTablesNFT IPTablesMode = "nft"
	// IPTablesLegacy uses iptables-legacy, iptables-legacy-restore and
	// iptables-legacy-save (the x_tables backend).
	IPTablesLegacy IPTablesMode = "legacy"
)

// DefaultIPTablesPrefix is kube-proxy's chain prefix.
const DefaultIPTablesPrefix = "KUBE"

// IPTablesConfig configures the iptables writer. The zero value writes kube-proxy's
// own chains through the nf_tables backend.
type IPTablesConfig struct {
	// Family is the IP family the writer serves: IPv4 (empty) drives iptables,
	// iptables-restore and iptables-save; IPv6 drives ip6tables, ip6tables-restore
	// and ip6tables-save, as upstream's per-family proxiers do. Every address in
	// the config and the state must be of this family.
	Family Family
	// Mode selects the backend binaries. Empty means IPTablesNFT.
	Mode IPTablesMode
	// Prefix replaces "KUBE" in every chain name (KUBE-SERVICES, KUBE-SVC-...), so
	// nodekit can run beside a real kube-proxy. Upper case letters, at most 7 so
	// PREFIX-SVC-<16 characters> fits iptables' 28-character chain names. Empty
	// means "KUBE".
	Prefix string
	// MasqueradeMark is the masquerade bit. Zero means 0x4000.
	MasqueradeMark uint32
	// ClusterCIDR: ClusterIP traffic from outside it is masqueraded. Zero: no rule.
	ClusterCIDR netip.Prefix
	// MasqueradeAll masquerades all ClusterIP traffic.
	MasqueradeAll bool
	// NodeIP is the node's primary IPv4 address (kube-proxy's nodeIP). When a
	// service's LoadBalancerSourceRanges contain it, the service's load-balancer
	// IPs are allowed as sources too. Zero means no such allowance.
	NodeIP netip.Addr
	// LocalhostNodePorts (IPv4 only) lets NodePorts answer on 127.0.0.0/8 from the
	// node itself, kube-proxy's iptables.localhostNodePorts: the NodePorts jump
	// then matches loopback destinations too, and PREFIX-FIREWALL (jumped to from
	// INPUT and OUTPUT) drops packets to 127.0.0.0/8 from elsewhere that are not
	// part of a DNATed connection, closing the hole route_localnet opens
	// (https://issue.k8s.io/90259). The DNATed packets keep their loopback source,
	// which the kernel routes off the host only with
	// net.ipv4.conf.all.route_localnet=1: the caller sets it in the namespace, as
	// kube-proxy does at start. False excludes 127.0.0.0/8 from the NodePorts
	// jump, as an IPv6 writer always excludes ::1.
	LocalhostNodePorts bool
	// Clock times syncs. Nil means the real clock.
	Clock clock.PassiveClock
	// Metrics receives sync results. Nil means none.
	Metrics Metrics
}

var iptablesPrefixSyntax = regexp.MustCompile(`^[A-Z][A-Z0-9]{0,6}$`)

func (c *IPTablesConfig) setDefaults() error {
	if c.Mode == "" {
		c.Mode = IPTablesNFT
	}
	if c.Mode != IPTablesNFT && c.Mode != IPTablesLegacy {
		return fmt.Errorf("%w: iptables mode %q", ErrInvalidConfig, c.Mode)
	}
	if c.Prefix == "" {
		c.Prefix = DefaultIPTablesPrefix
	}
	if !iptablesPrefixSyntax.MatchString(c.Prefix) {
		return fmt.Errorf("%w: chain prefix %q (want 1 to 7 upper-case letters or digits)", ErrInvalidConfig, c.Prefix)
	}
	if err := defaultMarkAndCIDR(&c.Family, &c.MasqueradeMark, c.ClusterCIDR, c.NodeIP); err != nil {
		return err
	}
	if c.LocalhostNodePorts && c.Family == IPv6 {
		return fmt.Errorf("%w: localhost NodePorts are IPv4 only (the kernel never routes ::1 off the host)", ErrInvalidConfig)
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	return nil
}

// binary names the tool ("iptables", "iptables-restore", "iptables-save") for the
// writer's family and mode: ip6tables-restore for IPv6, iptables-legacy-restore
// for legacy, and so on.
func (c *IPTablesConfig) binary(tool string) string {
	if c.Family == IPv6 {
		tool = "ip6" + strings.TrimPrefix(tool, "ip")
	}
	if c.Mode == IPTablesLegacy {
		base, rest, _ := strings.Cut(tool, "-")
		if rest != "" {
			rest = "-" + rest
		}
		return base + "-legacy" + rest
	}
	return tool
}

// runner runs a program with stdin and returns its standard output: the package's
// seam for iptables, swapped in unit tests.
type runner func(ctx context.Context, stdin, name string, args ...string) (string, error)

func execRunner(ctx context.Context, stdin, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), nil
}

// IPTables writes kube-proxy's iptables chains (PREFIX-SERVICES, PREFIX-SVC-HASH,
// PREFIX-SEP-HASH, PREFIX-EXT-HASH, PREFIX-MARK-MASQ, PREFIX-POSTROUTING, ...) with
// iptables-restore --noflush, so other tools' chains and rules are never rewritten.
// On the nf_tables backend a full sync lists the nat table first to keep the restore
// linear (see listTrick). It is safe for concurrent use; syncs are serialised.
type IPTables struct {
	cfg IPTablesConfig
	run runner

	// listFirst: full syncs on this iptables-restore put a table listing before
	// the bulk of the nat payload (see listTrick).
	listFirst bool

	mu sync.Mutex
	// applied maps each service chain the last successful sync left to its rules;
	// nil forces a full sync.
	applied map[string][]string
}

// NewIPTables returns an iptables writer after checking that the binaries run. The
// processes inherit the calling thread's network namespace.
func NewIPTables(ctx context.Context, cfg IPTablesConfig) (*IPTables, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	w := &IPTables{cfg: cfg, run: execRunner}
	for _, tool := range []string{"iptables", "iptables-restore"} {
		if _, err := exec.LookPath(cfg.binary(tool)); err != nil {
			return nil, fmt.Errorf("iptables mode %s, %s: %w", cfg.Mode, cfg.Family, err)
		}
	}
	if _, err := w.run(ctx, "", cfg.binary("iptables"), "-w", "-t", "nat", "-S", "POSTROUTING"); err != nil {
		return nil, fmt.Errorf("iptables mode %s: %w", cfg.Mode, err)
	}
	w.listFirst = w.probeListTrick(ctx)
	return w, nil
}

// listTrick is the line that keeps a big --noflush restore linear on the nf_tables
// backend. iptables-nft-restore (1.8.9, Debian 12's, measured) notes, for every command
// it parses, the chains the command names in a sorted linked list, to fetch just
// those chains at COMMIT; each insertion walks the list from its head, so a payload
// naming 14,000 chains (2,000 services) costs about 10^8 string comparisons before
// anything reaches the kernel: the "--noflush is quadratic" trap. A command that
// names no chain switches the list off for the rest of the table (the whole chain
// list is fetched in one dump instead). A listing (-S) is the only such command that
// changes nothing: -F, -X and -Z without a chain would touch other tools' rules. It
// prints the table as it was before the commit; the writer discards that output.
//
// The listing makes iptables-nft believe every built-in chain of the table exists,
// so the jump rules into built-in chains, which create those chains when missing,
// go before it, and so do the declarations of the chains they jump to.
const listTrick = "-S"

// probeListTrick reports whether iptables-restore accepts a listing inside a
// --noflush payload. Only the nf_tables backend needs it: legacy --noflush
// restores are linear.
func (w *IPTables) probeListTrick(ctx context.Context) bool {
	if w.cfg.Mode != IPTablesNFT {
		return false
	}
	_, err := w.run(ctx, "*nat\n"+listTrick+"\nCOMMIT\n", w.cfg.binary("iptables-restore"), "-w", "--noflush", "--test")
	if err != nil {
		logr.FromContextOrDiscard(ctx).Info("iptables-restore refuses a listing in a payload: large full syncs may be slow", "err", err.Error())
	}
	return err == nil
}

// RenderIPTables returns the exact iptables-restore payload a first, full sync of st
// writes into tables that hold nothing of the writer yet, touching nothing.
func RenderIPTables(cfg IPTablesConfig, st *State) (string, error) {
	if err := cfg.setDefaults(); err != nil {
		return "", err
	}
	w := &IPTables{cfg: cfg, listFirst: cfg.Mode == IPTablesNFT}
	p, err := w.compile(st)
	if err != nil {
		return "", err
	}
	return w.payload(p, nil, nil, w.jumps()), nil
}

func (w *IPTables) chain(kind string) string { return w.cfg.Prefix + "-" + kind }

// iptPlan is the compiled state: the top-level chains (always written whole) and the
// per-service chains, in both tables.
type iptPlan struct {
	filterTop map[string][]string
	natTop    map[string][]string
	svc       map[string][]string // nat service chains: SVC, SEP, EXT
}

// iptDest is an external destination of a service and how comments name it.
type iptDest struct {
	ip   netip.Addr
	what string
	lb   bool // a load-balancer IP, subject to LoadBalancerSourceRanges
}

func quoteComment(c string) string {
	if strings.ContainsAny(c, " \"") {
		return strconv.Quote(c)
	}
	return c
}

func (w *IPTables) compile(st *State) (*iptPlan, error) {
	if err := st.ValidateFamily(w.cfg.Family); err != nil {
		return nil, err
	}
	mark := fmt.Sprintf("%#x", w.cfg.MasqueradeMark)
	services, nodePorts, external := w.chain("SERVICES"), w.chain("NODEPORTS"), w.chain("EXTERNAL-SERVICES")
	forward, postrouting, markMasq, firewall := w.chain("FORWARD"), w.chain("POSTROUTING"), w.chain("MARK-MASQ"), w.chain("PROXY-FIREWALL")
	p := &iptPlan{
		filterTop: map[string][]string{nodePorts: nil, services: nil, external: nil, forward: nil, firewall: nil},
		natTop:    map[string][]string{nodePorts: nil, services: nil, markMasq: nil, postrouting: nil},
		svc:       map[string][]string{},
	}
	p.filterTop[forward] = []string{
		"-m conntrack --ctstate INVALID -j DROP",
		fmt.Sprintf(`-m comment --comment "kubernetes forwarding rules" -m mark --mark %s/%s -j ACCEPT`, mark, mark),
		`-m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`,
	}
	p.natTop[markMasq] = []string{"-j MARK --or-mark " + mark}
	p.natTop[postrouting] = []string{
		fmt.Sprintf("-m mark ! --mark %s/%s -j RETURN", mark, mark),
		"-j MARK --xor-mark " + mark,
		`-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`,
	}
	svcs := make([]*Service, len(st.Services))
	for i := range st.Services {
		svcs[i] = &st.Services[i]
	}
	slices.SortStableFunc(svcs, func(a, b *Service) int {
		return cmp.Or(cmp.Compare(a.PortNameString(), b.PortNameString()), cmp.Compare(a.Protocol, b.Protocol))
	})
	for _, s := range svcs {
		name := s.PortNameString()
		proto := s.Protocol.lower()
		hash := iptablesHash(name, proto, "")
		svcChain, extChain := w.chain("SVC-"+hash), w.chain("EXT-"+hash)
		match := func(ip netip.Addr) string {
			return fmt.Sprintf("-m %s -p %s -d %s --dport %d", proto, proto, ip, s.Port)
		}
		var externalDests []iptDest
		for _, ip := range s.ExternalIPs {
			externalDests = append(externalDests, iptDest{ip, "external IP", false})
		}
		for _, ip := range s.LoadBalancerIPs {
			externalDests = append(externalDests, iptDest{ip, "loadbalancer IP", true})
		}
		pol := s.policy()
		target := func(a NoEndpointsAction) (string, string) {
			if !pol.hasEndpoints {
				if a == Drop {
					return "DROP", quoteComment(name + " has no endpoints")
				}
				return "REJECT", quoteComment(name + " has no endpoints")
			}
			return "DROP", quoteComment(name + " has no local endpoints")
		}
		if pol.internalVerdict != "" {
			t, c := target(pol.internalVerdict)
			p.filterTop[services] = append(p.filterTop[services], fmt.Sprintf("-m comment --comment %s %s -j %s", c, match(s.ClusterIP), t))
		}
		if pol.externalVerdict != "" {
			t, c := target(pol.externalVerdict)
			for _, d := range externalDests {
				p.filterTop[external] = append(p.filterTop[external], fmt.Sprintf("-m comment --comment %s %s -j %s", c, match(d.ip), t))
			}
			if s.NodePort != 0 {
				p.filterTop[external] = append(p.filterTop[external],
					fmt.Sprintf("-m comment --comment %s -m addrtype --dst-type LOCAL -m %s -p %s --dport %d -j %s", c, proto, proto, s.NodePort, t))
			}
		}
		// LoadBalancerSourceRanges: load-balancer traffic goes through the FW
		// chain, which sends the allowed sources on to the EXT chain. What reaches
		// the end of it is not DNATed, so the filter table's PROXY-FIREWALL, seeing
		// the load-balancer IP still as destination, drops it.
		fwChain := w.chain("FW-" + hash)
		usesFW := pol.hasEndpoints && s.usesFirewall()
		if usesFW {
			for _, ip := range s.LoadBalancerIPs {
				p.filterTop[firewall] = append(p.filterTop[firewall], fmt.Sprintf("-m comment --comment %s %s -j DROP",
					quoteComment(name+" traffic not accepted by "+fwChain), match(ip)))
			}
		}
		if !pol.hasEndpoints {
			continue
		}
		localChain := w.chain("SVL-" + hash)
		internalChain, externalPolicyChain := svcChain, svcChain
		if s.InternalLocal {
			internalChain = localChain
		}
		if s.ExternalLocal {
			externalPolicyChain = localChain
		}
		if pol.internalVerdict == "" {
			p.natTop[services] = append(p.natTop[services],
				fmt.Sprintf("-m comment --comment %s %s -j %s", quoteComment(name+" cluster IP"), match(s.ClusterIP), internalChain))
		}
		if s.externallyAccessible() {
			for _, d := range externalDests {
				target := extChain
				if d.lb && usesFW {
					target = fwChain
				}
				p.natTop[services] = append(p.natTop[services],
					fmt.Sprintf("-m comment --comment %s %s -j %s", quoteComment(name+" "+d.what), match(d.ip), target))
			}
			if s.NodePort != 0 {
				p.natTop[nodePorts] = append(p.natTop[nodePorts],
					fmt.Sprintf("-m comment --comment %s -m %s -p %s --dport %d -j %s", quoteComment(name), proto, proto, s.NodePort, extChain))
			}
			var ext []string
			switch {
			case !s.ExternalLocal:
				ext = append(ext, fmt.Sprintf("-m comment --comment %s -j %s", quoteComment("masquerade traffic for "+name+" external destinations"), markMasq))
			case pol.usesCluster:
				// Local policy keeps the client's address; pods and the node itself
				// go to the Cluster endpoints (the node's traffic masqueraded).
				if w.cfg.ClusterCIDR.IsValid() {
					ext = append(ext, fmt.Sprintf("-m comment --comment %s -s %s -j %s",
						quoteComment("pod traffic for "+name+" external destinations"), w.cfg.ClusterCIDR.Masked(), svcChain))
				}
				ext = append(ext,
					fmt.Sprintf("-m comment --comment %s -m addrtype --src-type LOCAL -j %s", quoteComment("masquerade LOCAL traffic for "+name+" external destinations"), markMasq),
					fmt.Sprintf("-m comment --comment %s -m addrtype --src-type LOCAL -j %s", quoteComment("route LOCAL traffic for "+name+" external destinations"), svcChain))
			}
			if pol.externalVerdict == "" {
				ext = append(ext, "-j "+externalPolicyChain)
			}
			p.svc[extChain] = ext
		}
		if usesFW {
			lbComment := quoteComment(name + " loadbalancer IP")
			var fw []string
			for _, r := range s.LoadBalancerSourceRanges {
				fw = append(fw, fmt.Sprintf("-m comment --comment %s -s %s -j %s", lbComment, r.Masked(), extChain))
			}
			if s.allowsNode(w.cfg.NodeIP) {
				for _, ip := range s.LoadBalancerIPs {
					fw = append(fw, fmt.Sprintf("-m comment --comment %s -s %s -j %s", lbComment, ip, extChain))
				}
			}
			p.svc[fwChain] = append(fw, "-m comment --comment "+quoteComment("other traffic to "+name+" will be dropped by "+firewall))
		}
		affinity := int(s.AffinityTimeout / time.Second)
		policyChain := func(eps []Endpoint, masq bool) []string {
			var rules []string
			if masq {
				switch {
				case w.cfg.MasqueradeAll:
					rules = append(rules, fmt.Sprintf("-m comment --comment %s %s -j %s", quoteComment(name+" cluster IP"), match(s.ClusterIP), markMasq))
				case w.cfg.ClusterCIDR.IsValid():
					rules = append(rules, fmt.Sprintf("-m comment --comment %s %s ! -s %s -j %s", quoteComment(name+" cluster IP"), match(s.ClusterIP), w.cfg.ClusterCIDR.Masked(), markMasq))
				}
			}
			if affinity > 0 {
				for _, ep := range eps {
					sep := w.chain("SEP-" + iptablesHash(name, proto, ep.String()))
					rules = append(rules, fmt.Sprintf("-m comment --comment %s -m recent --name %s --rcheck --seconds %d --reap -j %s",
						quoteComment(name+" -> "+ep.String()), sep, affinity, sep))
				}
			}
			n := len(eps)
			for i, ep := range eps {
				sep := w.chain("SEP-" + iptablesHash(name, proto, ep.String()))
				c := quoteComment(name + " -> " + ep.String())
				if i < n-1 {
					rules = append(rules, fmt.Sprintf("-m comment --comment %s -m statistic --mode random --probability %0.10f -j %s", c, 1.0/float64(n-i), sep))
				} else {
					rules = append(rules, fmt.Sprintf("-m comment --comment %s -j %s", c, sep))
				}
			}
			return rules
		}
		if pol.usesCluster {
			p.svc[svcChain] = policyChain(s.Endpoints, true)
		}
		if pol.usesLocal {
			// Upstream masquerades off-cluster ClusterIP traffic in the chain the
			// cluster IP jumps to; with internalTrafficPolicy Local that is this one.
			p.svc[localChain] = policyChain(s.LocalEndpoints, s.InternalLocal)
		}
		for _, ep := range pol.all {
			sep := w.chain("SEP-" + iptablesHash(name, proto, ep.String()))
			recent := ""
			if affinity > 0 {
				recent = fmt.Sprintf("-m recent --name %s --set ", sep)
			}
			p.svc[sep] = []string{
				fmt.Sprintf("-m comment --comment %s -s %s -j %s", quoteComment(name), ep.IP, markMasq),
				fmt.Sprintf("-m comment --comment %s %s-m %s -p %s -j DNAT --to-destination %s", quoteComment(name), recent, proto, proto, ep),
			}
		}
	}
	// Loopback destinations reach NodePorts only with localhost NodePorts (and
	// never over IPv6); the rule text is kube-proxy's, word for word.
	notLoopback := ""
	switch {
	case w.cfg.Family == IPv6:
		notLoopback = " ! -d ::1/128"
	case !w.cfg.LocalhostNodePorts:
		notLoopback = " ! -d 127.0.0.0/8"
	}
	p.natTop[services] = append(p.natTop[services],
		fmt.Sprintf(`-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL%s -j %s`, notLoopback, nodePorts))
	if w.localhostFirewall() {
		// The kubelet's anti-martian rule, which kube-proxy writes too.
		p.filterTop[w.chain("FIREWALL")] = []string{
			`-m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`,
		}
	}
	return p, nil
}

// payload renders the iptables-restore input. prev is what the kernel holds (nil:
// a full sync, writing every service chain); stale lists service chains to delete.
// chainsSize is about the payload size of the named chains of m: their
// declarations and their rules.
func chainsSize(m map[string][]string, names []string) int {
	n := 0
	for _, name := range names {
		n += len(name) + 12
		for _, r := range m[name] {
			n += len(name) + len(r) + 5
		}
	}
	return n
}

func (w *IPTables) payload(p *iptPlan, prev map[string][]string, stale []string, jumps [][]string) string {
	var b strings.Builder
	writeJumps := func(table string) {
		for _, j := range jumps {
			if j[0] == table {
				fmt.Fprintf(&b, "-I %s %s\n", j[1], j[2])
			}
		}
	}
	writeTable := func(table string, top map[string][]string, svc map[string][]string, staleHere []string) {
		fmt.Fprintf(&b, "*%s\n", table)
		topNames := slices.Sorted(maps.Keys(top))
		var changed []string
		for _, name := range slices.Sorted(maps.Keys(svc)) {
			if old, ok := prev[name]; ok && slices.Equal(old, svc[name]) {
				continue
			}
			changed = append(changed, name)
		}
		// Full syncs of the service chains on iptables-nft: see listTrick.
		listFirst := w.listFirst && prev == nil && len(svc) > 0
		for _, name := range topNames {
			fmt.Fprintf(&b, ":%s - [0:0]\n", name)
		}
		if listFirst {
			writeJumps(table)
			b.WriteString(listTrick + "\n")
		}
		// Grow once: doubling a multi-megabyte builder cost more than writing it.
		b.Grow(chainsSize(top, topNames) + chainsSize(svc, changed))
		for _, name := range slices.Concat(changed, staleHere) {
			fmt.Fprintf(&b, ":%s - [0:0]\n", name)
		}
		for _, name := range topNames {
			for _, r := range top[name] {
				fmt.Fprintf(&b, "-A %s %s\n", name, r)
			}
		}
		for _, name := range changed {
			for _, r := range svc[name] {
				fmt.Fprintf(&b, "-A %s %s\n", name, r)
			}
		}
		for _, name := range staleHere {
			fmt.Fprintf(&b, "-X %s\n", name)
		}
		if !listFirst {
			writeJumps(table)
		}
		b.WriteString("COMMIT\n")
	}
	// nat first: iptables-restore commits table by table and stops at the first
	// failure, so a refused nat payload leaves both tables as they were.
	writeTable("nat", p.natTop, p.svc, stale)
	writeTable("filter", p.filterTop, nil, nil)
	return b.String()
}

// jumps are the rules from the built-in chains into the writer's chains, as
// kube-proxy installs them: table, built-in chain, rule spec as iptables-save prints it.
func (w *IPTables) jumps() [][]string {
	out := w.proxyJumps()
	if w.localhostFirewall() {
		// The kubelet's chain: jumped to without a comment, as the kubelet does.
		for _, from := range []string{"INPUT", "OUTPUT"} {
			out = append(out, []string{"filter", from, "-j " + w.chain("FIREWALL")})
		}
	}
	return out
}

// proxyJumps are the jump rules into kube-proxy's own chains (jumps without the
// kubelet's), which Cleanup deletes.
func (w *IPTables) proxyJumps() [][]string {
	const newConn = "-m conntrack --ctstate NEW "
	j := func(table, from, to, comment, extra string) []string {
		return []string{table, from, fmt.Sprintf("%s-m comment --comment %s -j %s", extra, quoteComment(comment), w.chain(to))}
	}
	return [][]string{
		j("filter", "INPUT", "EXTERNAL-SERVICES", "kubernetes externally-visible service portals", newConn),
		j("filter", "FORWARD", "EXTERNAL-SERVICES", "kubernetes externally-visible service portals", newConn),
		j("filter", "INPUT", "NODEPORTS", "kubernetes health check service ports", ""),
		j("filter", "FORWARD", "SERVICES", "kubernetes service portals", newConn),
		j("filter", "OUTPUT", "SERVICES", "kubernetes service portals", newConn),
		j("filter", "FORWARD", "FORWARD", "kubernetes forwarding rules", ""),
		j("filter", "INPUT", "PROXY-FIREWALL", "kubernetes load balancer firewall", newConn),
		j("filter", "OUTPUT", "PROXY-FIREWALL", "kubernetes load balancer firewall", newConn),
		j("filter", "FORWARD", "PROXY-FIREWALL", "kubernetes load balancer firewall", newConn),
		j("nat", "OUTPUT", "SERVICES", "kubernetes service portals", ""),
		j("nat", "PREROUTING", "SERVICES", "kubernetes service portals", ""),
		j("nat", "POSTROUTING", "POSTROUTING", "kubernetes postrouting rules", ""),
	}
}

// localhostFirewall reports whether the writer keeps PREFIX-FIREWALL. Without
// localhost NodePorts it leaves that chain, the kubelet's, as it finds it.
func (w *IPTables) localhostFirewall() bool {
	return w.cfg.LocalhostNodePorts && w.cfg.Family == IPv4
}

// serviceChainRE matches the per-service chains of this prefix.
func (w *IPTables) serviceChainRE() *regexp.Regexp {
	return regexp.MustCompile(`^:(` + w.cfg.Prefix + `-(SVC|SEP|EXT|FW|SVL)-[A-Z2-7]{16}) `)
}

// DryRun returns the iptables-restore payload the next Sync of st would write.
func (w *IPTables) DryRun(ctx context.Context, st *State) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, err := w.compile(st)
	if err != nil {
		return "", err
	}
	prev, stale, jumps, err := w.prevAndStale(ctx, p)
	if err != nil {
		return "", err
	}
	return w.payload(p, prev, stale, jumps), nil
}

// prevAndStale returns what the kernel holds for service chains (nil on a full sync),
// the service chains to delete and the missing jump rules. A full sync reads both
// tables once with iptables-save: every extra iptables call would load the whole
// table again, which is what makes naive syncs slow.
func (w *IPTables) prevAndStale(ctx context.Context, p *iptPlan) (map[string][]string, []string, [][]string, error) {
	var existing []string
	var missing [][]string
	if w.applied == nil {
		out, err := w.run(ctx, "", w.cfg.binary("iptables-save"))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%w: read tables: %w", ErrApplyFailed, err)
		}
		re := w.serviceChainRE()
		have := map[string]bool{}
		table := ""
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "*") {
				table = line[1:]
				continue
			}
			if table == "nat" {
				if m := re.FindStringSubmatch(line); m != nil {
					existing = append(existing, m[1])
				}
			}
			have[table+" "+line] = true
		}
		for _, j := range w.jumps() {
			if !have[j[0]+" -A "+j[1]+" "+j[2]] {
				missing = append(missing, j)
			}
		}
	} else {
		existing = slices.Collect(maps.Keys(w.applied))
	}
	var stale []string
	for _, c := range existing {
		if _, ok := p.svc[c]; !ok {
			stale = append(stale, c)
		}
	}
	slices.Sort(stale)
	return w.applied, stale, missing, nil
}

// Sync makes the writer's chains match st. iptables-restore commits each table
// atomically, nat first and then filter, and stops at the first failure: a refused
// nat payload leaves both tables as they were; the error wraps ErrApplyFailed and the
// next sync is full. Partial syncs rewrite the
// top-level chains and only the service chains that changed, as kube-proxy does.
func (w *IPTables) Sync(ctx context.Context, st *State) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	start := w.cfg.Clock.Now()
	full := w.applied == nil
	err := w.sync(ctx, st)
	took := w.cfg.Clock.Since(start)
	w.cfg.Metrics.SyncDone("iptables", full, took, err)
	if err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "iptables sync failed", "family", w.cfg.Family, "prefix", w.cfg.Prefix, "full", full)
		return err
	}
	logr.FromContextOrDiscard(ctx).V(4).Info("iptables sync done", "prefix", w.cfg.Prefix, "full", full, "took", took)
	return nil
}

func (w *IPTables) sync(ctx context.Context, st *State) error {
	p, err := w.compile(st)
	if err != nil {
		return err
	}
	prev, stale, jumps, err := w.prevAndStale(ctx, p)
	if err != nil {
		return err
	}
	payload := w.payload(p, prev, stale, jumps)
	if _, err := w.run(ctx, payload, w.cfg.binary("iptables-restore"), "-w", "--noflush", "--counters"); err != nil {
		w.applied = nil
		return fmt.Errorf("%w: %s (%s, prefix %s): %w", ErrApplyFailed, w.cfg.binary("iptables-restore"), w.cfg.Mode, w.cfg.Prefix, err)
	}
	w.applied = maps.Clone(p.svc)
	return nil
}

// ForceFullSync makes the next Sync rewrite every chain and re-check the jump rules.
func (w *IPTables) ForceFullSync() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.applied = nil
}
