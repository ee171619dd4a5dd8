// Package staticpod reads static pod manifests from a folder the way the kubelet
// does, watches the folder, and keeps the matching mirror pods on the API server.
//
// Static pods are how a kubeadm control plane starts itself: the kubelet runs the
// manifests in its staticPodPath (unset by default; kubeadm sets
// /etc/kubernetes/manifests) before any API server exists, then posts a read-only
// "mirror pod" for each so they show up in kubectl. A typo in one of those files is a
// classic outage; this package's job is to make such a typo loud, precise and
// harmless to the other pods.
//
// # Loading
//
// Load reads a folder once; LoadFile and ParseManifest handle one file. The rules
// match the kubelet's file source (k8s.io/kubernetes/pkg/kubelet/config, v1.37):
//
//   - entries whose names start with a dot are skipped, subfolders are skipped
//     without recursion, files are read in sorted order; by default
//     (IgnoreEditorFiles) editor leftovers such as "etcd.yaml~" are skipped too,
//     where the kubelet would try to run them (KubeletIgnore restores its rule);
//   - a file must be a regular file under 10 MiB (MaxManifestSize) holding exactly
//     one YAML or JSON document of apiVersion v1, kind Pod. The kubelet's file source
//     reads no PodList (only its HTTP source does), and neither does this package;
//   - decoding is strict: unknown fields, values of the wrong type and repeated keys
//     are errors carrying file, line, column and field path
//     ("etcd.yaml:8:5: spec.containers[0].imagee: unknown field ..."). The kubelet
//     silently drops unknown fields and silently ignores every YAML document after
//     the first; both hide typos, so nodekit refuses them;
//   - a pod needs a name ("invalid pod: name is needed for the pod"); then the
//     kubelet's defaults apply (ApplyDefaults): API field defaults, the UID, name
//     "<name>-<lowercased node name>", namespace "default", spec.nodeName, a
//     NoExecute "Exists" toleration, phase Pending, and the annotations
//     kubernetes.io/config.hash (= UID), kubernetes.io/config.source ("file") and
//     kubernetes.io/config.seen (first time seen, RFC 3339 with nanoseconds);
//   - the pod is validated (Validate; the scope is listed there) and refused if it
//     references API objects: "static pods may not reference secrets", ...; like the
//     kubelet, a node name with capitals fails validation for every pod (the name
//     suffix is lowercased, spec.nodeName is not);
//   - like the kubelet's, the returned pods have empty apiVersion and kind;
//   - when two files define the same namespace/name, the first in sorted order wins
//     and the other is reported (ErrDuplicateName), as the kubelet does.
//
// Config.Dir must be a folder: the kubelet also accepts a single manifest file as its
// staticPodPath, which this package does not support (Load returns an error).
//
// One bad file never stops the others. Every per-file problem is a *ManifestError
// that matches ErrInvalidManifest and a specific sentinel through errors.Is.
//
// # UID and config.hash
//
// A manifest without metadata.uid gets the FNV-128a hash of the defaulted pod,
// the node name and the file path (ManifestUID). The kubelet hashes the same inputs
// but over a debug dump of its internal API type, which cannot be reproduced without
// importing k8s.io/kubernetes; nodekit hashes the pod's canonical JSON instead. The
// UID is therefore stable and deterministic (same manifest, node and path, same UID,
// on every run and machine), changes whenever the content changes, and ignores
// whether a default is written out or left implicit, but it is not byte-equal to the
// kubelet's UID for the same file. The nested module upstream/staticpod measures this.
//
// # Watching
//
// A Watcher (New, Run, Events) keeps the set current from inotify events on the
// folder (github.com/fsnotify/fsnotify), a full rescan every RescanPeriod (20s, like
// the kubelet's fileCheckFrequency) for what inotify cannot see, and a retry every
// second while the folder does not exist. Run first emits EventSync with the whole
// set, then EventAdd, EventUpdate, EventRemove and EventError; every event also
// carries the whole set after the change.
//
// Writers that produce a file in several steps (truncate then write, or rename the
// old file away then write the new one) are tolerated: a file that fails to load
// right after an inotify event gets DefaultSettleDelay (100ms) to become valid before
// it counts as broken, so an in-place save causes one EventUpdate and no error.
// Atomic renames, symlinked manifests, a projected ConfigMap's "..data" swap, a
// folder that is created, deleted or recreated later are all handled.
//
// # Broken manifests: KeepLastGood versus the kubelet
//
// When a manifest that used to load becomes broken, the kubelet treats it as gone
// and kills the pod: an apiserver manifest saved with a typo takes the control plane
// down. nodekit's default, KeepLastGood, keeps the last version that loaded in the
// set and reports an EventError (KeptLastGood true) that the caller logs and counts;
// fixing the file produces an EventUpdate. Config.OnBroken = DropBroken gives the
// kubelet's behaviour: EventRemove, then EventError. Either way the error is
// reported once per distinct problem, not on every rescan. The last good version
// lives in memory only: after a restart a broken file loads nothing.
//
// # Mirror pods
//
// MirrorPod builds the mirror pod (annotation kubernetes.io/config.mirror = hash, a
// controller owner reference to the Node). A Reconciler, given a client that acts as
// the node (system:node:<name> in group system:nodes, judged by the Node authorizer
// and the NodeRestriction admission plugin), creates missing mirror pods, replaces
// ones whose hash differs by deleting with a UID precondition and creating again
// (mirror pods are never patched), deletes orphans, and treats AlreadyExists with
// the same hash as success. Reconciler.Run follows a Watcher's events. Each pass
// reads the Node and the node's pods from the API server (a GET and a LIST), unless
// ReconcilerConfig.Cache answers them from informers the caller keeps anyway, as
// nodekit's kubelet does; a cache that lags costs a request, never the outcome.
//
// # Concurrency and cancellation
//
// Load, Decode and the other functions are safe for concurrent use. A Watcher's Run
// may be called once; it owns all state in one goroutine, returns nil when its
// context ends, and then closes Events. Run blocks while Events is full, so keep
// reading. Pods returned by the watcher are shared: treat them as read-only.
// Reconciler.Sync may run concurrently with itself only for different nodes.
//
// # Requirements
//
// Linux (inotify). No root needed, except to read a root-owned manifest folder.
package staticpod
