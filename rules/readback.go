package rules

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// DriftKind classifies a difference between the kernel and the desired state.
type DriftKind string

const (
	// MissingService: a desired service port has no rule in the kernel.
	MissingService DriftKind = "missing-service"
	// UnexpectedService: the kernel steers a destination no desired service claims.
	UnexpectedService DriftKind = "unexpected-service"
	// StaleEndpoint: the kernel sends traffic to an endpoint that is no longer desired
	// (the on-call trap: a dead writer's rules point at pods that moved).
	StaleEndpoint DriftKind = "stale-endpoint"
	// MissingEndpoint: a desired endpoint gets no traffic from the kernel's rules.
	MissingEndpoint DriftKind = "missing-endpoint"
	// WrongVerdict: the kernel rejects or drops a service that has endpoints, or
	// steers one that should be rejected.
	WrongVerdict DriftKind = "wrong-verdict"
)

// Drift is one difference found by NFTables.Drift.
type Drift struct {
	Kind DriftKind
	// Service is the service port ("ns/name:port") or, for UnexpectedService, the
	// destination ("ip . proto . port").
	Service string
	Detail  string
}

func (d Drift) String() string { return fmt.Sprintf("%s %s: %s", d.Kind, d.Service, d.Detail) }

// KernelService is what the kernel does with one service destination.
type KernelService struct {
	// Dest is "ip . proto . port" as the maps key it.
	Dest string
	// Verdict is the kernel's own spelling: the nftables map value ("goto <chain>",
	// "goto reject-chain", "drop") or the iptables target ("KUBE-SVC-...", "REJECT").
	Verdict string
	// Action is what happens to a new connection: "dnat", "reject" or "drop".
	Action string
	// Endpoints are the DNAT targets reachable from the chain (empty when rejected).
	Endpoints []Endpoint
}

// chainReader returns the text of one chain's rules; the seam for read-back.
type chainReader func(ctx context.Context, chain string) (string, error)

var (
	// An IPv6 target prints in brackets: dnat to [fd00::1]:80.
	reDNATOne = regexp.MustCompile(`dnat to \[?(\d+\.\d+\.\d+\.\d+|[0-9a-f:.]*:[0-9a-f:.]*)\]?:(\d+)`)
	reDNATMap = regexp.MustCompile(`(\d+) : (\d+\.\d+\.\d+\.\d+|[0-9a-f:.]*:[0-9a-f:.]*) \. (\d+)`)
	reGoto    = regexp.MustCompile(`(?:goto|jump) ((?:` + nftEndpointPrefix + `|` + nftServicePrefix + `|` + nftLocalPrefix + `)\S+)`)
)

// ReadBack lists the service destinations the kernel table steers or refuses, with
// the endpoints each reaches.
func (w *NFTables) ReadBack(ctx context.Context) ([]KernelService, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.readBack(ctx)
}

func (w *NFTables) readBack(ctx context.Context) ([]KernelService, error) {
	var out []KernelService
	for _, m := range []string{mapServiceIPs, mapNoEndpointServices} {
		elems, err := w.nft.ListElements(ctx, "map", m)
		if err != nil {
			return nil, fmt.Errorf("read map %s of table %s %s: %w", m, w.cfg.Family.nft(), w.cfg.Table, err)
		}
		for _, e := range elems {
			ks := KernelService{Dest: strings.Join(e.Key, " . "), Verdict: strings.Join(e.Value, " "), Action: "dnat"}
			switch ks.Verdict {
			case "drop":
				ks.Action = "drop"
			case "goto " + chainReject:
				ks.Action = "reject"
			}
			if chain, ok := strings.CutPrefix(ks.Verdict, "goto "); ok && chain != chainReject {
				eps, err := w.chainEndpoints(ctx, chain, map[string]bool{})
				if err != nil {
					return nil, err
				}
				ks.Endpoints = eps
			}
			out = append(out, ks)
		}
	}
	slices.SortFunc(out, func(a, b KernelService) int { return strings.Compare(a.Dest, b.Dest) })
	return out, nil
}

// chainEndpoints collects the DNAT targets of chain and the endpoint chains it
// jumps to, following external- chains to their service- chain.
func (w *NFTables) chainEndpoints(ctx context.Context, chain string, seen map[string]bool) ([]Endpoint, error) {
	if seen[chain] {
		return nil, nil
	}
	seen[chain] = true
	text, err := w.readChain(ctx, chain)
	if err != nil {
		return nil, fmt.Errorf("read chain %s of table %s %s: %w", chain, w.cfg.Family.nft(), w.cfg.Table, err)
	}
	var eps []Endpoint
	add := func(ipS, portS string) {
		ip, err1 := netip.ParseAddr(ipS)
		port, err2 := strconv.Atoi(portS)
		if err1 == nil && err2 == nil && !slices.Contains(eps, Endpoint{ip, port}) {
			eps = append(eps, Endpoint{ip, port})
		}
	}
	for _, m := range reDNATOne.FindAllStringSubmatch(text, -1) {
		add(m[1], m[2])
	}
	for _, m := range reDNATMap.FindAllStringSubmatch(text, -1) {
		add(m[2], m[3])
	}
	next := reGoto.FindAllStringSubmatch(text, -1)
	if strings.HasPrefix(chain, nftExternalPrefix) {
		next = append(next, []string{"", nftServicePrefix + strings.TrimPrefix(chain, nftExternalPrefix)})
	}
	for _, m := range next {
		more, err := w.chainEndpoints(ctx, m[1], seen)
		if err != nil {
			return nil, err
		}
		for _, e := range more {
			if !slices.Contains(eps, e) {
				eps = append(eps, e)
			}
		}
	}
	return eps, nil
}

func (w *NFTables) readChain(ctx context.Context, chain string) (string, error) {
	if w.chainText != nil {
		return w.chainText(ctx, chain)
	}
	return execRunner(ctx, "", "nft", "list", "chain", string(w.cfg.Family.nft()), w.cfg.Table, chain)
}

// Drift compares the kernel table with st and lists every difference: desired
// service ports with no rule, destinations nobody wants steered, endpoints the
// kernel still sends to that are no longer desired, desired endpoints it never
// reaches, and reject/drop where endpoints exist (or the reverse). An empty result
// means the kernel does what st says.
func (w *NFTables) Drift(ctx context.Context, st *State) ([]Drift, error) {
	if err := st.ValidateFamily(w.cfg.Family); err != nil {
		return nil, err
	}
	w.mu.Lock()
	kernel, err := w.readBack(ctx)
	w.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return diff(kernel, st), nil
}

// diff compares what a backend read back with the desired state.
func diff(kernel []KernelService, st *State) []Drift {
	// A destination may have two entries: a Local external policy with no local
	// endpoint still sends pods and the node to the Cluster endpoints (dnat) and
	// drops the rest.
	byDest := map[string][]KernelService{}
	for _, k := range kernel {
		byDest[k.Dest] = append(byDest[k.Dest], k)
	}
	var drift []Drift
	claimed := map[string]bool{}
	for i := range st.Services {
		s := &st.Services[i]
		name := s.PortNameString()
		pol := s.policy()
		extWant := pol.external
		if s.ExternalLocal && pol.usesCluster {
			extWant = slices.Concat(s.Endpoints, pol.external)
		}
		for j, ip := range slices.Concat([]netip.Addr{s.ClusterIP}, s.ExternalIPs, s.LoadBalancerIPs) {
			want := extWant
			if j == 0 {
				want = pol.internal
			}
			dest := fmt.Sprintf("%s . %s . %d", ip, s.Protocol.lower(), s.Port)
			claimed[dest] = true
			ks, ok := byDest[dest]
			var k KernelService
			if ok {
				k = ks[0]
				for _, c := range ks {
					if (c.Action == "dnat") == (len(want) > 0) {
						k = c
					}
				}
			}
			switch {
			case !ok:
				drift = append(drift, Drift{MissingService, name, "no rule for " + dest})
			case len(want) == 0 && k.Action == "dnat":
				drift = append(drift, Drift{WrongVerdict, name, fmt.Sprintf("%s has no endpoints but the kernel sends it to %v", dest, k.Endpoints)})
			case len(want) > 0 && k.Action != "dnat":
				drift = append(drift, Drift{WrongVerdict, name, fmt.Sprintf("%s has endpoints but the kernel answers %q", dest, k.Verdict)})
			default:
				for _, e := range k.Endpoints {
					if !slices.Contains(want, e) {
						drift = append(drift, Drift{StaleEndpoint, name, fmt.Sprintf("%s still goes to %s", dest, e)})
					}
				}
				for _, e := range want {
					if !slices.Contains(k.Endpoints, e) {
						drift = append(drift, Drift{MissingEndpoint, name, fmt.Sprintf("%s never reaches %s", dest, e)})
					}
				}
			}
		}
	}
	for _, k := range kernel {
		if !claimed[k.Dest] {
			drift = append(drift, Drift{UnexpectedService, k.Dest, "the kernel answers " + k.Verdict})
		}
	}
	return drift
}

// Packet describes a new connection for Trace.
type Packet struct {
	Src, Dst netip.Addr
	Protocol Protocol
	Port     int
}

// TraceResult is where the kernel's service rules send a packet.
type TraceResult struct {
	// Verdict is "DNAT" (to one of Candidates), "REJECT", "DROP", or "NONE" (no
	// service rule matches; the packet is routed unchanged).
	Verdict string
	// Candidates are the possible DNAT targets; numgen picks one uniformly.
	Candidates []Endpoint
	// Path lists the chains and maps the packet goes through.
	Path []string
	// Masquerade reports whether the service rules mark the packet for masquerading
	// (hairpin traffic or traffic from outside ClusterCIDR).
	Masquerade bool
}

// Trace follows a new connection through the current kernel table, as the
// nat-prerouting and filter hooks would see it, and returns its fate.
func (w *NFTables) Trace(ctx context.Context, p Packet) (*TraceResult, error) {
	if !w.cfg.Family.has(p.Dst) || p.Port < 1 || p.Port > 65535 {
		return nil, fmt.Errorf("%w: trace of %v:%d", ErrInvalidState, p.Dst, p.Port)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	dest := fmt.Sprintf("%s . %s . %d", p.Dst, p.Protocol.lower(), p.Port)
	if p.Src.IsValid() {
		// LoadBalancerSourceRanges: firewall-check runs before DNAT.
		fw, err := w.nft.ListElements(ctx, "map", mapFirewallIPs)
		if err != nil {
			return nil, fmt.Errorf("read map %s: %w", mapFirewallIPs, err)
		}
		for _, e := range fw {
			if strings.Join(e.Key, " . ") != dest {
				continue
			}
			chain := strings.TrimPrefix(strings.Join(e.Value, " "), "goto ")
			text, err := w.readChain(ctx, chain)
			if err != nil {
				return nil, fmt.Errorf("read chain %s of table %s %s: %w", chain, w.cfg.Family.nft(), w.cfg.Table, err)
			}
			if !nftFirewallAdmits(text, p.Src) {
				return &TraceResult{Verdict: "DROP", Path: []string{chainFilterPreroutingPreDNAT, chainFirewallCheck,
					"@" + mapFirewallIPs + " " + dest, chain + " (source not in loadBalancerSourceRanges)"}}, nil
			}
		}
	}
	r := &TraceResult{Verdict: "NONE", Path: []string{chainNATPrerouting, chainServices}}
	elems, err := w.nft.ListElements(ctx, "map", mapServiceIPs)
	if err != nil {
		return nil, fmt.Errorf("read map %s: %w", mapServiceIPs, err)
	}
	for _, e := range elems {
		if strings.Join(e.Key, " . ") != dest {
			continue
		}
		chain := strings.TrimPrefix(strings.Join(e.Value, " "), "goto ")
		r.Path = append(r.Path, "@"+mapServiceIPs+" "+dest, chain)
		if strings.HasPrefix(chain, nftExternalPrefix) {
			r.Masquerade = true
			r.Path = append(r.Path, nftServicePrefix+strings.TrimPrefix(chain, nftExternalPrefix))
		}
		r.Candidates, err = w.chainEndpoints(ctx, chain, map[string]bool{})
		if err != nil {
			return nil, err
		}
		r.Verdict = "DNAT"
		if w.cfg.MasqueradeAll || (w.cfg.ClusterCIDR.IsValid() && p.Src.IsValid() && !w.cfg.ClusterCIDR.Contains(p.Src)) {
			r.Masquerade = true
		}
		for _, c := range r.Candidates {
			if c.IP == p.Src {
				r.Masquerade = true // hairpin, if this endpoint is picked
			}
		}
		return r, nil
	}
	elems, err = w.nft.ListElements(ctx, "map", mapNoEndpointServices)
	if err != nil {
		return nil, fmt.Errorf("read map %s: %w", mapNoEndpointServices, err)
	}
	for _, e := range elems {
		if strings.Join(e.Key, " . ") != dest {
			continue
		}
		r.Path = []string{chainFilterForward, chainServiceEndpointsCheck, "@" + mapNoEndpointServices + " " + dest}
		if v := strings.Join(e.Value, " "); v == "drop" {
			r.Verdict = "DROP"
		} else {
			r.Verdict = "REJECT"
			r.Path = append(r.Path, chainReject)
		}
		return r, nil
	}
	ips, err := w.nft.ListElements(ctx, "set", setClusterIPs)
	if err != nil {
		return nil, fmt.Errorf("read set %s: %w", setClusterIPs, err)
	}
	for _, e := range ips {
		if len(e.Key) == 1 && e.Key[0] == p.Dst.String() {
			r.Verdict = "REJECT"
			r.Path = []string{chainFilterForward, chainClusterIPsCheck, "@" + setClusterIPs + " (no such port)"}
			return r, nil
		}
	}
	for _, pfx := range w.cfg.ServiceCIDRs {
		if pfx.Contains(p.Dst) {
			r.Verdict = "DROP"
			r.Path = []string{chainFilterForward, chainClusterIPsCheck, "unallocated ClusterIP in " + pfx.String()}
			return r, nil
		}
	}
	return r, nil
}

// nftFirewallAdmits reads a firewall chain as `nft list chain` prints it (its rule
// `ip saddr != { 192.0.2.0/24, 203.0.113.7 } drop`, or `ip saddr != 192.0.2.0/24
// drop` for one element, ranges as a-b when merged intervals are not a prefix) and
// reports whether src passes it.
func nftFirewallAdmits(chainText string, src netip.Addr) bool {
	for _, line := range strings.Split(chainText, "\n") {
		line = strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(line, "ip saddr != ")
		if !ok {
			rest, ok = strings.CutPrefix(line, "ip6 saddr != ")
		}
		if !ok || !strings.HasSuffix(rest, " drop") {
			continue
		}
		set := strings.Trim(strings.TrimSuffix(rest, " drop"), "{} ")
		inside := false
		for _, el := range strings.Split(set, ",") {
			if sourceElementContains(strings.TrimSpace(el), src) {
				inside = true
				break
			}
		}
		if !inside {
			return false
		}
	}
	return true
}

// sourceElementContains matches an address, a prefix or an a-b range.
func sourceElementContains(el string, src netip.Addr) bool {
	if lo, hi, ok := strings.Cut(el, "-"); ok {
		a, err1 := netip.ParseAddr(lo)
		b, err2 := netip.ParseAddr(hi)
		return err1 == nil && err2 == nil && a.Compare(src) <= 0 && src.Compare(b) <= 0
	}
	pfx, err := parsePrefix(el, FamilyOf(src))
	return err == nil && pfx.Contains(src)
}
