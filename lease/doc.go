// Package lease keeps a coordination.k8s.io/v1 Lease renewed the way the kubelet
// renews its node heartbeat, and reads leases the way the node lifecycle controller
// does. It serves the node lease (NodeConfig) and any lease of your own agent.
//
// # What it does
//
// A Controller owns one Lease, namespace/name, and writes spec.holderIdentity,
// spec.leaseDurationSeconds and spec.renewTime (and, optionally, one owner
// reference) every renew interval until its context ends. Anyone reading the lease
// sees the holder alive while renewTime keeps moving. For a node this is what keeps
// the Node Ready: when the kubelet stops renewing kube-node-lease/<node> for the
// node-monitor-grace-period, kube-controller-manager sets the Node's Ready
// condition to Unknown (reason NodeStatusUnknown) and taints it
// node.kubernetes.io/unreachable. docs/lease.md tells the whole story.
//
// The reader side has Expiry and Fresh (renewTime + duration against a clock) and a
// Watcher that reports leases going stale and coming back, judged with the node
// lifecycle controller's rule.
//
// # Semantics matched upstream
//
// The algorithm is k8s.io/component-helpers/apimachinery/lease (v0.37.2) as wired
// by the kubelet (pkg/kubelet/kubelet.go, pkg/kubelet/util/nodelease.go):
//
//   - Each round starts a jittered interval after the previous round finished:
//     RenewInterval (default 25% of the 40s duration, so 10s) plus up to 4%.
//     The first round starts at once.
//   - Steady state: Update from the copy cached at the last write, with no GET. An
//     Update is tried up to 5 times. A Conflict (someone else wrote the lease) reads
//     the lease again and continues with the fresh copy; any other failure retries
//     the same copy. From the second failed try of a round on, OnRepeatedFailure is
//     called (not for Conflicts).
//   - When the cached copy cannot be written, or at start, the lease is read with a
//     GET and created on NotFound. A failed GET or Create is retried forever,
//     waiting 200ms, 400ms, 800ms, ... doubling to a 7s cap, until the context ends.
//     A lease that was read (not created) is then updated, again up to 5 tries.
//   - The owner reference (NodeOwner: {v1, Node, name, uid}) is looked up before each
//     write while the lease has none. If the lookup fails, that write is skipped: a
//     missing lease is not created, and an existing lease without an owner is not
//     renewed; the next round tries again. So a node lease appears only once its
//     Node is registered, and a lease written earlier without an owner gets one on
//     the first renew after the Node exists. (Older kubelets created the lease
//     without an owner and added it later; v1.37 does not write it at all.)
//
// Not carried over: the upstream controller's Start/Stop pair, which deletes the
// lease (used for kube-apiserver identity leases, not by the kubelet). Run returns
// as soon as its context ends, also in the middle of a round's retries.
//
// # Timing
//
//	what                               default              set by
//	lease duration                     40s                  Config.Duration
//	renew interval                     10s, +0..4% jitter   Config.RenewInterval (0.25 x duration)
//	Updates per round                  up to 5              MaxUpdateTries
//	GET/Create retry waits             200ms doubling, 7s   InitialBackoff, MaxBackoff
//	requests per round, steady state   1 Update, 0 GET
//	requests after a Conflict          Update, GET, Update
//	node-monitor-period (reader)       5s                   WatcherConfig.MonitorPeriod
//	node-monitor-grace-period          50s (40s < v1.32)    WatcherConfig.GracePeriod
//	Node Ready -> Unknown              grace .. grace + monitor period after the last renewal seen
//	pods evicted                       about 300s later     default unreachable:NoExecute toleration
//
// # Clock skew
//
// renewTime is the holder's clock. Fresh compares it with the reader's clock, so
// the verdict is off by the skew between the two machines. The Watcher, like the
// node lifecycle controller, never compares renewTime with its own clock: it notes
// when it saw renewTime change and measures the silence with its own clock.
//
// # Concurrency and cancelling
//
// A Controller or Watcher is used by one Run at a time (a second concurrent Run
// returns ErrAlreadyRunning). Run blocks until its context ends, then returns nil
// with no goroutine or timer left behind; a Watcher stops and waits for its
// informer first. Every wait goes through Config.Clock, so tests drive time with
// k8s.io/utils/clock/testing. Logs go to logr.FromContextOrDiscard(ctx): state
// changes at V(0), each renewal at V(4). Metrics are reported through the Metrics
// interface.
//
// # Permissions
//
// No root and no Linux specifics. The identity needs get, create and update on its
// lease (and get on its Node for NodeOwner). A node's own credentials
// (system:node:<name>) have exactly that for kube-node-lease/<name> under the Node
// authorizer and NodeRestriction admission, and are refused another node's lease.
// A Watcher needs list and watch on leases in its namespace.
package lease
