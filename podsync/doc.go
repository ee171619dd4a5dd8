// Package podsync is the kubelet's pod lifecycle core as a library: given a Pod
// and the container runtime's view of it, decide what to create, start, kill or
// wait for next, do it through CRI, and compute the pod status the kubelet would
// write. It is what pkg/kubelet/kuberuntime, pkg/kubelet/lifecycle and the status
// parts of pkg/kubelet do, without the rest of the kubelet.
//
// # What it does
//
// LoadView reads a pod's sandboxes and containers from a Runtime (found by their
// io.kubernetes.pod.uid label). ComputeActions, a pure function, decides the next
// step as the kubelet's computePodActions does. A Syncer executes it: SyncPod
// creates the sandbox, pulls images, starts init containers in order, sidecars
// (restartPolicy Always init containers) and app containers, runs postStart hooks
// and honours the restart back-off; KillPod runs preStop hooks and stops
// containers within the grace period, then the sandbox. PodStatus, also pure,
// computes phase, conditions and container statuses as generateAPIPodStatus does.
//
// The package talks to the runtime only through the Runtime interface, whose
// methods are those of nodekit's cri.Client, and gets its configs from a
// ConfigBuilder the agent supplies; it never imports the agent or other nodekit
// packages. Package podsynctest has an in-memory Runtime for unit tests.
//
// # Semantics matched upstream
//
// Read from kubernetes v1.37.2 pkg/kubelet/kuberuntime, pkg/kubelet/kubelet_pods.go,
// pkg/kubelet/status/generate.go, pkg/kubelet/images and pkg/kubelet/lifecycle;
// docs/podsync.md has the details.
//
// # Concurrency and cancellation
//
// A Syncer is safe for concurrent use across pods; calls for one pod must not
// overlap. Cancelling ctx stops a sync between runtime calls and ends the call in
// flight; the runtime may still finish that call.
package podsync
