// Package stats builds the data behind the reference kubelet's /stats/summary and
// /metrics/resource endpoints: the stats/v1alpha1 Summary of k8s.io/kubelet, from
// the container runtime's CRI stats and the node's /proc and root cgroup, without
// cAdvisor.
//
// # Use
//
// New(Config) validates the configuration and returns a Provider. Its
// SummaryHandler and ResourceMetricsHandler are plain http.Handlers that the
// kubelet server mounts, behind its authentication and authorization, at
// /stats/summary and /metrics/resource. Summary and CPUAndMemory return the same
// data to Go callers. CRIRuntime adapts a *cri.Client to the Runtime interface.
//
// # What matches upstream
//
//   - /stats/summary answers GET and POST with the Summary as JSON indented by one
//     space (go-restful's pretty printing), Content-Type application/json. The query
//     only_cpu_and_memory=true, given exactly once, trims it to the node's and
//     pods' CPU, memory and swap, as GetCPUAndMemoryStats does. Failures are 500
//     with the body "Internal Error: <cause>".
//   - /metrics/resource registers a stable collector on its own component-base
//     KubeRegistry, with the descriptors of pkg/kubelet/metrics/collectors
//     (names, help, labels container/pod/namespace, STABLE or ALPHA), so the text
//     carries the same "[STABLE]" help prefixes and the same sample timestamps: the
//     CPU, memory or swap time of each figure, none on container_start_time_seconds
//     and resource_scrape_error. scrape_error, deprecated in 1.29 and hidden by
//     component-base since 1.30, is not served, as a 1.37 kubelet does not.
//   - Node: CPU is the root cgroup's cpuacct.usage (v1) or cpu.stat usage_usec
//     (v2); memory usage is memory.usage_in_bytes (v1) or MemTotal-MemFree (v2,
//     whose root cgroup has no memory.current), and workingSetBytes is usage minus
//     inactive file pages, floored at zero, as cAdvisor computes it; availableBytes
//     is MemTotal minus the working set. fs is statfs of Config.RootDir; runtime
//     imageFs (and containerFs, the same file system) is ImageFsInfo's usage with
//     statfs of its mount point; rlimit is pid_max and the process count; network
//     is the agent's own namespace's /proc/net/dev without lo, veth* and docker*,
//     eth0 at the top level; swap is SwapTotal-SwapFree.
//   - Pods: one per pod UID, its ready sandboxes (or its newest one), with the
//     running containers only; podRef from the io.kubernetes.pod.{name,namespace,uid}
//     labels, startTime the sandbox's and each container's creation time.
//     Containers carry the runtime's CPU, memory, swap and writable layer, and
//     logs: the allocated blocks and count of the files directly in
//     <PodLogsDir>/<ns>_<name>_<uid>/<container>, against the root file system's
//     capacity (no logs stats without that folder). ephemeral-storage sums the
//     writable layers, the container logs and the files directly in the pod's log
//     folder.
//   - Swap: the runtime's per container; runtimes that report none (containerd
//     1.6) get zero on a node without swap, where it is the truth, as a kubelet
//     reads it from cAdvisor, and nothing on a node with swap. Pod swap is the sum
//     of its containers'.
//   - usageNanoCores, when the runtime does not compute it, is the rate between the
//     previous sample of the same container, pod or node and this one.
//
// # Where it differs
//
// Pod CPU, memory, network and process count come from ListPodSandboxStats. When
// that call fails the pod's CPU, memory and swap are summed from its containers
// (upstream falls back only on Unimplemented, to cAdvisor's pod cgroup): containerd
// 1.6, as on this project's machines, fails the whole call with "cgroupPath is
// empty" as soon as one sandbox has no cgroup parent. Volumes, accelerators, PSI,
// systemContainers and per-pod network in that fallback are not reported.
// usageNanoCores is updated by every request (the kubelet updates it from its
// eviction loop), so two scrapes close together give a rate over a short window.
//
// # Concurrency and cancellation
//
// A Provider is safe for concurrent use. Summary requests run in parallel; the
// CPU samples behind usageNanoCores are guarded by a mutex. /metrics/resource
// scrapes run one at a time because the collector interface has no context: the
// handler hands the request's context to the collector for the duration of the
// scrape. Cancelling the request's context cancels the CRI calls in flight.
//
// # Requirements
//
// Linux. Reading the root cgroup and /proc needs no privileges; the runtime's
// socket usually needs root.
package stats
