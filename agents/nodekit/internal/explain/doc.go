// Package explain turns what can be observed about a node or a Service into one
// plain-words diagnosis, the evidence behind it and the next command to run. It is the
// logic behind `nodekit explain node NAME` and `nodekit explain service NS/NAME`.
//
// # Two halves
//
// Gathering (GatherNode, GatherService) reads the API server and, when a node-local
// address is given, the node itself: the kubelet's /healthz, the CRI runtime's Status,
// the CNI configuration folder, kube-proxy's /healthz and the kernel's Service rules
// read back through the rules package. Diagnosing (DiagnoseNode, DiagnoseService) is a
// pure function over that evidence and an explicit "now", so every case is unit tested
// without a cluster.
//
// # Upstream behaviour the diagnosis relies on
//
// The node lifecycle controller marks a node whose Lease has not been renewed for
// node-monitor-grace-period (50s by default since v1.32) Unknown with reason
// NodeStatusUnknown and message "Kubelet stopped posting node status.", and taints it
// node.kubernetes.io/unreachable:NoExecute; pods carry a 300s default toleration, so
// eviction starts about 300s after the taint was added. A kubelet that is alive but
// finds the runtime or its network not ready reports Ready=False, reason
// KubeletNotReady, with the runtime's condition in the message ("container runtime
// network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network
// plugin returns error: cni plugin not initialized"). kube-proxy's /healthz answers 503
// once a queued change has waited longer than its health timeout, with the time of the
// last successful sync in "lastUpdated". kube-proxy's rules stay in the kernel when it
// dies: they keep steering traffic to the pod IPs of the moment it stopped.
//
// # Exit status
//
// A Diagnosis is Healthy or not; the command exits 0 only when it is.
package explain
