// Package cri is a client for the Container Runtime Interface (CRI runtime/v1), the
// gRPC API the kubelet uses to drive containerd and CRI-O, with what node agents need
// on top of the raw calls.
//
// # Connecting
//
// New dials a runtime given as unix:///path or /path, or discovers one among
// DefaultEndpoints (containerd, CRI-O, cri-dockerd, in crictl's order) when
// Config.Endpoint is empty. It checks the socket exists (a missing socket fails at
// once with ErrUnavailable) and calls Version, so a client that exists talks to a CRI
// v1 runtime (one that answers Unimplemented fails with ErrNotSupported). NewWithConn
// takes a ready *grpc.ClientConn, for in-process servers over bufconn or a connection
// shared with other clients. Messages may be up to 16 MiB, as the kubelet allows.
//
// # Timeouts
//
// Every call runs under Config.CallTimeout (default 2 minutes, the kubelet's
// --runtime-request-timeout) and the caller's ctx, whichever ends first; the deadline
// travels to the runtime (grpc-timeout), as the kubelet's does. A caller's deadline
// that comes first is used as is. Like the
// kubelet, RunPodSandbox gets twice the timeout, StopContainer and ExecSync get their
// own grace or timeout on top, and PullImage is bounded by ctx alone.
//
// # Errors
//
// Failed calls return *Error, which names the call and the object ("cri
// RunPodSandbox pod \"default/web\": ..."), wraps a sentinel (ErrNotFound,
// ErrNotSupported, ErrUnavailable, ErrTimeout) for errors.Is, and keeps the runtime's
// gRPC status for status.Code and status.FromError.
//
// # Restarts
//
// The connection reconnects by itself with the kubelet's backoff (100 ms growing to
// 3 s). While the runtime is down calls fail fast with ErrUnavailable, and each such
// failure resets the backoff so the next call tries at once; WaitReady blocks until the
// runtime answers again. Containers keep running while containerd restarts, and the
// same Client sees them afterwards.
//
// # Pods the kubelet's way
//
// PodSandboxConfig and ContainerConfig turn a corev1.Pod into the configs the kubelet
// sends, with its labels (io.kubernetes.pod.name, .namespace, .uid,
// io.kubernetes.container.name) and annotations (container hash, restart count,
// termination message settings, grace periods, preStop handler, ports), log paths
// (/var/log/pods/<ns>_<name>_<uid>/<container>/<restart>.log), hostname and Linux
// namespaces. crictl pods and crictl ps therefore show nodekit's pods exactly as a
// kubelet's. ContainerConfig also computes the container's cgroup settings as the
// kubelet does (cpu.shares from the CPU request, a CFS quota from the CPU limit over
// a 100 ms period, the memory limit) and maps literal env, command, args, working dir
// and the basic security context. Volumes, devices, the OOM score, DNS policy and env
// values from the API are the caller's to resolve.
//
// # Node readiness
//
// Readiness (and ReadinessFromStatus) turns the runtime's Status conditions into the
// verdict the kubelet writes on the node's Ready condition, in its exact words, e.g.
// "container runtime network not ready: NetworkReady=false
// reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not
// initialized".
//
// # Probes
//
// ExecSync has the shape exec probes need: stdout, stderr and the exit code with a nil
// error for any exit code, ErrTimeout when the command outlives its timeout, any other
// error when it could not run.
//
// # Testing
//
// Package cri/fakeruntime serves the real CRI gRPC API from memory, with state, call
// recording and injected errors and delays; point a Client (or any CRI client) at it.
//
// # Concurrency and cancellation
//
// A Client is safe for concurrent use. Cancelling ctx ends the call in flight with
// ErrTimeout (deadline) or a Canceled status; the runtime may still finish the
// operation. Close releases the connection New opened.
package cri
