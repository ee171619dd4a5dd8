// Package probe runs Kubernetes liveness, readiness and startup probes
// (corev1.Probe) with the kubelet's semantics, inside or outside Kubernetes.
//
// # What it does
//
// A Prober runs one probe spec (httpGet, tcpSocket, grpc or exec) against a
// Target and returns a Result: Success, Warning, Failure or Unknown with the
// message the kubelet would show. Probe is the one-off entry point: "probe this
// spec against this address now". A Manager runs one worker per
// (pod UID, container, probe type), caches the results per container ID and
// pushes every change on its Updates channel, as the kubelet's prober manager does.
//
// # Semantics matched upstream
//
// Read from kubernetes v1.37.2 pkg/probe/{http,tcp,grpc,exec} and
// pkg/kubelet/prober; docs/probe.md has the full table.
//
//   - Defaults: timeoutSeconds 1, periodSeconds 10, successThreshold 1,
//     failureThreshold 3 (WithDefaults); Validate refuses what the API server
//     would, including successThreshold other than 1 on liveness and startup probes.
//   - httpGet: GET with User-Agent kube-probe/1.37 and Accept */* unless set (an
//     empty Accept removes it), a Host header sets the request host, TLS not
//     verified, no keep-alives, no proxy, no compression, SO_LINGER 1 s, at most
//     10 KiB of body read, 200-399 healthy and a final 3xx a Warning; redirects
//     followed on the same host up to 10 requests, a redirect to another host is not
//     followed (Warning). Failure messages never include the body.
//   - tcpSocket: a connect within the timeout is Success.
//   - grpc: grpc.health.v1.Health/Check on Target.Host; SERVING is Success.
//   - exec: through an Execer shaped like CRI ExecSync; exit 0 is Success, a
//     timeout (ErrExecTimeout) Failure, any other error Unknown. $(VAR) references
//     are expanded from the container's static env like the kubelet's.
//   - An attempt that returns an error is retried, 3 attempts in all; a Failure is not.
//
// # How probes are made
//
// To cost a fraction of the kubelet's allocations per probe, plain-http
// httpGet probes speak HTTP/1.1 directly on the socket (http.ReadResponse for
// the reply, http.Client's redirect rules reproduced) and IP literals are
// connected without net.Dialer; requests, results and messages are the
// kubelet's (upstream/probe compares them). https hops and h2c go through
// net/http. grpc probes go through grpc-go exactly as the kubelet's do (a
// ClientConn per probe, a blocking wait for READY, then Check): a hand-written
// HTTP/2 client was cheaper but gave other verdicts for misbehaving servers.
// docs/probe.md has the details and figures.
//
// # Manager timing rules
//
// Initial results: readiness Failure, liveness Success, startup Unknown. The
// first probe of a worker waits a random part of its period when the manager
// started less than a period ago. initialDelaySeconds counts from the container's
// StartedAt. Liveness and readiness wait until the container is Started; the
// startup worker idles after that. Results flip after successThreshold or
// failureThreshold identical results in a row; a liveness failure or any final
// startup result holds the worker until a new container ID appears. A pod being
// deleted gets liveness and startup Success and those workers stop. Errors are
// thrown away. One deliberate difference: ticks are aligned on a 100 ms grid
// (Config.Coalesce) so thousands of workers wake in batches; periods stay exact.
//
// # Concurrency and cancellation
//
// Prober and Manager are safe for concurrent use. Every probe is bounded by its
// timeoutSeconds and by the context: cancelling it ends in-flight probes.
// Manager.Run returns when its context ends, after all workers stopped and
// removed their results. Updates must be drained: like the kubelet, workers
// block while the channel is full.
//
// # Requirements
//
// No root. The direct dial of IP literals is Linux-only (elsewhere probes dial
// through net.Dialer); SO_LINGER is set as the kubelet does; OSExecer uses
// process groups (Unix).
package probe
