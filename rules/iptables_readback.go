package rules

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// iptRule is one -A line of iptables-save, with the options the read-back needs.
type iptRule struct {
	chain, src, dst, proto, dport, target, toDest string
}

// parseSave splits iptables-save output into the -A rules of each table.
func parseSave(out string) map[string][]iptRule {
	tables := map[string][]iptRule{}
	table := ""
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "*") {
			table = line[1:]
			continue
		}
		if !strings.HasPrefix(line, "-A ") {
			continue
		}
		f := splitQuoted(line)
		r := iptRule{chain: f[1]}
		for i := 2; i+1 < len(f); i++ {
			switch f[i] {
			case "-s":
				r.src = f[i+1]
			case "-d":
				r.dst = strings.TrimSuffix(strings.TrimSuffix(f[i+1], "/32"), "/128")
			case "-p":
				r.proto = f[i+1]
			case "--dport":
				r.dport = f[i+1]
			case "-j":
				r.target = f[i+1]
			case "--to-destination":
				r.toDest = f[i+1]
			}
		}
		tables[table] = append(tables[table], r)
	}
	return tables
}

// splitQuoted splits on spaces, keeping "quoted comments" as one field.
func splitQuoted(s string) []string {
	var out []string
	var cur strings.Builder
	inQuote := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && inQuote && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case c == '"':
			inQuote = !inQuote
		case c == ' ' && !inQuote:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteByte(c)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

// ReadBack lists the service destinations the writer's chains steer or refuse, with
// the endpoints each reaches, from one iptables-save.
func (w *IPTables) ReadBack(ctx context.Context) ([]KernelService, error) {
	ks, _, err := w.readBack(ctx)
	return ks, err
}

// readBack is ReadBack, also returning the nat rules by chain.
func (w *IPTables) readBack(ctx context.Context) ([]KernelService, map[string][]iptRule, error) {
	out, err := w.run(ctx, "", w.cfg.binary("iptables-save"))
	if err != nil {
		return nil, nil, fmt.Errorf("read tables (%s): %w", w.cfg.Mode, err)
	}
	tables := parseSave(out)
	byChain := map[string][]iptRule{}
	for _, r := range tables["nat"] {
		byChain[r.chain] = append(byChain[r.chain], r)
	}
	var endpoints func(chain string, seen map[string]bool) []Endpoint
	endpoints = func(chain string, seen map[string]bool) []Endpoint {
		if seen[chain] {
			return nil
		}
		seen[chain] = true
		var eps []Endpoint
		for _, r := range byChain[chain] {
			if r.toDest != "" {
				if ap, err := netip.ParseAddrPort(r.toDest); err == nil {
					eps = append(eps, Endpoint{IP: ap.Addr(), Port: int(ap.Port())})
				}
			}
			if strings.HasPrefix(r.target, w.cfg.Prefix+"-") && r.target != w.chain("MARK-MASQ") {
				for _, e := range endpoints(r.target, seen) {
					if !slices.Contains(eps, e) {
						eps = append(eps, e)
					}
				}
			}
		}
		return eps
	}
	var ks []KernelService
	for _, r := range byChain[w.chain("SERVICES")] {
		if r.dst == "" || r.dport == "" {
			continue // the NODEPORTS jump
		}
		ks = append(ks, KernelService{Dest: r.dst + " . " + r.proto + " . " + r.dport, Verdict: r.target, Action: "dnat",
			Endpoints: endpoints(r.target, map[string]bool{})})
	}
	for _, table := range []string{w.chain("SERVICES"), w.chain("EXTERNAL-SERVICES")} {
		for _, r := range tables["filter"] {
			if r.chain != table || r.dst == "" || (r.target != "REJECT" && r.target != "DROP") {
				continue
			}
			ks = append(ks, KernelService{Dest: r.dst + " . " + r.proto + " . " + r.dport, Verdict: r.target, Action: strings.ToLower(r.target)})
		}
	}
	slices.SortFunc(ks, func(a, b KernelService) int { return strings.Compare(a.Dest, b.Dest) })
	return ks, byChain, nil
}

// firewallAdmits reports whether a KUBE-FW- chain sends src on (a -s match jumping
// to a KUBE-EXT- chain); what it does not is dropped by KUBE-PROXY-FIREWALL.
func (w *IPTables) firewallAdmits(rules []iptRule, src netip.Addr) bool {
	for _, r := range rules {
		if r.src == "" || !strings.HasPrefix(r.target, w.chain("EXT-")) {
			continue
		}
		if pfx, err := parsePrefix(r.src, w.cfg.Family); err == nil && pfx.Contains(src) {
			return true
		}
	}
	return false
}

// Drift compares the writer's chains in the kernel with st; see NFTables.Drift.
func (w *IPTables) Drift(ctx context.Context, st *State) ([]Drift, error) {
	if err := st.ValidateFamily(w.cfg.Family); err != nil {
		return nil, err
	}
	ks, err := w.ReadBack(ctx)
	if err != nil {
		return nil, err
	}
	return diff(ks, st), nil
}

// Trace follows a new connection through the writer's chains as read back now.
func (w *IPTables) Trace(ctx context.Context, p Packet) (*TraceResult, error) {
	if !w.cfg.Family.has(p.Dst) || p.Port < 1 || p.Port > 65535 {
		return nil, fmt.Errorf("%w: trace of %v:%d", ErrInvalidState, p.Dst, p.Port)
	}
	ks, nat, err := w.readBack(ctx)
	if err != nil {
		return nil, err
	}
	dest := p.Dst.String() + " . " + p.Protocol.lower() + " . " + strconv.Itoa(p.Port)
	for _, k := range ks {
		if k.Dest != dest {
			continue
		}
		switch k.Action {
		case "dnat":
			if fw := w.chain("FW-"); strings.HasPrefix(k.Verdict, fw) && p.Src.IsValid() && !w.firewallAdmits(nat[k.Verdict], p.Src) {
				return &TraceResult{Verdict: "DROP", Path: []string{"PREROUTING", w.chain("SERVICES"), k.Verdict,
					"FORWARD", w.chain("PROXY-FIREWALL") + " (source not in loadBalancerSourceRanges)"}}, nil
			}
			r := &TraceResult{Verdict: "DNAT", Candidates: k.Endpoints, Path: []string{"PREROUTING", w.chain("SERVICES"), k.Verdict}}
			r.Masquerade = w.cfg.MasqueradeAll || strings.HasPrefix(k.Verdict, w.chain("EXT-")) || strings.HasPrefix(k.Verdict, w.chain("FW-")) ||
				(w.cfg.ClusterCIDR.IsValid() && p.Src.IsValid() && !w.cfg.ClusterCIDR.Contains(p.Src))
			for _, c := range k.Endpoints {
				if c.IP == p.Src {
					r.Masquerade = true
				}
			}
			return r, nil
		default:
			return &TraceResult{Verdict: strings.ToUpper(k.Action), Path: []string{"FORWARD", w.chain("SERVICES")}}, nil
		}
	}
	return &TraceResult{Verdict: "NONE", Path: []string{"PREROUTING", w.chain("SERVICES")}}, nil
}
