// Package netns builds a small, throw-away Kubernetes node out of Linux network
// namespaces, so tests can send real packets through real kernel rules without ever
// touching the machine's own network.
//
// # Topology
//
// New builds, for one test:
//
//	client ns                 node ns                               pod ns (x N)
//	 eth0 192.0.2.2/24 <-veth-> nk-ext 192.0.2.1/24
//	 default via 192.0.2.1      nk-br0 10.244.1.1/24 (bridge)  <-veth-> eth0 10.244.1.10+i/24
//	                            route 10.96.0.0/16 dev nk-br0            default via 10.244.1.1
//
// The node namespace plays the host: it forwards, its bridge ports have hairpin mode
// on (so a pod can reach itself through a Service), ICMP redirects are off (the
// bridge is also the pods' gateway, and redirects would teach pods to skip the NAT),
// bridged traffic passes netfilter (bridge-nf-call-iptables), and it has a route
// covering the service CIDR so traffic to a ClusterIP is routed, and therefore
// DNATed, rather than dropped. Its address on the client link, NodeIP, serves as the
// node address for NodePort tests.
//
// The client namespace stands outside the cluster: its traffic enters the node
// through nk-ext, the way external traffic enters a real node. In-cluster traffic
// comes from the pods themselves: every Namespace, pods included, hands out an HTTP
// client and UDP sockets whose sockets live in it.
//
// # Servers
//
// Each pod runs, in-process, an HTTP server on HTTPPort whose body is the pod's name
// (so a test counts which endpoint served a request) and which reports the peer
// address it saw in the X-Remote-Addr header (so a test sees masquerading), and a
// UDP server on UDPPort that answers every datagram with "<pod name> <payload>".
// Their sockets are opened inside the pod namespace; the goroutines serving them
// run anywhere, as a socket keeps the namespace it was created in.
//
// # Working inside a namespace
//
// Namespace.Do runs a function on an OS thread that is locked and switched into the
// namespace; the calling goroutine's thread is never switched. Netlink gives a
// netlink handle bound to the namespace, FD the namespace file descriptor for
// libraries that take one (for example github.com/google/nftables'
// WithNetNSFd), Path a /proc path for tools that take one (nsenter --net=PATH), and
// Start/Run start a program (nft, iptables, iptables-legacy, conntrack, the test
// binary itself) inside the namespace: the child is forked from a thread that sits in
// the namespace, so it inherits it.
//
// # Lifetime and isolation
//
// No namespace is named or bind-mounted: each lives only as long as the harness holds
// its file descriptor, so a crashed test leaves nothing behind. The machine's root
// network namespace is never entered or changed. Everything, servers included, is
// torn down through tb.Cleanup. New logs how long building the environment took.
//
// # Requirements
//
// Root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and a kernel with network namespaces, veth
// and bridge. Without them New ends the test through testenv.Unavailable: a skip on a
// casual run, a failure under CI=true.
package netns
