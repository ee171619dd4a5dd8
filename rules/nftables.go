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
// family (empty means IPv4), the masquerade mark must be one bit, and the cluster
// CIDR and node IP, when set, of the family.
func defaultMarkAndCIDR(family *Family, mark *uint32, clusterCIDR netip.Prefix, nodeIP netip.Addr) error {
	if err := family.check(); err != nil {
		return err
	}
	if *mark == 0 {
		*mark = DefaultMasqueradeMark
	}
	if *mark&(*mark-1) != 0 {
		return fmt.Errorf("%w: masquerade mark %#x is not a single bit", ErrInvalidConfig, *mark)
	}
	if clusterCIDR.IsValid() && !family.has(clusterCIDR.Addr()) {
		return fmt.Errorf("%w: cluster CIDR %v is not %s", ErrInvalidConfig, clusterCIDR, *family)
	}
	if nodeIP.IsValid() && !family.has(nodeIP) {
		return fmt.Errorf("%w: node IP %v is not %s", ErrInvalidConfig, nodeIP, *family)
	}
	return nil
}

// NFTablesConfig configures the nftables writer. The zero value writes kube-proxy's
// own table with kube-proxy's defaults.
type NFTablesConfig struct {
	// Family is the IP family the writer serves: IPv4 (empty) writes table
	// `ip <Table>`, IPv6 table `ip6 <Table>` with ip6 matches, as upstream's
	// per-family proxiers do. Every address in the config and the state must be
	// of this family.
	Family Family
	// Table is the name of the table (in the writer's family). Empty means "kube-proxy", so
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
	// ServiceCIDRs, when set, make traffic to unallocated ClusterIPs in them drop
	// (kube-proxy's "Drop traffic to unallocated ClusterIPs", from the cluster's
	// ServiceCIDR objects). SetServiceCIDRs replaces them on a running writer.
	ServiceCIDRs []netip.Prefix
	// NodePortAddresses are the node IPs that accept NodePort traffic. Empty means
	// every local address except loopback.
	NodePortAddresses []netip.Addr
	// NodeIP is the node's primary IPv4 address (kube-proxy's nodeIP). When a
	// service's LoadBalancerSourceRanges contain it, the service's load-balancer
	// IPs are allowed as sources too, for requests from the node to a VIP it holds
	// as a local address. Zero means no such allowance.
	NodeIP netip.Addr
	// Clock times syncs. Nil means the real clock.
	Clock clock.PassiveClock
	// Metrics receives sync results. Nil means none.
	Metrics Metrics
	// Applier is how syncs reach the kernel. Empty means NFTablesNetlink: one
	// netlink batch per sync, from this process. NFTablesCLI pipes the same
	// payload to `nft -f -` instead, for hosts that forbid the process its own
	// netlink socket but allow the nft binary. Read-back (ReadBack, Drift, Trace)
	// runs `nft list` either way.
	Applier NFTablesApplier
}

// nft is the nftables family of the writer's table.
func (f Family) nft() knftables.Family {
	if f == IPv6 {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// ipX is the payload expression prefix: "ip" or "ip6".
func (f Family) ipX() string { return string(f.nft()) }

// addrType is the nftables address type: "ipv4_addr" or "ipv6_addr".
func (f Family) addrType() string {
	if f == IPv6 {
		return "ipv6_addr"
	}
	return "ipv4_addr"
}

// notLocalhost is upstream's match for destinations off the loopback range.
func (f Family) notLocalhost() string {
	if f == IPv6 {
		return "ip6 daddr != ::1"
	}
	return "ip daddr != 127.0.0.0/8"
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
	if err := defaultMarkAndCIDR(&c.Family, &c.MasqueradeMark, c.ClusterCIDR, c.NodeIP); err != nil {
		return err
	}
	if err := checkServiceCIDRs(c.Family, c.ServiceCIDRs); err != nil {
		return err
	}
	for _, a := range c.NodePortAddresses {
		if !c.Family.has(a) {
			return fmt.Errorf("%w: node port address %v is not %s", ErrInvalidConfig, a, c.Family)
		}
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	switch c.Applier {
	case "":
		c.Applier = NFTablesNetlink
	case NFTablesNetlink, NFTablesCLI:
	default:
		return fmt.Errorf("%w: nftables applier %q is not %q or %q", ErrInvalidConfig, c.Applier, NFTablesNetlink, NFTablesCLI)
	}
	return nil
}

func checkServiceCIDRs(f Family, cidrs []netip.Prefix) error {
	for _, p := range cidrs {
		if !p.IsValid() || !f.has(p.Addr()) {
			return fmt.Errorf("%w: service CIDR %v is not %s", ErrInvalidConfig, p, f)
		}
	}
	return nil
}

// NFTables writes the desired state into one nftables table of the ip family, with
// the layout of kube-proxy 1.37's nftables mode. It is safe for concurrent use;
// syncs are serialised.
type NFTables struct {
	cfg NFTablesConfig
	// nft renders transactions and serves read-back.
	nft knftables.Interface
	// applier writes transactions into the kernel.
	applier nftApplier
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
	// gen numbers transactions (see svcRules.mark).
	gen uint64
	// cidrsChanged: SetServiceCIDRs changed cfg.ServiceCIDRs since the last
	// successful sync, so the next one, even partial, rewrites cluster-ips-check.
	cidrsChanged bool
}

// NewNFTables checks that nft (>= 1.0.1) works and returns a writer. It touches no
// rules: the first Sync writes the table.
//
// Syncs (the netlink socket, or the nft process with NFTablesCLI) and read-back use
// the calling thread's network namespace; to write into another namespace, call
// NewNFTables and Sync on a thread switched into it.
func NewNFTables(cfg NFTablesConfig) (*NFTables, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	nft, err := knftables.New(cfg.Family.nft(), cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("nftables for table %s %s: %w", cfg.Family.nft(), cfg.Table, err)
	}
	w := &NFTables{cfg: cfg, nft: nft, applier: cliApplier{nft}, stale: map[string]bool{}}
	if cfg.Applier == NFTablesNetlink {
		w.applier = newNetlinkApplier(cfg.Family, cfg.Table)
	}
	return w, nil
}

// newNFTablesWith builds a writer on any knftables.Interface: the package's seam
// for unit tests (knftables.NewFake) and for rendering.
func newNFTablesWith(cfg NFTablesConfig, nft knftables.Interface) (*NFTables, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &NFTables{cfg: cfg, nft: nft, applier: cliApplier{nft}, stale: map[string]bool{}}, nil
}

// RenderNFTables returns the exact nft payload a first, full sync of st writes,
// without touching the kernel (a dry run). Feed it to `nft -f -` to apply it by hand.
func RenderNFTables(cfg NFTablesConfig, st *State) (string, error) {
	if err := cfg.setDefaults(); err != nil {
		return "", err
	}
	w, err := newNFTablesWith(cfg, knftables.NewFake(cfg.Family.nft(), cfg.Table))
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
	tx, _, _, err := w.transaction(ctx, st, nil)
	if err != nil {
		return "", err
	}
	return tx.render(w.nft).String(), nil
}

// Sync makes the table match st in one atomic transaction: either all of it applies
// or none of it does, and the rules that were in force stay in force. The first sync
// (and the one after a failure) writes everything; later syncs write only the service
// ports whose rules changed, plus the map and set elements that changed. Syncing the
// same state twice writes nothing the second time.
func (w *NFTables) Sync(ctx context.Context, st *State) error {
	return w.sync(ctx, st, nil)
}

// SyncChanges writes only the service ports ch names, as Sync of the last synced
// state with ch applied would (PartialSyncer): planning costs in proportion to ch,
// not to the table. Without a last synced state it returns ErrFullSyncNeeded.
func (w *NFTables) SyncChanges(ctx context.Context, ch *Changes) error {
	return w.sync(ctx, nil, ch)
}

func (w *NFTables) sync(ctx context.Context, st *State, ch *Changes) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	log := logr.FromContextOrDiscard(ctx)
	start := w.cfg.Clock.Now()
	full := w.applied == nil
	if ch != nil && full {
		return fmt.Errorf("%w: nftables table %s %s has no synced state to apply changes to", ErrFullSyncNeeded, w.cfg.Family.nft(), w.cfg.Table)
	}
	// A full sync through netlink is encoded into its batch while it is planned
	// (fullTransaction): the batch is the only whole copy of it.
	tx := &nftTx{}
	var enc *nlEncoder
	nl, isNetlink := w.applier.(*netlinkApplier)
	if full && isNetlink {
		enc = nl.newEncoder(0)
		tx.stream = enc
	}
	commit, newStale, err := w.transactionInto(ctx, st, ch, tx)
	planned := w.cfg.Clock.Since(start)
	if err == nil && tx.n > 0 {
		var rerr error
		switch {
		case tx.err != nil:
			rerr = tx.err
		case enc != nil:
			b, keys := enc.finish()
			enc, tx.stream = nil, nil
			rerr = nl.send(ctx, b, keys, w.replayedOpNames(ctx, st))
		default:
			rerr = w.applier.apply(ctx, tx)
		}
		if rerr != nil {
			err = fmt.Errorf("%w: nftables table %s %s (%d operations, %s): %w", ErrApplyFailed, w.cfg.Family.nft(), w.cfg.Table, tx.n, w.cfg.Applier, rerr)
		}
	}
	took := w.cfg.Clock.Since(start)
	w.cfg.Metrics.SyncDone("nftables", full, took, err)
	if err != nil {
		// A refused transaction applied nothing, so the previous rules still
		// serve; the next sync is full anyway, in case something else changed the
		// table. Invalid input (commit == nil) never reached the kernel.
		if commit != nil {
			w.applied = nil
		}
		log.Error(err, "nftables sync failed", "family", w.cfg.Family, "table", w.cfg.Table, "full", full)
		return err
	}
	commit()
	w.cidrsChanged = false
	w.stale = newStale
	w.baseRecreated = true
	log.V(4).Info("nftables sync done", "family", w.cfg.Family, "table", w.cfg.Table, "full", full, "operations", tx.n, "planned", planned, "took", took)
	return nil
}

// replayedOpNames names the commands of a full sync of st that was streamed, for
// the kernel's errors: only then is the sync planned again, as a list, and only
// once. It must run before the sync's outcome changes the writer.
func (w *NFTables) replayedOpNames(ctx context.Context, st *State) func(int) string {
	var ops []nftOp
	replayed := false
	return func(i int) string {
		if !replayed {
			replayed = true
			tx := &nftTx{}
			if _, _, err := w.fullTransaction(ctx, st, tx); err == nil {
				ops = tx.ops
			}
		}
		if i >= 0 && i < len(ops) {
			return describeOp(ops[i])
		}
		return fmt.Sprintf("command %d", i)
	}
}

// SetServiceCIDRs replaces the service CIDRs whose unallocated addresses are
// dropped (NFTablesConfig.ServiceCIDRs), as kube-proxy's OnServiceCIDRsChanged
// does when the cluster's ServiceCIDR objects change. The next sync, full or
// partial, rewrites the cluster-ips-check chain with them; kube-proxy waits for
// its next full sync instead. Every prefix must be of the writer's family; an
// error changes nothing.
func (w *NFTables) SetServiceCIDRs(cidrs []netip.Prefix) error {
	if err := checkServiceCIDRs(w.cfg.Family, cidrs); err != nil {
		return err
	}
	masked := make([]netip.Prefix, 0, len(cidrs))
	for _, p := range cidrs {
		masked = append(masked, p.Masked())
	}
	slices.SortFunc(masked, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	masked = slices.Compact(masked)
	w.mu.Lock()
	defer w.mu.Unlock()
	if slices.Equal(masked, w.cfg.ServiceCIDRs) {
		return nil
	}
	w.cfg.ServiceCIDRs = masked
	w.cidrsChanged = true
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

// nftPlan is what the last successful sync wrote: the input of every service port,
// and the elements of every map and set with the number of service ports that
// want each one (two ports of one service share their cluster IP's element).
//
// It keeps no compiled rules: compileService is a function of the port and the
// writer's (fixed) config, so a partial sync compiles the old form of the few
// ports it replaces again. The compiled form of every port (chains, rule text,
// element objects) was most of the agent's live heap at scale: about 72 MB at
// 10,000 services of 10 endpoints, against about 10 MB for the inputs and the
// element records.
type nftPlan struct {
	services map[svcID]*svcRecord
	// elements are container -> element key (elementKey) -> record.
	elements map[string]map[string]elemRecord
	// dests is which service port claims each destination, to check a partial
	// sync's changed ports against the others without validating all again.
	dests map[svcDest]svcID
}

// svcRecord is a written service port: its input (the plan's own copy).
type svcRecord struct {
	svc Service
	// mark is the number of the last transaction that found the port in its
	// state, to find the removed ones without another map.
	mark uint64
}

// elemRecord is a written element: how many service ports want it, and what
// besides its key it was written with (elementData).
type elemRecord struct {
	refs int32
	data string
}

// elementData is what besides its key an element is written with: its value and
// comment, "" for the common element with neither (a set element), so records
// of set elements hold no string of their own.
func elementData(e *knftables.Element) string {
	if e.Comment == nil {
		if len(e.Value) == 1 {
			return e.Value[0]
		}
		return strings.Join(e.Value, " . ")
	}
	return strings.Join(e.Value, " . ") + "\x00" + *e.Comment
}

// addElement counts one more user of e and returns its container and key.
func (p *nftPlan) addElement(e *knftables.Element) (string, string) {
	c, k := elementContainer(e), elementKey(e)
	r := p.elements[c][k]
	r.refs++
	r.data = elementData(e)
	p.elements[c][k] = r
	return c, k
}

func (p *nftPlan) dropElement(e *knftables.Element) {
	c, k := elementContainer(e), elementKey(e)
	r, ok := p.elements[c][k]
	if !ok {
		return
	}
	if r.refs--; r.refs <= 0 {
		delete(p.elements[c], k)
		return
	}
	p.elements[c][k] = r
}

// svcRules is one service port compiled: its chains in order, its affinity sets,
// its map and set elements, and a copy of the input they came from.
type svcRules struct {
	id       svcID
	svc      Service
	chains   []*svcChain
	affinity map[string]time.Duration
	elements []*knftables.Element
}

// svcChain is one chain of a service port.
type svcChain struct {
	name  string
	rules []string
	// sig holds what besides its rules makes the chain "changed": the affinity
	// timeout of the sets its rules use.
	sig string
}

// svcID identifies a service port, as State.Validate does: its chains are named
// after the same.
type svcID struct {
	namespace, name, port string
	proto                 Protocol
}

func idOf(s *Service) svcID { return svcID{s.Namespace, s.Name, s.PortName, s.Protocol} }

func (id svcID) String() string {
	s := Service{Namespace: id.namespace, Name: id.name, PortName: id.port}
	return s.PortNameString()
}

// svcDest is a destination a service port claims: an IP, protocol and port, or
// (zero IP) a node port.
type svcDest struct {
	ip    netip.Addr
	proto Protocol
	port  int
}

func serviceDests(s *Service) []svcDest {
	d := []svcDest{{s.ClusterIP, s.Protocol, s.Port}}
	for _, ip := range slices.Concat(s.ExternalIPs, s.LoadBalancerIPs) {
		d = append(d, svcDest{ip, s.Protocol, s.Port})
	}
	if s.NodePort != 0 {
		d = append(d, svcDest{netip.Addr{}, s.Protocol, s.NodePort})
	}
	return d
}

// serviceSame reports whether two service ports compile to the same rules.
func serviceSame(a, b *Service) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && a.PortName == b.PortName && a.Protocol == b.Protocol &&
		a.ClusterIP == b.ClusterIP && a.Port == b.Port && a.NodePort == b.NodePort &&
		slices.Equal(a.ExternalIPs, b.ExternalIPs) && slices.Equal(a.LoadBalancerIPs, b.LoadBalancerIPs) &&
		slices.Equal(a.LoadBalancerSourceRanges, b.LoadBalancerSourceRanges) &&
		slices.Equal(a.Endpoints, b.Endpoints) && a.AffinityTimeout == b.AffinityTimeout && a.NoEndpoints == b.NoEndpoints &&
		a.InternalLocal == b.InternalLocal && a.ExternalLocal == b.ExternalLocal && slices.Equal(a.LocalEndpoints, b.LocalEndpoints)
}

// elementKey identifies an element within its container.
func elementKey(e *knftables.Element) string { return strings.Join(e.Key, " . ") }

func elementContainer(e *knftables.Element) string {
	if e.Set != "" {
		return e.Set
	}
	return e.Map
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

// compileService turns one (valid) service port into its chains and elements.
func (w *NFTables) compileService(s *Service) *svcRules {
	r := &svcRules{id: idOf(s), svc: *s, affinity: map[string]time.Duration{}}
	r.svc.ExternalIPs = slices.Clone(s.ExternalIPs)
	r.svc.LoadBalancerIPs = slices.Clone(s.LoadBalancerIPs)
	r.svc.LoadBalancerSourceRanges = slices.Clone(s.LoadBalancerSourceRanges)
	r.svc.Endpoints = slices.Clone(s.Endpoints)
	r.svc.LocalEndpoints = slices.Clone(s.LocalEndpoints)
	byName := map[string]*svcChain{}
	addChain := func(name string, rules ...string) *svcChain {
		c, ok := byName[name]
		if !ok {
			c = &svcChain{name: name}
			byName[name] = c
			r.chains = append(r.chains, c)
		}
		c.rules = append(c.rules, rules...)
		return c
	}
	addElem := func(e *knftables.Element) { r.elements = append(r.elements, e) }

	proto := s.Protocol.lower()
	port := strconv.Itoa(s.Port)
	base := nftServiceBase(s)
	svcChain := nftServicePrefix + base
	extChain := nftExternalPrefix + base
	comment := s.PortNameString()
	external := slices.Concat(s.ExternalIPs, s.LoadBalancerIPs)
	addElem(&knftables.Element{Set: setClusterIPs, Key: []string{s.ClusterIP.String()}})
	pol := s.policy()
	verdict := func(a NoEndpointsAction) string {
		if a == Drop {
			return "drop"
		}
		return "goto " + chainReject
	}

	// No usable endpoint for a kind of traffic: the filter table rejects it (no
	// endpoints at all) or drops it (a Local policy with none on this node).
	if pol.internalVerdict != "" {
		addElem(&knftables.Element{Map: mapNoEndpointServices, Key: []string{s.ClusterIP.String(), proto, port},
			Value: []string{verdict(pol.internalVerdict)}, Comment: &comment})
	}
	if pol.externalVerdict != "" {
		for _, ip := range external {
			addElem(&knftables.Element{Map: mapNoEndpointServices, Key: []string{ip.String(), proto, port},
				Value: []string{verdict(pol.externalVerdict)}, Comment: &comment})
		}
		if s.NodePort != 0 {
			addElem(&knftables.Element{Map: mapNoEndpointNodePorts, Key: []string{proto, strconv.Itoa(s.NodePort)},
				Value: []string{verdict(pol.externalVerdict)}, Comment: &comment})
		}
	}
	// LoadBalancerSourceRanges: firewall-check (in the filter hooks, before DNAT)
	// sends new connections to a restricted load-balancer IP through the port's
	// firewall chain, which drops sources outside the ranges. Written whether or
	// not the port has endpoints, as kube-proxy does.
	if s.usesFirewall() {
		fwChain := nftFirewallPrefix + base
		addChain(fwChain, w.firewallRule(s))
		for _, ip := range s.LoadBalancerIPs {
			addElem(&knftables.Element{Map: mapFirewallIPs, Key: []string{ip.String(), proto, port},
				Value: []string{"goto " + fwChain}})
		}
	}
	if !pol.hasEndpoints {
		return r
	}

	// The policy chains: service-... for the Cluster endpoints, local-... for this
	// node's, each choosing one endpoint of its list.
	localChain := nftLocalPrefix + base
	writePolicyChain := func(name string, eps []Endpoint) {
		if s.AffinityTimeout == 0 {
			dnats := make([]string, 0, len(eps))
			for _, ep := range eps {
				dnats = append(dnats, "dnat to "+ep.String())
			}
			addChain(name, pickRules("meta l4proto "+proto, dnats)...)
			return
		}
		var jumps, gotos []string
		for _, ep := range eps {
			epBase := nftEndpointBase(s, ep)
			jumps = append(jumps, fmt.Sprintf("%s saddr @%s goto %s", w.cfg.Family.ipX(), nftAffinityPrefix+epBase, nftEndpointPrefix+epBase))
			gotos = append(gotos, "goto "+nftEndpointPrefix+epBase)
		}
		c := addChain(name, jumps...)
		c.sig = s.AffinityTimeout.String()
		addChain(name, pickRules("", gotos)...)
	}
	if pol.usesCluster {
		writePolicyChain(svcChain, s.Endpoints)
	}
	if pol.usesLocal {
		writePolicyChain(localChain, s.LocalEndpoints)
	}
	if s.AffinityTimeout > 0 {
		// One endpoint chain and affinity set per endpoint, shared by both policy
		// chains.
		for _, ep := range pol.all {
			epBase := nftEndpointBase(s, ep)
			r.affinity[nftAffinityPrefix+epBase] = s.AffinityTimeout
			c := addChain(nftEndpointPrefix+epBase,
				fmt.Sprintf("update @%s { %s saddr }", nftAffinityPrefix+epBase, w.cfg.Family.ipX()),
				fmt.Sprintf("meta l4proto %s dnat to %s", proto, ep))
			c.sig = s.AffinityTimeout.String()
		}
	}
	internalChain, externalPolicyChain := svcChain, svcChain
	if s.InternalLocal {
		internalChain = localChain
	}
	if s.ExternalLocal {
		externalPolicyChain = localChain
	}
	if pol.internalVerdict == "" {
		addElem(&knftables.Element{Map: mapServiceIPs, Key: []string{s.ClusterIP.String(), proto, port},
			Value: []string{"goto " + internalChain}})
	}
	if s.externallyAccessible() {
		if !s.ExternalLocal {
			addChain(extChain, w.masqueradeRule()+` comment "masquerade"`)
		} else if pol.usesCluster {
			// Local policy keeps the client's address. Pods (the cluster CIDR) and
			// the node itself are not subject to it: they go to the Cluster
			// endpoints, as if out through a load balancer and back in; the node's
			// own traffic is masqueraded, as its source is the destination address.
			if w.cfg.ClusterCIDR.IsValid() {
				addChain(extChain, fmt.Sprintf(`%s saddr %s goto %s comment "short-circuit pod traffic"`, w.cfg.Family.ipX(), w.cfg.ClusterCIDR.Masked(), svcChain))
			}
			addChain(extChain,
				`fib saddr type local `+w.masqueradeRule()+` comment "masquerade local traffic"`,
				`fib saddr type local goto `+svcChain+` comment "short-circuit local traffic"`)
		} else {
			addChain(extChain)
		}
		if pol.externalVerdict == "" {
			addChain(extChain, "goto "+externalPolicyChain)
		}
		for _, ip := range external {
			addElem(&knftables.Element{Map: mapServiceIPs, Key: []string{ip.String(), proto, port},
				Value: []string{"goto " + extChain}})
		}
		if s.NodePort != 0 {
			addElem(&knftables.Element{Map: mapServiceNodePorts, Key: []string{proto, strconv.Itoa(s.NodePort)},
				Value: []string{"goto " + extChain}})
		}
	}
	for _, ep := range pol.all {
		addElem(&knftables.Element{Set: setHairpinConnections,
			Key: []string{ep.IP.String(), ep.IP.String(), proto, strconv.Itoa(ep.Port)}})
	}
	return r
}

// firewallRule is the one rule of a firewall chain: drop every source outside the
// ranges, the load-balancer IPs counting as inside when the node's IP is.
// Elements are separated as kube-proxy's knftables.Concat separates them (" , ").
func (w *NFTables) firewallRule(s *Service) string {
	sources := make([]string, 0, len(s.LoadBalancerSourceRanges)+len(s.LoadBalancerIPs))
	for _, p := range s.LoadBalancerSourceRanges {
		sources = append(sources, p.Masked().String())
	}
	if s.allowsNode(w.cfg.NodeIP) {
		for _, ip := range s.LoadBalancerIPs {
			sources = append(sources, ip.String())
		}
	}
	return w.cfg.Family.ipX() + " saddr != { " + strings.Join(sources, " , ") + " } drop"
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
// whatever is there, on a full sync) to st, or to w.applied with ch applied. It
// returns the function that records the transaction as applied (nil when st is
// invalid) and the chains that will be stale after it.
func (w *NFTables) transaction(ctx context.Context, st *State, ch *Changes) (*nftTx, func(), map[string]bool, error) {
	tx := &nftTx{}
	commit, newStale, err := w.transactionInto(ctx, st, ch, tx)
	if err != nil {
		return nil, nil, nil, err
	}
	return tx, commit, newStale, nil
}

// transactionInto is transaction writing its commands into tx, which may stream
// them (nftTx.stream).
func (w *NFTables) transactionInto(ctx context.Context, st *State, ch *Changes, tx *nftTx) (func(), map[string]bool, error) {
	if w.applied == nil {
		return w.fullTransaction(ctx, st, tx)
	}
	return w.partialTransaction(st, ch, tx)
}

// fullTransaction writes the whole table: the base, every service port's chains
// and rules, every element, and the clean-up of what a previous writer left.
//
// It holds one service port's compiled form at a time, so that a streaming tx
// never has every port's chains, rule text and element objects alive at once: a
// first pass compiles each port for its chain names and its record in the plan
// (which keeps the elements, as keys and data), a second compiles it again for its
// rules, once the chains and affinity sets they use are in the transaction. The
// commands are the same, in the same order, as if every port were compiled first.
func (w *NFTables) fullTransaction(ctx context.Context, st *State, tx *nftTx) (func(), map[string]bool, error) {
	if err := st.ValidateFamily(w.cfg.Family); err != nil {
		return nil, nil, err
	}
	// The payload's order of ports: by name, then protocol.
	names := make([]string, len(st.Services))
	order := make([]int, len(st.Services))
	for i := range st.Services {
		names[i] = st.Services[i].PortNameString()
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(names[a], names[b]), cmp.Compare(st.Services[a].Protocol, st.Services[b].Protocol))
	})
	names = nil

	plan := &nftPlan{services: make(map[svcID]*svcRecord, len(st.Services)),
		elements: make(map[string]map[string]elemRecord, len(containers)), dests: make(map[svcDest]svcID, len(st.Services))}
	for _, c := range containers {
		plan.elements[c.name] = map[string]elemRecord{}
	}
	for _, a := range w.cfg.NodePortAddresses {
		plan.addElement(&knftables.Element{Set: setNodePortIPs, Key: []string{a.String()}})
	}
	var chainNames []string
	wantChains := map[string]bool{}
	wantAffinity := map[string]time.Duration{}
	size := 64
	for _, i := range order {
		r := w.compileService(&st.Services[i])
		plan.services[r.id] = &svcRecord{svc: r.svc}
		for _, e := range r.elements {
			plan.addElement(e)
		}
		size += len(r.elements)
		for _, d := range serviceDests(&r.svc) {
			plan.dests[d] = r.id
		}
		for _, c := range r.chains {
			chainNames = append(chainNames, c.name)
			wantChains[c.name] = true
			size += 2 + len(c.rules)
		}
		maps.Copy(wantAffinity, r.affinity)
	}
	tx.grow(size)

	w.writeBase(tx)
	// Whatever a previous writer left: chains to flush, affinity sets to delete.
	existingChains, err := w.applier.list(ctx, "chain")
	if err != nil {
		return nil, nil, fmt.Errorf("%w: list chains of table %s %s: %w", ErrApplyFailed, w.cfg.Family.nft(), w.cfg.Table, err)
	}
	existingSets, err := w.applier.list(ctx, "set")
	if err != nil {
		return nil, nil, fmt.Errorf("%w: list sets of table %s %s: %w", ErrApplyFailed, w.cfg.Family.nft(), w.cfg.Table, err)
	}
	oldAffinity := map[string]bool{}
	for _, s := range existingSets {
		if strings.HasPrefix(s, nftAffinityPrefix) {
			oldAffinity[s] = true
		}
	}

	// 1. Every chain, created and emptied first: every chain exists before any
	// rule jumps to one, and no rule still uses a set that step 3 re-creates.
	for _, name := range chainNames {
		tx.add(&knftables.Chain{Name: name})
		tx.flush(&knftables.Chain{Name: name})
	}
	chainNames = nil
	// 2. Service chains no longer wanted: flushed now, deleted by the next sync.
	newStale := map[string]bool{}
	slices.Sort(existingChains)
	for _, name := range slices.Compact(slices.Clone(existingChains)) {
		if isServiceChain(name) && !wantChains[name] && !w.stale[name] {
			tx.flush(&knftables.Chain{Name: name})
			newStale[name] = true
		}
	}
	// 3. Affinity sets. Adding an existing identical set is a no-op, so a full
	// sync keeps the affinity entries.
	for _, name := range slices.Sorted(maps.Keys(wantAffinity)) {
		timeout := wantAffinity[name]
		tx.add(&knftables.Set{Name: name, Type: w.cfg.Family.addrType(),
			Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Timeout: &timeout})
	}
	// 4. The rules of every chain.
	for _, i := range order {
		for _, c := range w.compileService(&st.Services[i]).chains {
			for _, r := range c.rules {
				rule, comment := splitComment(r)
				tx.add(&knftables.Rule{Chain: c.name, Rule: rule, Comment: comment})
			}
		}
	}
	// Elements: every container flushed and all its elements added, from the
	// plan's records.
	for _, c := range containers {
		if c.name == setNodePortIPs && len(w.cfg.NodePortAddresses) == 0 {
			continue // the set does not exist in this configuration
		}
		if c.isMap {
			tx.flush(&knftables.Map{Name: c.name})
		} else {
			tx.flush(&knftables.Set{Name: c.name})
		}
		recs := plan.elements[c.name]
		for _, k := range slices.Sorted(maps.Keys(recs)) {
			tx.add(recordElement(c.name, c.isMap, k, recs[k].data))
		}
	}

	for _, name := range slices.Sorted(maps.Keys(w.stale)) {
		if !wantChains[name] && slices.Contains(existingChains, name) {
			tx.delete(&knftables.Chain{Name: name})
		}
	}
	// Affinity sets no longer wanted: their rules were flushed above.
	for _, name := range slices.Sorted(maps.Keys(oldAffinity)) {
		if _, ok := wantAffinity[name]; !ok {
			tx.delete(&knftables.Set{Name: name})
		}
	}
	return func() { w.applied = plan }, newStale, nil
}

// recordElement is the element a plan's record describes (elementKey and
// elementData inverted).
func recordElement(container string, isMap bool, key, data string) *knftables.Element {
	e := &knftables.Element{Key: strings.Split(key, " . ")}
	if isMap {
		e.Map = container
	} else {
		e.Set = container
	}
	value, comment, hasComment := strings.Cut(data, "\x00")
	if value != "" {
		e.Value = strings.Split(value, " . ")
	}
	if hasComment {
		e.Comment = &comment
	}
	return e
}

// partialTransaction writes what changed since w.applied: it costs in proportion
// to what changed, as service ports equal to the ones last written are not
// compiled again, and only the elements of the changed ones are compared.
func (w *NFTables) partialTransaction(st *State, ch *Changes, tx *nftTx) (func(), map[string]bool, error) {
	prev := w.applied
	var changed, olds []*svcRules
	var removed []svcID
	var err error
	if ch != nil {
		if changed, olds, removed, err = w.changesOf(ch, prev); err != nil {
			return nil, nil, err
		}
	} else if changed, olds, removed, err = w.changes(st, prev); err != nil {
		return nil, nil, err
	}
	size := 64
	for _, r := range changed {
		size += 2*len(r.chains) + len(r.elements)
		for _, c := range r.chains {
			size += len(c.rules)
		}
	}
	tx.grow(size)
	slices.SortStableFunc(changed, func(a, b *svcRules) int {
		return cmp.Or(cmp.Compare(a.svc.PortNameString(), b.svc.PortNameString()), cmp.Compare(a.svc.Protocol, b.svc.Protocol))
	})

	wantChains := make(map[string]*svcChain, len(changed))
	wantAffinity := map[string]time.Duration{}
	for _, r := range changed {
		for _, c := range r.chains {
			wantChains[c.name] = c
		}
		maps.Copy(wantAffinity, r.affinity)
	}
	oldChains := map[string]*svcChain{}
	oldAffinity := map[string]time.Duration{}
	for _, r := range olds {
		for _, c := range r.chains {
			oldChains[c.name] = c
		}
		maps.Copy(oldAffinity, r.affinity)
	}
	if w.cidrsChanged {
		tx.flush(&knftables.Chain{Name: chainClusterIPsCheck})
		w.clusterIPsCheckRules(tx)
	}

	// 1. Chains that are new or changed, created and emptied first: every chain
	// exists before any rule jumps to one, and no rule still uses a set that step 3
	// re-creates.
	var changedChains []*svcChain
	for _, r := range changed {
		for _, c := range r.chains {
			if old, ok := oldChains[c.name]; ok && slices.Equal(old.rules, c.rules) && old.sig == c.sig {
				continue
			}
			changedChains = append(changedChains, c)
			tx.add(&knftables.Chain{Name: c.name})
			tx.flush(&knftables.Chain{Name: c.name})
		}
	}
	// 2. Chains no longer wanted: flushed now, deleted by the next sync.
	newStale := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(oldChains)) {
		if _, ok := wantChains[name]; !ok && !w.stale[name] {
			tx.flush(&knftables.Chain{Name: name})
			newStale[name] = true
		}
	}
	// 3. Affinity sets. A known change of timeout re-creates the set (its users
	// were emptied in step 1, as the timeout is part of their signature).
	for _, name := range slices.Sorted(maps.Keys(wantAffinity)) {
		timeout := wantAffinity[name]
		old, ok := oldAffinity[name]
		if ok && old == timeout {
			continue
		}
		if ok && old > 0 {
			tx.delete(&knftables.Set{Name: name})
		}
		tx.add(&knftables.Set{Name: name, Type: w.cfg.Family.addrType(),
			Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag}, Timeout: &timeout})
	}
	// 4. The rules of the changed chains.
	for _, c := range changedChains {
		for _, r := range c.rules {
			rule, comment := splitComment(r)
			tx.add(&knftables.Rule{Chain: c.name, Rule: rule, Comment: comment})
		}
	}

	// Elements: delete what went and add what came or changed, among the
	// elements of the changed service ports.
	w.elementChanges(tx, prev, changed, olds)
	commit := func() {
		for _, r := range olds {
			for _, e := range r.elements {
				prev.dropElement(e)
			}
			for _, d := range serviceDests(&r.svc) {
				if prev.dests[d] == r.id {
					delete(prev.dests, d)
				}
			}
		}
		for _, id := range removed {
			delete(prev.services, id)
		}
		for _, r := range changed {
			prev.services[r.id] = &svcRecord{svc: r.svc}
			for _, e := range r.elements {
				prev.addElement(e)
			}
			for _, d := range serviceDests(&r.svc) {
				prev.dests[d] = r.id
			}
		}
	}

	for _, name := range slices.Sorted(maps.Keys(w.stale)) {
		if _, ok := wantChains[name]; ok {
			continue // wanted again: it was re-added and written above
		}
		tx.delete(&knftables.Chain{Name: name})
	}
	// Affinity sets no longer wanted: their rules were flushed above.
	for _, name := range slices.Sorted(maps.Keys(oldAffinity)) {
		if _, ok := wantAffinity[name]; !ok {
			tx.delete(&knftables.Set{Name: name})
		}
	}
	return commit, newStale, nil
}

// changes finds what a partial sync must write: the new compiled form of new or
// changed service ports, the old form of changed or removed ones, and the removed
// ones. It validates as State.Validate does, but only what changed: a port equal to
// one already written was valid then, and a clash of destinations needs a changed
// port on one side.
func (w *NFTables) changes(st *State, prev *nftPlan) (changed, olds []*svcRules, removed []svcID, err error) {
	w.gen++
	gen := w.gen
	var added map[svcID]bool
	for i := range st.Services {
		s := &st.Services[i]
		id := idOf(s)
		old := prev.services[id]
		if old != nil && old.mark == gen || added[id] {
			return nil, nil, nil, fmt.Errorf("%w: service port %q (%s) listed twice", ErrInvalidState, s.PortNameString(), s.Protocol)
		}
		if old != nil {
			old.mark = gen
			if serviceSame(&old.svc, s) {
				continue
			}
			olds = append(olds, w.compileService(&old.svc))
		} else {
			if added == nil {
				added = map[svcID]bool{}
			}
			added[id] = true
		}
		if err := s.ValidateFamily(w.cfg.Family); err != nil {
			return nil, nil, nil, err
		}
		changed = append(changed, w.compileService(s))
	}
	for id, old := range prev.services {
		if old.mark != gen {
			olds = append(olds, w.compileService(&old.svc))
			removed = append(removed, id)
		}
	}
	if err := checkClaims(prev, changed, olds); err != nil {
		return nil, nil, nil, err
	}
	return changed, olds, removed, nil
}

// changesOf is changes for a partial update: only the ports ch names are looked
// at.
func (w *NFTables) changesOf(ch *Changes, prev *nftPlan) (changed, olds []*svcRules, removed []svcID, err error) {
	seen := make(map[svcID]bool, len(ch.Set)+len(ch.Remove))
	for i := range ch.Set {
		s := &ch.Set[i]
		id := idOf(s)
		if seen[id] {
			return nil, nil, nil, fmt.Errorf("%w: service port %q (%s) listed twice", ErrInvalidState, s.PortNameString(), s.Protocol)
		}
		seen[id] = true
		old := prev.services[id]
		if old != nil {
			if serviceSame(&old.svc, s) {
				continue
			}
			olds = append(olds, w.compileService(&old.svc))
		}
		if err := s.ValidateFamily(w.cfg.Family); err != nil {
			return nil, nil, nil, err
		}
		changed = append(changed, w.compileService(s))
	}
	for _, p := range ch.Remove {
		id := svcID{p.Namespace, p.Name, p.PortName, p.Protocol}
		if seen[id] {
			return nil, nil, nil, fmt.Errorf("%w: service port %q (%s) both set and removed", ErrInvalidState, id, p.Protocol)
		}
		seen[id] = true
		if old := prev.services[id]; old != nil {
			olds = append(olds, w.compileService(&old.svc))
			removed = append(removed, id)
		}
	}
	if err := checkClaims(prev, changed, olds); err != nil {
		return nil, nil, nil, err
	}
	return changed, olds, removed, nil
}

// checkClaims checks that no changed port claims a destination another port
// still claims: the ports of prev, less olds, plus changed.
func checkClaims(prev *nftPlan, changed, olds []*svcRules) error {
	void := make(map[svcID]bool, len(olds))
	for _, r := range olds {
		void[r.id] = true
	}
	claimed := map[svcDest]svcID{}
	for _, r := range changed {
		for _, d := range serviceDests(&r.svc) {
			o, ok := claimed[d]
			if !ok {
				if o, ok = prev.dests[d]; ok && void[o] {
					ok = false
				}
			}
			if ok && o != r.id {
				return fmt.Errorf("%w: service ports %q and %q both claim %v %s/%d",
					ErrInvalidState, o, r.svc.PortNameString(), d.ip, d.proto, d.port)
			}
			claimed[d] = r.id
		}
	}
	return nil
}

// elementChanges writes, per container, the deletes and then the adds that take the
// elements of prev to those after replacing olds by changed.
func (w *NFTables) elementChanges(tx *nftTx, prev *nftPlan, changed, olds []*svcRules) {
	// want is the element a changed port writes; nil leaves the written one as
	// it is, unless no port wants the key any more.
	type touch struct {
		refs int32
		want *knftables.Element
	}
	touched := map[string]map[string]*touch{}
	get := func(e *knftables.Element) *touch {
		c, k := elementContainer(e), elementKey(e)
		if touched[c] == nil {
			touched[c] = map[string]*touch{}
		}
		t := touched[c][k]
		if t == nil {
			t = &touch{refs: prev.elements[c][k].refs}
			touched[c][k] = t
		}
		return t
	}
	for _, r := range olds {
		for _, e := range r.elements {
			get(e).refs--
		}
	}
	for _, r := range changed {
		for _, e := range r.elements {
			t := get(e)
			t.refs++
			t.want = e
		}
	}
	for _, c := range containers {
		keys := slices.Sorted(maps.Keys(touched[c.name]))
		have := prev.elements[c.name]
		var adds []*knftables.Element
		for _, k := range keys {
			t := touched[c.name][k]
			old, had := have[k]
			if t.refs > 0 && t.want == nil {
				continue // still wanted, and no changed port writes it differently
			}
			same := had && t.want != nil && old.data == elementData(t.want)
			if had && !same {
				// A delete names the key alone.
				del := &knftables.Element{Key: strings.Split(k, " . ")}
				if c.isMap {
					del.Map = c.name
				} else {
					del.Set = c.name
				}
				tx.delete(del)
			}
			if t.refs > 0 && !same {
				adds = append(adds, t.want)
			}
		}
		for _, e := range adds {
			tx.add(e)
		}
	}
}

// writeBase writes the table, base chains, top-level chains, maps and sets, as
// kube-proxy's setup does on a full sync.
func (w *NFTables) writeBase(tx *nftTx) {
	ipX, addr := w.cfg.Family.ipX(), w.cfg.Family.addrType()
	tx.add(&knftables.Table{Comment: knftables.PtrTo("rules for kube-proxy")})
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
			tx.add(&knftables.Chain{Name: b.name})
			tx.delete(&knftables.Chain{Name: b.name})
		}
	}
	for _, b := range base {
		c := &knftables.Chain{Name: b.name, Type: knftables.PtrTo(b.typ), Hook: knftables.PtrTo(b.hook), Priority: knftables.PtrTo(b.priority)}
		tx.add(c)
		tx.flush(c)
	}
	created := map[string]bool{}
	ensure := func(name string) {
		if created[name] {
			return
		}
		created[name] = true
		tx.add(&knftables.Chain{Name: name})
		tx.flush(&knftables.Chain{Name: name})
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
		tx.add(&knftables.Rule{Chain: j.src, Rule: knftables.Concat(j.extra, "jump", j.dst)})
	}
	for _, c := range []string{chainServices, chainClusterIPsCheck, chainMasquerading} {
		ensure(c)
	}
	mark := fmt.Sprintf("%#x", w.cfg.MasqueradeMark)
	tx.add(&knftables.Set{Name: setHairpinConnections, Type: addr + " . " + addr + " . inet_proto . inet_service",
		Comment: knftables.PtrTo("service hairpin connections")})
	tx.add(&knftables.Rule{Chain: chainMasquerading,
		Rule: knftables.Concat("mark and", mark, "!= 0 mark set mark xor", mark, "masquerade fully-random")})
	tx.add(&knftables.Rule{Chain: chainMasquerading,
		Rule: "ct status dnat " + ipX + " saddr . " + ipX + " daddr . meta l4proto . th dport @" + setHairpinConnections + " masquerade fully-random"})
	tx.add(&knftables.Set{Name: setClusterIPs, Type: addr, Comment: knftables.PtrTo("Active ClusterIPs")})
	w.clusterIPsCheckRules(tx)
	tx.add(&knftables.Set{Name: setNodePortIPs, Type: addr, Comment: knftables.PtrTo("IPs that accept NodePort traffic")})
	matchAllNodePorts := len(w.cfg.NodePortAddresses) == 0
	if matchAllNodePorts {
		tx.delete(&knftables.Set{Name: setNodePortIPs})
	}
	tx.add(&knftables.Map{Name: mapNoEndpointServices, Type: addr + " . inet_proto . inet_service : verdict",
		Comment: knftables.PtrTo("vmap to drop or reject packets to services with no endpoints")})
	tx.add(&knftables.Map{Name: mapNoEndpointNodePorts, Type: "inet_proto . inet_service : verdict",
		Comment: knftables.PtrTo("vmap to drop or reject packets to service nodeports with no endpoints")})
	tx.add(&knftables.Chain{Name: chainReject, Comment: knftables.PtrTo("helper for @no-endpoint-services / @no-endpoint-nodeports")})
	tx.flush(&knftables.Chain{Name: chainReject})
	tx.add(&knftables.Rule{Chain: chainReject, Rule: "reject"})
	tx.add(&knftables.Rule{Chain: chainServiceEndpointsCheck, Rule: ipX + " daddr . meta l4proto . th dport vmap @" + mapNoEndpointServices})
	if matchAllNodePorts {
		tx.add(&knftables.Rule{Chain: chainNodePortEndpointsCheck,
			Rule: w.cfg.Family.notLocalhost() + " meta l4proto . th dport vmap @" + mapNoEndpointNodePorts})
	} else {
		tx.add(&knftables.Rule{Chain: chainNodePortEndpointsCheck,
			Rule: ipX + " daddr @" + setNodePortIPs + " meta l4proto . th dport vmap @" + mapNoEndpointNodePorts})
	}
	tx.add(&knftables.Map{Name: mapFirewallIPs, Type: addr + " . inet_proto . inet_service : verdict",
		Comment: knftables.PtrTo("destinations that are subject to LoadBalancerSourceRanges")})
	ensure(chainFirewallCheck)
	tx.add(&knftables.Rule{Chain: chainFirewallCheck, Rule: ipX + " daddr . meta l4proto . th dport vmap @" + mapFirewallIPs})
	tx.add(&knftables.Map{Name: mapServiceIPs, Type: addr + " . inet_proto . inet_service : verdict",
		Comment: knftables.PtrTo("ClusterIP, ExternalIP and LoadBalancer IP traffic")})
	tx.add(&knftables.Map{Name: mapServiceNodePorts, Type: "inet_proto . inet_service : verdict",
		Comment: knftables.PtrTo("NodePort traffic")})
	switch {
	case w.cfg.MasqueradeAll:
		tx.add(&knftables.Rule{Chain: chainServices, Rule: ipX + " daddr @" + setClusterIPs + " " + w.masqueradeRule(),
			Comment: knftables.PtrTo("masquerade all clusterIP traffic")})
	case w.cfg.ClusterCIDR.IsValid():
		tx.add(&knftables.Rule{Chain: chainServices,
			Rule:    ipX + " daddr @" + setClusterIPs + " " + ipX + " saddr != " + w.cfg.ClusterCIDR.Masked().String() + " " + w.masqueradeRule(),
			Comment: knftables.PtrTo("masquerade clusterIP traffic from outside cluster")})
	}
	tx.add(&knftables.Rule{Chain: chainServices, Rule: ipX + " daddr . meta l4proto . th dport vmap @" + mapServiceIPs})
	if matchAllNodePorts {
		tx.add(&knftables.Rule{Chain: chainServices,
			Rule: "fib daddr type local " + w.cfg.Family.notLocalhost() + " meta l4proto . th dport vmap @" + mapServiceNodePorts})
	} else {
		tx.add(&knftables.Rule{Chain: chainServices,
			Rule: ipX + " daddr @" + setNodePortIPs + " meta l4proto . th dport vmap @" + mapServiceNodePorts})
	}
}

// clusterIPsCheckRules writes the rules of cluster-ips-check (emptied before):
// traffic that reached the filter hooks without being DNATed is rejected when its
// destination is a ClusterIP (a port the Service does not have) and dropped when
// it is another address of a service CIDR.
func (w *NFTables) clusterIPsCheckRules(tx *nftTx) {
	ipX := w.cfg.Family.ipX()
	tx.add(&knftables.Rule{Chain: chainClusterIPsCheck, Rule: ipX + " daddr @" + setClusterIPs + " reject",
		Comment: knftables.PtrTo("Reject traffic to invalid ports of ClusterIPs")})
	// kube-proxy puts all service CIDRs in one anonymous set; one rule per CIDR
	// (each a one-element set, which nft compiles to a plain match) drops the same
	// packets and needs no anonymous set in the netlink encoding.
	for _, p := range w.cfg.ServiceCIDRs {
		tx.add(&knftables.Rule{Chain: chainClusterIPsCheck, Rule: ipX + " daddr { " + p.Masked().String() + " } drop",
			Comment: knftables.PtrTo("Drop traffic to unallocated ClusterIPs")})
	}
}

// splitComment separates a trailing ` comment "..."` from a compiled rule: the
// comment travels as the rule's comment, which renders to the same text.
func splitComment(rule string) (string, *string) {
	i := strings.Index(rule, ` comment "`)
	if i < 0 || !strings.HasSuffix(rule, `"`) {
		return rule, nil
	}
	c := rule[i+len(` comment "`) : len(rule)-1]
	return rule[:i], &c
}
