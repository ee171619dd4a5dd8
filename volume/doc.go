// Package volume materializes a pod's volumes on the node the way the kubelet's
// volume plugins do, and turns a container's volumeMounts into CRI mounts.
//
// # What it does
//
// A Manager is made once per node with New(Config). Setup(ctx, pod) creates every
// volume of the pod under
//
//	<RootDir>/pods/<pod UID>/volumes/kubernetes.io~<plugin>/<volume name>
//
// with the kubelet's plugin names (empty-dir, configmap, secret, downward-api,
// projected; hostPath volumes are the host's own path and image volumes the
// runtime's to mount, so neither gets a folder).
// Mounts(pod, container) returns the runtimeapi.Mount list for CreateContainer,
// and Teardown(ctx, podUID) unmounts and removes everything Setup made.
// PodsOnDisk lists the pods that have folders, for an agent that restarts and
// must clean up after pods that went away meanwhile.
//
// Supported volume types:
//
//	emptyDir       a folder on disk; medium Memory is a tmpfs (sizeLimit honoured)
//	hostPath       the host path, after the type check (DirectoryOrCreate, Directory,
//	               FileOrCreate, File, Socket, CharDevice, BlockDevice)
//	configMap      items, defaultMode (0644), per-item mode, optional
//	secret         as configMap, on a tmpfs like the kubelet's
//	downwardAPI    metadata fields and resourceFieldRef, items, modes
//	projected      serviceAccountToken, configMap, secret, downwardAPI, clusterTrustBundle
//	               (through Config.TrustAnchors), podCertificate (through
//	               Config.PodCertificates)
//	image          nothing on disk: Mounts gives a CRI mount with an Image spec and
//	               ImageSubPath, always read-only (pulling the image is the agent's)
//
// Any other type makes Setup fail for that volume with an error wrapping
// ErrUnsupportedVolume that names the volume and its type; the pod's other volumes
// are still set up.
//
// # Semantics matched upstream
//
// Files of configMap, secret, downwardAPI and projected volumes are written by an
// atomic writer like pkg/volume/util/atomic_writer.go: the payload goes into a
// fresh hidden folder `..<timestamp>`, the symlink `..data` is swapped to it with a
// rename, and each top-level name in the volume is a symlink through `..data`. A
// reader therefore sees the whole old payload or the whole new one, never a mix,
// and a container watching the folder sees the same events as under a kubelet.
// Setup on a pod already set up refreshes these volumes (a changed ConfigMap
// reaches the files) and rotates service account tokens the way
// pkg/kubelet/token does: a token is requested again once 80% of its TTL has
// passed or it is older than 24 hours. clusterTrustBundle sources are answered
// as pkg/kubelet/clustertrustbundle does (see ClusterTrustBundles): the
// certificates of the matching bundles, each once, in random order. Errors read like the kubelet's FailedMount
// events: `MountVolume.SetUp failed for volume "v" : configmap "x" not found`.
//
// subPath and subPathExpr are resolved inside the volume without following a
// symlink out of it and without `..`, as pkg/volume/util/subpath checks; a
// missing subPath is created as a folder. Mounts of configMap, secret,
// downwardAPI and projected volumes are always read-only, as upstream's.
//
// # Concurrency and cancellation
//
// A Manager is safe for concurrent use; calls for the same pod are serialized.
// ctx is passed to every Sources call.
//
// # Linux and root
//
// Memory-medium emptyDir and secret/projected volumes mount tmpfs, which needs
// root (CAP_SYS_ADMIN). Config.Mounter replaces the mount calls, for tests or for
// agents that cannot mount (NoMount writes to disk instead).
package volume
