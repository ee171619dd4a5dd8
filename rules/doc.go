// Package rules writes Kubernetes Service rules into the kernel's packet filter, the
// way kube-proxy does, and then steps back: the kernel does the load balancing, so
// the rules keep working when the writer exits (and go stale, slowly, as pods move
// and nobody updates them).
//
// # Desired state
//
// A State lists service ports (Service): the virtual IP, protocol and port, optional
// NodePort, external and load-balancer IPs, the usable endpoints (already chosen by
// the caller: ready, else serving and terminating), ClientIP session affinity, and
// what to do with new connections when there is no endpoint (Reject, the default, or
// Drop). The package does not import the agents' service cache: they convert.
//
// # Traffic policies
//
// Service.InternalLocal and Service.ExternalLocal are internalTrafficPolicy and
// externalTrafficPolicy Local: that traffic goes to Service.LocalEndpoints only
// (chains local-HASH-... in nftables, KUBE-SVL-... in iptables), and external traffic
// so handled keeps the client's address, except that pods (the cluster CIDR) and the
// node itself are short-circuited to the Cluster endpoints, as kube-proxy does. A
// Local policy with no local endpoint while the port has endpoints elsewhere drops
// that traffic ("has no local endpoints").
// State.Validate rejects what cannot be written, naming the service port at fault;
// every error wraps ErrInvalidState, ErrInvalidConfig or ErrApplyFailed.
//
// # Load-balancer source ranges
//
// Service.LoadBalancerSourceRanges restrict the sources that reach the
// LoadBalancerIPs, as kube-proxy 1.37 does: nftables looks new connections to those
// destinations up in the firewall-ips map from firewall-check (filter hooks, before
// DNAT) and sends them to a firewall-HASH-ns/name/proto/port chain whose one rule
// drops every other source (`ip saddr != { a , b } drop`); iptables sends them through
// KUBE-FW-<hash>, which passes the allowed sources on to KUBE-EXT-<hash>, and the
// filter table's KUBE-PROXY-FIREWALL drops what reached its end undNATed. When a range
// holds the configured NodeIP, the load-balancer IPs count as allowed sources too.
// The cluster IP, external IPs and node port are never restricted. The netlink
// applier writes a multi-element set as nft does: an anonymous constant interval set
// created in the same batch, just before its rule.
//
// # nftables
//
// Each writer serves one IP family (NFTablesConfig.Family, IPTablesConfig.Family:
// IPv4 by default, or IPv6), as each of kube-proxy's per-family proxiers does; a
// dual-stack node runs one writer per family. An IPv6 writer writes table ip6 with
// ip6 matches and ipv6_addr sets, or drives ip6tables-restore; State.ValidateFamily
// holds every address to the writer's family.
//
// NFTables writes one table of its family (ip, or ip6) with kube-proxy 1.37's nftables layout,
// object for object and name for name, so `nft list table ip kube-proxy`, existing
// runbooks and kube-proxy's own knowledge apply:
//
//   - base chains filter-prerouting-pre-dnat, filter-output-pre-dnat, filter-input,
//     filter-forward, filter-output, nat-prerouting, nat-output, nat-postrouting;
//   - the services chain dispatching through the verdict maps service-ips
//     (`ip daddr . meta l4proto . th dport vmap`) and service-nodeports;
//   - service-endpoints-check / nodeport-endpoints-check rejecting or dropping through
//     no-endpoint-services / no-endpoint-nodeports, and cluster-ips-check rejecting
//     unknown ports of known ClusterIPs;
//   - per service port a chain service-HASH-ns/name/proto/port that DNATs to one
//     endpoint, or to one of several picked by `numgen random mod K 0` rules (one per
//     endpoint, K = N, N-1, ..., 2, then an unconditional last rule); external-HASH-... for
//     NodePort, external and load-balancer traffic, which sets the masquerade mark;
//   - with session affinity, endpoint-HASH-... chains and affinity-HASH-... sets
//     (`update @set { ip saddr }`) with the affinity timeout;
//   - masquerading: the mark (0x4000 by default), and the hairpin-connections set so a
//     pod reaching itself through its service is masqueraded.
//
// One deliberate difference from kube-proxy: the endpoint is picked by that cascade
// of rules rather than by `numgen random mod N vmap { ... }`, because a packet that
// is in the nat hook while a sync commits can evaluate the old rule against the new
// set-element generation, where the old rule's anonymous map is already empty; the
// packet then escapes DNAT and cluster-ips-check rejects it. Rules with immediate
// targets keep working through the switch, so no new connection is lost.
//
// One more: with several service CIDRs, cluster-ips-check has one drop rule per CIDR
// (`ip daddr { CIDR } drop`) where kube-proxy puts them all in one anonymous set. The
// only anonymous sets the writer uses are those of LoadBalancerSourceRanges, which
// the netlink applier creates as nft does (see Load-balancer source ranges).
// NFTables.SetServiceCIDRs replaces the CIDRs as the cluster's ServiceCIDR objects
// change; the next sync, even a partial one, rewrites that chain alone.
//
// The table name is configurable (NFTablesConfig.Table), so nodekit can run beside a
// real kube-proxy without touching its table.
//
// # iptables
//
// IPTables writes kube-proxy's iptables chains (KUBE-SERVICES, KUBE-SVC-/KUBE-SEP-/
// KUBE-EXT- with kube-proxy's hash names, statistic probabilities 1/n, 1/(n-1), ...,
// comments such as `default/web cluster IP`, KUBE-MARK-MASQ, KUBE-POSTROUTING) through
// iptables-restore --noflush, with the nf_tables backend (IPTablesNFT) or the legacy
// one (IPTablesLegacy). IPTablesConfig.Prefix replaces "KUBE" so nodekit can run
// beside a real kube-proxy.
// IPTablesConfig.LocalhostNodePorts is kube-proxy's iptables.localhostNodePorts:
// NodePorts on 127.0.0.0/8 for the node itself, with the KUBE-FIREWALL drop of
// loopback-destined traffic from elsewhere; the caller sets route_localnet=1.
//
// # Read-back, drift and trace
//
// Both writers read the kernel back (ReadBack), compare it with a desired state
// (Drift: missing services, unexpected ones, stale and missing endpoints, wrong
// reject/drop verdicts) and follow a packet to its DNAT targets, REJECT or DROP
// (Trace). Partial syncs trust the writer's record of what it wrote; ForceFullSync
// makes the next Sync rewrite everything and so repairs drift.
//
// # Cleanup
//
// Cleanup removes what the writer writes, as kube-proxy's CleanupLeftovers does
// when it starts in another mode or runs with --cleanup: NFTables deletes its
// table; IPTables deletes its jump rules, top-level chains and per-service chains
// (one iptables-restore per table), leaving the kubelet's PREFIX-FIREWALL.
//
// # Sync: full, partial, atomic
//
// NFTables.Sync writes one nf_tables transaction, so it applies whole or not at all: a
// refused transaction leaves the previous rules serving and returns an error wrapping
// ErrApplyFailed that names the command the kernel refused. The first sync (and the one after a failure) is
// full: base objects are re-declared, every map and set is flushed and refilled and
// every service chain rewritten, all in the same transaction, so there is no moment
// without rules. Later syncs are partial: only service ports whose chains changed are
// rewritten, and only map and set elements that changed are added or deleted.
// Syncing the same state twice writes nothing. Chains of deleted services are
// flushed at once and deleted by the following sync, as kube-proxy does, because a
// chain just unreferenced by a map element may not be deletable in the same
// transaction on older kernels.
//
// The transaction reaches the kernel through an applier (NFTablesConfig.Applier). The
// default, NFTablesNetlink, encodes it as nf_tables netlink messages (expressions
// through github.com/google/nftables) and sends them as one nfnetlink batch from a
// socket of the calling thread's namespace: no nft process, and a partial sync reads
// nothing from the kernel. NFTablesCLI pipes the text payload to `nft -f -` instead,
// for hosts that allow the nft binary but not a process's own netlink socket; nft then
// lists the whole table before every transaction, so its partial syncs grow with the
// table. Both write the same rules: `nft list table` shows the same text whichever
// applier wrote it (TestNFTablesNetlinkMatchesCLI). The netlink applier translates the
// closed set of rules this package writes; a rule outside it is an error before
// anything is sent, never a rule silently dropped.
//
// # Dry run
//
// RenderNFTables returns the exact payload a first full sync writes, as nft input;
// NFTables.DryRun returns what the next Sync would write. Both touch nothing. The text
// and the netlink batch are made from the same commands, in the same order, so the
// text is the readable form of what the netlink applier sends. A full sync through
// netlink does not list them: it encodes each command into the batch as it is
// planned, and holds one service port's compiled rules at a time, so its peak is the
// batch and the writer's record, not also a list of every command and rule.
//
// # Conntrack
//
// UDP has no connection to break: a client that keeps its source port keeps reaching
// a removed endpoint through its conntrack entry. ConntrackCleaner.CleanStaleUDP,
// called after a sync, deletes through netlink the UDP flows to service destinations
// whose reply source is no longer an endpoint.
//
// # Concurrency and context
//
// Each writer serialises its syncs. With the netlink applier, ctx is checked before the
// batch is sent and its deadline bounds the wait for the kernel's answer (the kernel
// processes the batch during the send, so there is nothing to interrupt); with the
// nft CLI, ctx bounds the nft process and cancelling it kills nft. Either way the
// kernel applies the transaction whole or not at all.
//
// # Requirements
//
// Linux with nf_tables (kernel >= 5.13 for the layout kube-proxy uses), nft >= 1.0.1
// (NewNFTables checks it; read-back runs `nft list`) and CAP_NET_ADMIN in the network
// namespace being written. The netlink socket, or the nft process, belongs to the
// calling thread's network namespace.
package rules
