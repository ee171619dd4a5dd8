// Package podsync is the kubelet's pod lifecycle core as a library: given a Pod
// and the container runtime's view of it, decide what to create, start, kill or
// wait for next, do it through CRI, and compute the pod status the kubelet
// would write. It is what pkg/kubelet/kuberuntime, pkg/kubelet/images,
// pkg/kubelet/lifecycle and the status code of pkg/kubelet do, without the rest
// of the kubelet: no API client, no volumes, no pod workers.
//
// # What it does
//
// LoadView reads a pod's sandboxes and containers from a Runtime, found by
// their io.kubernetes.pod.uid label, newest first. ComputeActions, a pure
// function, decides the next step as the kubelet's computePodActions does.
// A Syncer executes it: SyncPod creates the sandbox, pulls images, starts init
// containers one at a time, sidecars (restartPolicy Always init containers)
// and app containers, and ephemeral containers (once, never restarted, in the
// PID namespace of their targetContainerName), runs postStart hooks and
// honours the restart back-off;
// KillPod runs preStop hooks and stops containers within the grace period
// (app containers first, sidecars after them in reverse order), then the
// sandboxes; RemovePod deletes what is left. PodStatus, also pure, computes
// phase, conditions and container statuses as generateAPIPodStatus does, and
// Syncer.PodStatus adds the start failures SyncPod recorded (the kubelet's
// reason cache), so kubectl shows CrashLoopBackOff, ErrImagePull or
// CreateContainerConfigError with the kubelet's messages.
//
// # What the caller supplies
//
// A Runtime (a *cri.Client satisfies it as it is; podsynctest.Runtime is an
// in-memory one), a ConfigBuilder that turns the pod into CRI configs (the
// agent's, with its environment, mounts and DNS), and optionally an
// EventRecorder (client-go's record.EventRecorder fits), ProbeResults from a
// prober, Credentials for image pulls and an HTTPDoer for httpGet hooks that
// must dial inside a node network namespace. The package imports no other
// nodekit package.
//
// # Semantics matched upstream
//
// Read from kubernetes v1.37.2 (the module source, default feature gates)
// pkg/kubelet/kuberuntime (computePodActions,
// computeInitContainerActions, SyncPod, startContainer, killContainer,
// killPodWithSyncResult, doBackOff), pkg/kubelet/images (EnsureImageExists),
// pkg/kubelet/lifecycle (handlers), pkg/kubelet/kubelet_pods.go
// (generateAPIPodStatus, convertToAPIContainerStatuses, getPhase),
// pkg/kubelet/status/generate.go and the prober manager's started/ready rules.
// docs/podsync.md lists them with the tests that check each.
//
//   - Restart back-off: 10s doubling to 300s per container (key: FNV-64a of
//     pod name, namespace, UID, container name, image and resources), counted from the last
//     exit, forgotten 10 minutes after the last failure. Image pull back-off:
//     the same bounds, keyed by pod UID and image.
//   - Grace: deletionGracePeriodSeconds, else a liveness or startup probe's
//     terminationGracePeriodSeconds for kills caused by that probe, else the
//     pod's terminationGracePeriodSeconds; preStop hooks eat into it; the
//     runtime always gets at least 2s.
//   - Events carry the kubelet's reasons and messages: Pulling, Pulled,
//     Failed ("Error: ErrImagePull"), BackOff, Created ("Container created"),
//     Started ("Container started"), Killing, SandboxChanged,
//     FailedCreatePodSandBox, FailedPostStartHook, FailedPreStopHook,
//     DeadlineExceeded; container events are about the container's object
//     reference (fieldPath spec.containers{app}), as the kubelet's.
//   - Image volumes (getImageVolumes, toKubeContainerImageVolumes): before
//     any container starts, each volume's image is made present with the
//     volume's pullPolicy through the same pull code (back-off, credentials,
//     events about the pod itself); a container mounting a volume whose pull
//     failed gets "Error: ErrImagePull" and that waiting reason, the others
//     start. The ConfigBuilder's CRI mounts naming the volume's reference in
//     Image.UserSpecifiedImage (volume.Manager.Mounts makes them so) get the
//     pulled image's spec before CreateContainer.
//   - Restarts follow the pod's restartPolicy and, since ContainerRestartRules
//     is on by default, each container's restartPolicy and restartPolicyRules.
//   - upstream/podsync checks the hash, back-off key, restart rules, reason
//     words, event references, conditions and hook requests against the
//     kubelet's own code.
//
// # Clocks
//
// Back-offs, grace periods, sleep hooks and the active deadline use
// Config.Clock, so tests drive them with k8s.io/utils/clock/testing.
//
// # Concurrency and cancellation
//
// A Syncer is safe for concurrent use across pods; calls for one pod must not
// overlap (the kubelet's pod workers serialize them). Cancelling ctx stops a
// sync between runtime calls and ends the call in flight; the runtime may still
// finish that call. A preStop hook that outlives the grace period is left
// running until it ends or ctx is cancelled, as the kubelet leaves it.
//
// # Errors
//
// Failures wrap a sentinel whose text is the kubelet's reason word
// (ErrCrashLoopBackOff is "CrashLoopBackOff"), name the container and pod at
// fault, and carry the waiting message (Reason and Message extract them). One
// container's failure does not stop the others from starting.
package podsync
