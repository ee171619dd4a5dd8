package rules

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	"sigs.k8s.io/knftables"
)

// Names in the table, as kube-proxy 1.37's nftables mode spells them.
const (
	DefaultNFTablesTable = "kube-proxy"

	chainFilterPreroutingPreDNAT = "filter-prerouting-pre-dnat"
	chainFilterOutputPreDNAT     = "filter-output-pre-dnat"
	chainFilterInput             = "filter-input"
	chainFilterForward           = "filter-forward"
	chainFilterOutput            = "filter-output"
	chainNATPrerouting           = "nat-prerouting"
	chainNATOutput               = "nat-output"
	chainNATPostrouting          = "nat-postrouting"

	chainServices               = "services"
	chainServiceEndpointsCheck  = "service-endpoints-check"
	chainNodePortEndpointsCheck = "nodeport-endpoints-check"
	chainReject                 = "reject-chain"
	chainClusterIPsCheck        = "cluster-ips-check"
	chainFirewallCheck          = "firewall-check"
	chainMasquerading           = "masquerading"

	mapServiceIPs          = "service-ips"
	mapServiceNodePorts    = "service-nodeports"
	mapNoEndpointServices  = "no-endpoint-services"
	mapNoEndpointNodePorts = "no-endpoint-nodeports"
	mapFirewallIPs         = "firewall-ips"
	setClusterIPs          = "cluster-ips"
	setNodePortIPs         = "nodeport-ips"
	setHairpinConnections  = "hairpin-connections"
)

// DefaultMasqueradeMark is kube-proxy's default masquerade bit.
const DefaultMasqueradeMark uint32 = 0x4000

// defaultMarkAndCIDR defaults and checks what both writers' configs share: the
// masquerade mark must be one bit, and the cluster CIDR, when set, IPv4.
func defaultMarkAndCIDR(mark *uint32, clusterCIDR netip.Prefix) error {
	if *mark == 0 {
		*mark = DefaultMasqueradeMark
	}
	if *mark&(*mark-1) != 0 {
		return fmt.Errorf("%w: masquerade mark %#x is not a single bit", ErrInvalidConfig, *mark)
	}
	if clusterCIDR.IsValid() && !clusterCIDR.Addr().Is4() {
		return fmt.Errorf("%w: cluster CIDR %v is not IPv4", ErrInvalidConfig, clusterCIDR)
	}
	return nil
}

// NFTablesConfig configures the nftables writer. The zero value writes kube-proxy's
// own table with kube-proxy's defaults.
type NFTablesConfig struct {
	// Table is the name of the ip-family table. Empty means "kube-proxy", so
	// existing knowledge and tooling apply; choose another name (for example
	// "nodekit") to run beside a real kube-proxy.
	Table string
	// MasqueradeMark is the single bit that marks packets for masquerading. Zero
	// means 0x4000.
	MasqueradeMark uint32
	// ClusterCIDR is the pods' range. When valid, ClusterIP traffic from outside it
	// is masqueraded (kube-proxy's --cluster-cidr). Zero means no such rule.
	ClusterCIDR netip.Prefix
	// MasqueradeAll masquerades all ClusterIP traffic.
	MasqueradeAll bool
	// ServiceCIDRs, when set, make traffic to unallocated ClusterIPs in them drop.
	ServiceCIDRs []netip.Prefix
	// NodePortAddresses are the node IPs that accept NodePort traffic. Empty means
	// every local address except loopback.
	NodePortAddresses []netip.Addr
	// Clock times syncs. Nil means the real clock.
	Clock clock.PassiveClock
	// Metrics receives sync results. Nil means none.
	Metrics Metrics
}

// Metrics receives the outcome of each sync; the agents adapt it to Prometheus.
type Metrics interface {
	// SyncDone reports one sync: the backend ("nftables", "iptables"), whether it
	// was full, how long it took and its error.
	SyncDone(backend string, full bool, took time.Duration, err error)
}

type noMetrics struct{}

func (noMetrics) SyncDone(string, bool, time.Duration, error) {}

func (c *NFTablesConfig) setDefaults() error {
	if c.Table == "" {
		c.Table = DefaultNFTablesTable
	}
	if len(c.Table) > 63 || !dns1123Label.MatchString(c.Table) {
		return fmt.Errorf("%w: table name %q", ErrInvalidConfig, c.Table)
	}
	if err := defaultMarkAndCIDR(&c.MasqueradeMark, c.ClusterCIDR); err != nil {
		return err
	}
	for _, p := range c.ServiceCIDRs {
		if !p.IsValid() || !p.Addr().Is4() {
			return fmt.Errorf("%w: service CIDR %v is not IPv4", ErrInvalidConfig, p)
		}
	}
	for _, a := range c.NodePortAddresses {
		if !a.Is4() {
			return fmt.Errorf("%w: node port address %v is not IPv4", ErrInvalidConfig, a)
		}
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	return nil
}

// NFTables writes the desired state into one nftables table of the ip family, with
// the layout of kube-proxy 1.37's nftables mode. It is safe for concurrent use;
// syncs are serialised.
type NFTables struct {
	cfg NFTablesConfig
	nft knftables.Interface
	// chainText reads one chain's rules for read-back; nil runs `nft list chain`.
	chainText chainReader

	mu sync.Mutex
	// applied is what the last successful sync left in the kernel; nil forces a
	// full sync.
	applied *nftPlan
	// stale are chains flushed by the last sync, deleted by the next one (a chain
	// just unreferenced by a map element may not be deletable in the same
	// transaction on older kernels).
	stale map[string]bool
	// baseRecreated is set once the first sync re-created the base chains.
	baseRecreated bool
}

// NewNFTables checks that nft (>= 1.0.1) works and returns a writer. It touches no
// rules: the first Sync writes the table.
//
// The nft process inherits the calling thread's network namespace; to write into
// another namespace, call NewNFTables and Sync on a thread switched into it.
func NewNFTables(cfg NFTablesConfig) (*NFTables, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	nft, err := knftables.New(knftables.IPv4Family, cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("nftables for table ip %s: %w", cfg.Table, err)
	}
	return &NFTables{cfg: cfg, nft: nft, stale: map[string]bool{}}, nil
}

// newNFTablesWith builds a writer on any knftables.Interface: the package's seam
// for unit tests (knftables.NewFake) and for rendering.
func newNFTablesWith(cfg NFTablesConfig, nft knftables.Interface) (*NFTables, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &NFTables{cfg: cfg, nft: nft, stale: map[string]bool{}}, nil
}

// RenderNFTables returns the exact nft payload a first, full sync of st writes,
// without touching the kernel (a dry run). Feed it to `nft -f -` to apply it by hand.
func RenderNFTables(cfg NFTablesConfig, st *State) (string, error) {
	if err := cfg.setDefaults(); err != nil {
		return "", err
	}
	w, err := newNFTablesWith(cfg, knftables.NewFake(knftables.IPv4Family, cfg.Table))
	if err != nil {
		return "", err
	}
	return w.DryRun(context.Background(), st)
}

// DryRun returns the payload the next Sync of st would write (the whole table on
// the first sync or after a failure, else only what changed), without applying it.
func (w *NFTables) DryRun(ctx context.Context, st *State) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tx, _, _, err := w.transaction(ctx, st)
	if err != nil {
		return "", err
	}
	return tx.String(), nil
}

// Sync makes the table match st in one atomic transaction: either all of it applies
// or none of it does, and the rules that were in force stay in force. The first sync
// (and the one after a failure) writes everything; later syncs write only the service
// ports whose rules changed, plus the map and set elements that changed. Syncing the
// same state twice writes nothing the second time.
func (w *NFTables) Sync(ctx context.Context, st *State) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	log := logr.FromContextOrDiscard(ctx)
	start := w.cfg.Clock.Now()
	full := w.applied == nil
	tx, plan, newStale, err := w.transaction(ctx, st)
	if err == nil && tx.NumOperations() > 0 {
		if rerr := w.nft.Run(ctx, tx); rerr != nil {
			err = fmt.Errorf("%w: nftables table ip %s (%d operations): %w", ErrApplyFailed, w.cfg.Table, tx.NumOperations(), rerr)
		}
	}
	took := w.cfg.Clock.Since(start)
	w.cfg.Metrics.SyncDone("nftables", full, took, err)
	if err != nil {
		// A refused transaction applied nothing, so the previous rules still
		// serve; the next sync is full anyway, in case something else changed the
		// table. Invalid input (plan == nil) never reached the kernel.
		if plan != nil {
			w.applied = nil
		}
		log.Error(err, "nftables sync failed", "table", w.cfg.Table, "full", full)
		return err
	}
	w.applied = plan
	w.stale = newStale
	w.baseRecreated = true
	log.V(4).Info("nftables sync done", "table", w.cfg.Table, "full", full, "operations", tx.NumOperations(), "took", took)
	return nil
}

// ForceFullSync makes the next Sync rewrite the whole table, repairing anything
// changed behind the writer's back (what Drift reports). kube-proxy does a full sync
// periodically for the same reason; the agents call this on a timer or after Drift
// finds something.
func (w *NFTables) ForceFullSync() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.applied = nil
}

// nftPlan is the compiled desired state: chains with their rules, and the elements
// of every map and set.
type nftPlan struct {
	chains     map[string][]string // service, external and endpoint chains
	chainOrder []string
	// sig holds, per chain, what besides its rules makes it "changed": the
	// affinity timeout of the sets its rules use.
	sig          map[string]string
	affinitySets map[string]time.Duration
	elements     map[string]map[string]*knftables.Element // container -> key -> element
}

// elementKey identifies an element within its container.
func elementKey(e *knftables.Element) string { return strings.Join(e.Key, " . ") }

// elementSame reports whether two elements with the same key are written identically.
func elementSame(a, b *knftables.Element) bool {
	return slices.Equal(a.Value, b.Value) && ptrEq(a.Comment, b.Comment)
}

func ptrEq(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

var containers = []struct {
	name  string
	isMap bool
}{
	{setClusterIPs, false},
	{setNodePortIPs, false},
	{setHairpinConnections, false},
	{mapFirewallIPs, true},
	{mapNoEndpointNodePorts, true},
	{mapNoEndpointServices, true},
	{mapServiceIPs, true},
	{mapServiceNodePorts, true},
}

func (w *NFTables) masqueradeRule() string {
	return fmt.Sprintf("mark set mark or %#x", w.cfg.MasqueradeMark)
}

// compile turns the desired state into chains and elements.
func (w *NFTables) compile(st *State) (*nftPlan, error) {
	if err := st.Validate(); err != nil {
		return nil, err
	}
	p := &nftPlan{
		chains:       map[string][]string{},
		sig:          map[string]string{},
		affinitySets: map[string]time.Duration{},
		elements:     map[string]map[string]*knftables.Element{},
	}
	for _, c := range containers {
		p.elements[c.name] = map[string]*knftables.Element{}
	}
	addChain := func(name string, rules ...string) {
		if _, ok := p.chains[name]; !ok {
			p.chainOrder = append(p.chainOrder, name)
		}
		p.chains[name] = append(p.chains[name], rules...)
	}
	addElem := func(e *knftables.Element) {
		c := e.Set
		if c == "" {
			c = e.Map
		}
		p.elements[c][elementKey(e)] = e
	}
	if len(w.cfg.NodePortAddresses) > 0 {
		for _, a := range w.cfg.NodePortAddresses {
			addElem(&knftables.Element{Set: setNodePortIPs, Key: []string{a.String()}})
		}
	}

	svcs := make([]*Service, len(st.Services))
	for i := range st.Services {
		svcs[i] = &st.Services[i]
	}
	slices.SortStableFunc(svcs, func(a, b *Service) int {
		return cmp.Or(cmp.Compare(a.PortNameString(), b.PortNameString()), cmp.Compare(a.Protocol, b.Protocol))
	})
	for _, s := range svcs {
		proto := s.Protocol.lower()
		port := strconv.Itoa(s.Port)
		base := nftServiceBase(s)
		svcChain := nftServicePrefix + base
		extChain := nftExternalPrefix + base
		comment := s.PortNameString()
		external := slices.Concat(s.ExternalIPs, s.LoadBalancerIPs)
		addElem(&knftables.Element{Set: setClusterIPs, Key: []string{s.ClusterIP.String()}})

		if len(s.Endpoints) == 0 {
			verdict := "goto " + chainReject
			if s.NoEndpoints == Drop {
				verdict = "drop"
			}
			for _, ip := range append([]netip.Addr{s.ClusterIP}, external...) {
				addElem(&knftables.Element{Map: mapNoEndpointServices, Key: []string{ip.String(), proto, port},
					Value: []string{verdict}, Comment: &comment})
			}
			if s.NodePort != 0 {
				addElem(&knftables.Element{Map: mapNoEndpointNodePorts, Key: []string{proto, strconv.Itoa(s.NodePort)},
					Value: []string{verdict}, Comment: &comment})
			}
			continue
		}

		if s.AffinityTimeout == 0 {
			var dnats []string
			for _, ep := range s.Endpoints {
				dnats = append(dnats, fmt.Sprintf("dnat to %s", ep))
			}
			addChain(svcChain, pickRules("meta l4proto "+proto, dnats)...)
		} else {
			var jumps, gotos []string
			for _, ep := range s.Endpoints {
				epBase := nftEndpointBase(s, ep)
				epChain, set := nftEndpointPrefix+epBase, nftAffinityPrefix+epBase
				p.affinitySets[set] = s.AffinityTimeout
				jumps = append(jumps, fmt.Sprintf("ip saddr @%s goto %s", set, epChain))
				gotos = append(gotos, "goto "+epChain)
			}
			addChain(svcChain, jumps...)
			p.sig[svcChain] = s.AffinityTimeout.String()
			addChain(svcChain, pickRules("", gotos)...)
			for _, ep := range s.Endpoints {
				epBase := nftEndpointBase(s, ep)
				p.sig[nftEndpointPrefix+epBase] = s.AffinityTimeout.String()
				addChain(nftEndpointPrefix+epBase,
					fmt.Sprintf("update @%s { ip saddr }", nftAffinityPrefix+epBase),
					fmt.Sprintf("meta l4proto %s dnat to %s", proto, ep))
			}
		}
		addElem(&knftables.Element{Map: mapServiceIPs, Key: []string{s.ClusterIP.String(), proto, port},
			Value: []string{"goto " + svcChain}})
		if len(external) > 0 || s.NodePort != 0 {
			addChain(extChain, w.masqueradeRule()+` comment "masquerade"`, "goto "+svcChain)
			for _, ip := range external {
				addElem(&knftables.Element{Map: mapServiceIPs, Key: []string{ip.String(), proto, port},
					Value: []string{"goto " + extChain}})
			}
			if s.NodePort != 0 {
				addElem(&knftables.Element{Map: mapServiceNodePorts, Key: []string{proto, strconv.Itoa(s.NodePort)},
					Value: []string{"goto " + extChain}})
			}
		}
		for _, ep := range s.Endpoints {
			addElem(&knftables.Element{Set: setHairpinConnections,
				Key: []string{ep.IP.String(), ep.IP.String(), proto, strconv.Itoa(ep.Port)}})
		}
	}
	return p, nil
}

// pickRules turns n terminal verdicts into n rules (each starting with match) that
// make a uniform random choice: rule i (0-based) applies with probability 1/(n-i)
// when reached, the last one always, so each verdict is taken with probability 1/n.
//
// The choice is deliberately made without an anonymous map (kube-proxy writes
// `numgen random mod N vmap { ... }`). When a sync replaces a service chain's rules,
// the kernel switches the rule generation and the set-element generation with one
// flip, but a packet reads the two separately: the chain's rules when it enters the
// base chain, the element generation at each map lookup. A new connection that
// entered nat-prerouting just before the commit then runs the old rule against the
// new generation, in which the old rule's anonymous map has no active element; the
// lookup misses, the rule does not DNAT, and the SYN reaches cluster-ips-check and is
// rejected (TestSyncsUnderLoad saw about one "connection refused" in 25,000 requests).
// Rules that carry their targets as immediate data have no such window: the old
// rules still DNAT, to the old endpoints.
func pickRules(match string, verdicts []string) []string {
	out := make([]string, len(verdicts))
	for i, v := range verdicts {
		if left := len(verdicts) - i; left > 1 {
			v = fmt.Sprintf("numgen random mod %d 0 %s", left, v)
		}
		out[i] = knftables.Concat(match, v)
	}
	return out
}

// serviceChainName matches the chains that belong to a service port: a prefix, the
// eight-character hash, a dash. Fixed chains such as firewall-check never match.
var serviceChainName = regexp.MustCompile(`^(service|external|endpoint|local|firewall)-[A-Z2-7]{8}-`)

// isServiceChain reports whether a chain belongs to a service port (and is therefore
// the writer's to flush and delete when no longer wanted).
func isServiceChain(name string) bool { return serviceChainName.MatchString(name) }

// transaction builds the transaction that takes the kernel from w.applied (or from
// whatever is there, on a full sync) to st. It returns the plan and the chains that
// will be stale after it.
func (w *NFTables) transaction(ctx context.Context, st *State) (*knftables.Transaction, *nftPlan, map[string]bool, error) {
	plan, err := w.compile(st)
	if err != nil {
		return nil, nil, nil, err
	}
	tx := w.nft.NewTransaction()
	prev := w.applied
	full := prev == nil
	var existingChains, existingSets []string
	if full {
		w.writeBase(tx)
		// Whatever a previous writer left: chains to flush, affinity sets to delete.
		// A missing table is not an error (first run).
		if existingChains, err = w.nft.List(ctx, "chain"); err != nil && !knftables.IsNotFound(err) {
			return nil, nil, nil, fmt.Errorf("%w: list chains of table ip %s: %w", ErrApplyFailed, w.cfg.Table, err)
		}
		if existingSets, err = w.nft.List(ctx, "set"); err != nil && !knftables.IsNotFound(err) {
			return nil, nil, nil, fmt.Errorf("%w: list sets of table ip %s: %w", ErrApplyFailed, w.cfg.Table, err)
		}
		prev = &nftPlan{chains: map[string][]string{}, sig: map[string]string{}, affinitySets: map[string]time.Duration{}}
		for _, c := range existingChains {
			if isServiceChain(c) {
				prev.chains[c] = nil
			}
		}
		for _, s := range existingSets {
			if strings.HasPrefix(s, nftAffinityPrefix) {
				prev.affinitySets[s] = -1
			}
		}
	}

	// 1. Chains that are new or changed, created and emptied first: every chain
	// exists before any rule jumps to one, and no rule still uses a set that step 3
	// re-creates.
	var changed []string
	for _, name := range plan.chainOrder {
		if old, ok := prev.chains[name]; ok && !full && slices.Equal(old, plan.chains[name]) && prev.sig[name] == plan.sig[name] {
			continue
		}
		changed = append(changed, name)
		tx.Add(&knftables.Chain{Name: name})
		tx.Flush(&knftables.Chain{Name: name})
	}
	// 2. Chains no longer wanted: flushed now, deleted by the next sync.
	newStale := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(prev.chains)) {
		if _, ok := plan.chains[name]; !ok && !w.stale[name] {
			tx.Flush(&knftables.Chain{Name: name})
			newStale[name] = true
		}
	}
	// 3. Affinity sets. Adding an existing identical set is a no-op, so a full sync
	// keeps the affinity entries; a known change of timeout re-creates the set
	// (its users were emptied in step 1, as the timeout is part of their signature).
	for _, name := range slices.Sorted(maps.Keys(plan.affinitySets)) {
		timeout := plan.affinitySets[name]
		old, ok := prev.affinitySets[name]
		if ok && old == timeout {
			continue
		}
		if ok && old > 0 {
			tx.Delete(&knftables.Set{Name: name})
		}
		tx.Add(&knftables.Set{Name: name, Type: "ipv4_addr",
			Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Timeout: &timeout})
	}
	// 4. The rules of the changed chains.
	for _, name := range changed {
		for _, r := range plan.chains[name] {
			tx.Add(&knftables.Rule{Chain: name, Rule: r})
		}
	}
	// Elements: a full sync flushes every container and adds all; a partial one
	// deletes what went and adds what came or changed.
	for _, c := range containers {
		want := plan.elements[c.name]
		var have map[string]*knftables.Element
		if full {
			if c.name == setNodePortIPs && len(w.cfg.NodePortAddresses) == 0 {
				continue // the set does not exist in this configuration
			}
			if c.isMap {
				tx.Flush(&knftables.Map{Name: c.name})
			} else {
				tx.Flush(&knftables.Set{Name: c.name})
			}
		} else {
			have = w.applied.elements[c.name]
		}
		for _, k := range slices.Sorted(maps.Keys(have)) {
			if e, ok := want[k]; !ok || !elementSame(e, have[k]) {
				tx.Delete(have[k])
			}
		}
		for _, k := range slices.Sorted(maps.Keys(want)) {
			if e, ok := have[k]; ok && elementSame(e, want[k]) {
				continue
			}
			tx.Add(want[k])
		}
	}
	for _, name := range slices.Sorted(maps.Keys(w.stale)) {
		if _, ok := plan.chains[name]; ok {
			continue // wanted again: it was re-added and written above
		}
		if full && !slices.Contains(existingChains, name) {
			continue
		}
		tx.Delete(&knftables.Chain{Name: name})
	}
	// Affinity sets no longer wanted: their rules were flushed above.
	for _, name := range slices.Sorted(maps.Keys(prev.affinitySets)) {
		if _, ok := plan.affinitySets[name]; !ok {
			tx.Delete(&knftables.Set{Name: name})
		}
	}
	return tx, plan, newStale, nil
}

// writeBase writes the table, base chains, top-level chains, maps and sets, as
// kube-proxy's setup does on a full sync.
func (w *NFTables) writeBase(tx *knftables.Transaction) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("rules for kube-proxy")})
	base := []struct {
		name     string
		typ      knftables.BaseChainType
		hook     knftables.BaseChainHook
		priority knftables.BaseChainPriority
	}{
		{chainFilterPreroutingPreDNAT, knftables.FilterType, knftables.PreroutingHook, knftables.DNATPriority + "-10"},
		{chainFilterOutputPreDNAT, knftables.FilterType, knftables.OutputHook, knftables.DNATPriority + "-10"},
		{chainFilterInput, knftables.FilterType, knftables.InputHook, knftables.FilterPriority},
		{chainFilterForward, knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority},
		{chainFilterOutput, knftables.FilterType, knftables.OutputHook, knftables.FilterPriority},
		{chainNATPrerouting, knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority},
		{chainNATOutput, knftables.NATType, knftables.OutputHook, knftables.DNATPriority},
		{chainNATPostrouting, knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority},
	}
	if !w.baseRecreated {
		// Re-create base chains once, so a changed hook or priority left by an
		// older writer does not fail the transaction.
		for _, b := range base {
			tx.Add(&knftables.Chain{Name: b.name})
			tx.Delete(&knftables.Chain{Name: b.name})
		}
	}
	for _, b := range base {
		c := &knftables.Chain{Name: b.name, Type: knftables.PtrTo(b.typ), Hook: knftables.PtrTo(b.hook), Priority: knftables.PtrTo(b.priority)}
		tx.Add(c)
		tx.Flush(c)
	}
	created := map[string]bool{}
	ensure := func(name string) {
		if created[name] {
			return
		}
		created[name] = true
		tx.Add(&knftables.Chain{Name: name})
		tx.Flush(&knftables.Chain{Name: name})
	}
	for _, j := range []struct{ dst, src, extra string }{
		{chainNodePortEndpointsCheck, chainFilterInput, "ct state new"},
		{chainServiceEndpointsCheck, chainFilterInput, "ct state new"},
		{chainServiceEndpointsCheck, chainFilterForward, "ct state new"},
		{chainServiceEndpointsCheck, chainFilterOutput, "ct state new"},
		{chainFirewallCheck, chainFilterPreroutingPreDNAT, "ct state new"},
		{chainFirewallCheck, chainFilterOutputPreDNAT, "ct state new"},
		{chainServices, chainNATOutput, ""},
		{chainServices, chainNATPrerouting, ""},
		{chainMasquerading, chainNATPostrouting, ""},
		{chainClusterIPsCheck, chainFilterForward, "ct state new"},
		{chainClusterIPsCheck, chainFilterOutput, "ct state new"},
	} {
		ensure(j.dst)
		tx.Add(&knftables.Rule{Chain: j.src, Rule: knftables.Concat(j.extra, "jump", j.dst)})
	}
	for _, c := range []string{chainServices, chainClusterIPsCheck, chainMasquerading} {
		ensure(c)
	}
	mark := fmt.Sprintf("%#x", w.cfg.MasqueradeMark)
	tx.Add(&knftables.Set{Name: setHairpinConnections, Type: "ipv4_addr . ipv4_addr . inet_proto . inet_service",
		Comment: knftables.PtrTo("service hairpin connections")})
	tx.Add(&knftables.Rule{Chain: chainMasquerading,
		Rule: knftables.Concat("mark and", mark, "!= 0 mark set mark xor", mark, "masquerade fully-random")})
	tx.Add(&knftables.Rule{Chain: chainMasquerading,
		Rule: "ct status dnat ip saddr . ip daddr . meta l4proto . th dport @" + setHairpinConnections + " masquerade fully-random"})
	tx.Add(&knftables.Set{Name: setClusterIPs, Type: "ipv4_addr", Comment: knftables.PtrTo("Active ClusterIPs")})
	tx.Add(&knftables.Rule{Chain: chainClusterIPsCheck, Rule: "ip daddr @" + setClusterIPs + " reject",
		Comment: knftables.PtrTo("Reject traffic to invalid ports of ClusterIPs")})
	if len(w.cfg.ServiceCIDRs) > 0 {
		var cidrs []string
		for _, p := range w.cfg.ServiceCIDRs {
			cidrs = append(cidrs, p.Masked().String())
		}
		tx.Add(&knftables.Rule{Chain: chainClusterIPsCheck, Rule: "ip daddr { " + strings.Join(cidrs, ", ") + " } drop",
			Comment: knftables.PtrTo("Drop traffic to unallocated ClusterIPs")})
	}
	tx.Add(&knftables.Set{Name: setNodePortIPs, Type: "ipv4_addr", Comment: knftables.PtrTo("IPs that accept NodePort traffic")})
	matchAllNodePorts := len(w.cfg.NodePortAddresses) == 0
	if matchAllNodePorts {
		tx.Delete(&knftables.Set{Name: setNodePortIPs})
	}
	tx.Add(&knftables.Map{Name: mapNoEndpointServices, Type: "ipv4_addr . inet_proto . inet_service : verdict",
		Comment: knftables.PtrTo("vmap to drop or reject packets to services with no endpoints")})
	tx.Add(&knftables.Map{Name: mapNoEndpointNodePorts, Type: "inet_proto . inet_service : verdict",
		Comment: knftables.PtrTo("vmap to drop or reject packets to service nodeports with no endpoints")})
	tx.Add(&knftables.Chain{Name: chainReject, Comment: knftables.PtrTo("helper for @no-endpoint-services / @no-endpoint-nodeports")})
	tx.Flush(&knftables.Chain{Name: chainReject})
	tx.Add(&knftables.Rule{Chain: chainReject, Rule: "reject"})
	tx.Add(&knftables.Rule{Chain: chainServiceEndpointsCheck, Rule: "ip daddr . meta l4proto . th dport vmap @" + mapNoEndpointServices})
	if matchAllNodePorts {
		tx.Add(&knftables.Rule{Chain: chainNodePortEndpointsCheck,
			Rule: "ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @" + mapNoEndpointNodePorts})
	} else {
		tx.Add(&knftables.Rule{Chain: chainNodePortEndpointsCheck,
			Rule: "ip daddr @" + setNodePortIPs + " meta l4proto . th dport vmap @" + mapNoEndpointNodePorts})
	}
	tx.Add(&knftables.Map{Name: mapFirewallIPs, Type: "ipv4_addr . inet_proto . inet_service : verdict",
		Comment: knftables.PtrTo("destinations that are subject to LoadBalancerSourceRanges")})
	ensure(chainFirewallCheck)
	tx.Add(&knftables.Rule{Chain: chainFirewallCheck, Rule: "ip daddr . meta l4proto . th dport vmap @" + mapFirewallIPs})
	tx.Add(&knftables.Map{Name: mapServiceIPs, Type: "ipv4_addr . inet_proto . inet_service : verdict",
		Comment: knftables.PtrTo("ClusterIP, ExternalIP and LoadBalancer IP traffic")})
	tx.Add(&knftables.Map{Name: mapServiceNodePorts, Type: "inet_proto . inet_service : verdict",
		Comment: knftables.PtrTo("NodePort traffic")})
	switch {
	case w.cfg.MasqueradeAll:
		tx.Add(&knftables.Rule{Chain: chainServices, Rule: "ip daddr @" + setClusterIPs + " " + w.masqueradeRule(),
			Comment: knftables.PtrTo("masquerade all clusterIP traffic")})
	case w.cfg.ClusterCIDR.IsValid():
		tx.Add(&knftables.Rule{Chain: chainServices,
			Rule:    "ip daddr @" + setClusterIPs + " ip saddr != " + w.cfg.ClusterCIDR.Masked().String() + " " + w.masqueradeRule(),
			Comment: knftables.PtrTo("masquerade clusterIP traffic from outside cluster")})
	}
	tx.Add(&knftables.Rule{Chain: chainServices, Rule: "ip daddr . meta l4proto . th dport vmap @" + mapServiceIPs})
	if matchAllNodePorts {
		tx.Add(&knftables.Rule{Chain: chainServices,
			Rule: "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @" + mapServiceNodePorts})
	} else {
		tx.Add(&knftables.Rule{Chain: chainServices,
			Rule: "ip daddr @" + setNodePortIPs + " meta l4proto . th dport vmap @" + mapServiceNodePorts})
	}
}
