package staticpod

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
)

// MaxManifestSize is the kubelet's cap on one manifest file: a file of this size or
// larger is refused.
const MaxManifestSize = 10 << 20

// DefaultRescanPeriod is the kubelet's default fileCheckFrequency.
const DefaultRescanPeriod = 20 * time.Second

// BrokenPolicy says what happens to a running static pod when its manifest turns bad.
type BrokenPolicy int

const (
	// KeepLastGood (the default) keeps the last version that loaded while the file is
	// broken, and reports the error as an EventError. Fixing the file updates the pod.
	KeepLastGood BrokenPolicy = iota
	// DropBroken is the kubelet's behaviour: a manifest that no longer loads is treated
	// as gone, so its pod is removed (EventRemove) as well as reported (EventError).
	DropBroken
)

// Config configures Load and New. Dir and NodeName are required.
type Config struct {
	// Dir is the manifest folder (the kubelet's staticPodPath, /etc/kubernetes/manifests
	// under kubeadm). It need not exist yet: a missing folder is an empty set.
	Dir string
	// NodeName is the node the pods run on; it suffixes pod names and sets spec.nodeName.
	NodeName string
	// Clock drives config.seen, the rescan ticker and watch retries. Default: real clock.
	Clock clock.WithTicker
	// RescanPeriod is how often the whole folder is re-read besides inotify.
	// Default DefaultRescanPeriod (20s).
	RescanPeriod time.Duration
	// OnBroken chooses what a broken manifest does to its running pod. Default KeepLastGood.
	OnBroken BrokenPolicy
	// Ignore reports whether a file name (not path) in Dir is skipped. Default
	// IgnoreEditorFiles. KubeletIgnore skips exactly what the kubelet skips (dotfiles).
	Ignore func(name string) bool
	// SettleDelay is how long a file that fails to load right after an inotify event
	// may take to become valid before it is reported as broken (writers truncate,
	// then write). Default DefaultSettleDelay (100ms); negative reports at once.
	SettleDelay time.Duration
	// Metrics receives counters and timings. Default: no-op.
	Metrics Metrics
}

// KubeletIgnore skips what the kubelet skips: names starting with a dot.
func KubeletIgnore(name string) bool { return strings.HasPrefix(name, ".") }

// IgnoreEditorFiles skips dotfiles (the kubelet's rule, which already covers vim's
// .name.swp and the ..data links of a projected ConfigMap) and, beyond the kubelet,
// editor leftovers that would otherwise be loaded as duplicate or broken pods:
// backups ending in "~", emacs autosaves (#name#), vim's write probe "4913", and
// names ending in .swp, .swx, .tmp, .bak, .orig, .rej, .dpkg-*, .rpmnew, .rpmsave.
func IgnoreEditorFiles(name string) bool {
	if KubeletIgnore(name) || strings.HasSuffix(name, "~") || name == "4913" ||
		(strings.HasPrefix(name, "#") && strings.HasSuffix(name, "#")) {
		return true
	}
	for _, suffix := range []string{".swp", ".swx", ".tmp", ".bak", ".orig", ".rej", ".rpmnew", ".rpmsave"} {
		if strings.HasSuffix(name, suffix) {
			return true
		}
	}
	return strings.Contains(name, ".dpkg-")
}

func (c *Config) withDefaults() (Config, error) {
	out := *c
	if out.Dir == "" {
		return out, fmt.Errorf("%w: Dir is required", ErrInvalidConfig)
	}
	if out.NodeName == "" {
		return out, fmt.Errorf("%w: NodeName is required", ErrInvalidConfig)
	}
	if out.RescanPeriod < 0 {
		return out, fmt.Errorf("%w: RescanPeriod %v is negative", ErrInvalidConfig, out.RescanPeriod)
	}
	if out.OnBroken != KeepLastGood && out.OnBroken != DropBroken {
		return out, fmt.Errorf("%w: unknown OnBroken policy %d", ErrInvalidConfig, out.OnBroken)
	}
	out.Dir = filepath.Clean(out.Dir)
	if out.Clock == nil {
		out.Clock = clock.RealClock{}
	}
	if out.RescanPeriod == 0 {
		out.RescanPeriod = DefaultRescanPeriod
	}
	if out.Ignore == nil {
		out.Ignore = IgnoreEditorFiles
	}
	if out.SettleDelay == 0 {
		out.SettleDelay = DefaultSettleDelay
	}
	if out.Metrics == nil {
		out.Metrics = noopMetrics{}
	}
	return out, nil
}

// Snapshot is the result of loading a folder once.
type Snapshot struct {
	// Pods are the pods that load, in the sorted order of their files. Each carries
	// config.source and config.seen.
	Pods []*corev1.Pod
	// Paths[i] is the file Pods[i] came from.
	Paths []string
	// Errors lists the files that did not load, one *ManifestError each, sorted by path.
	Errors []*ManifestError
}

// Load reads the folder once with the kubelet's rules: entries whose names start with
// a dot (and, by default, editor leftovers) are skipped, subfolders are skipped
// without recursion, files are read in sorted order, each must be a regular file under
// 10 MiB holding one v1 Pod. Every file is decoded strictly (Decode), defaulted
// (ApplyDefaults) and validated (Validate); a bad file lands in Errors and never
// stops the others. Two files defining the same namespace/name: the first wins.
// A missing folder gives an empty Snapshot and no error; any other failure to list
// the folder is returned.
func Load(ctx context.Context, cfg Config) (*Snapshot, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := newScanner(c)
	if err := s.scanAll(ctx); err != nil {
		return nil, err
	}
	snap := &Snapshot{}
	for _, e := range s.effective() {
		snap.Pods = append(snap.Pods, e.pod)
		snap.Paths = append(snap.Paths, e.path)
	}
	for _, p := range s.sortedPaths() {
		if st := s.files[p]; st.err != nil {
			snap.Errors = append(snap.Errors, st.err)
		}
	}
	return snap, nil
}

// LoadFile reads, decodes, defaults and validates one manifest file. config.source is
// set; config.seen is left to the caller. Errors are *ManifestError.
func LoadFile(path, nodeName string) (*corev1.Pod, error) {
	pod, _, err := loadFile(path, nodeName)
	if err != nil {
		return nil, err
	}
	return pod, nil
}

// ParseManifest runs the whole per-file pipeline on bytes already read: Decode,
// the name check, ApplyDefaults, Validate, and config.source. path names the file in
// errors and feeds the UID.
func ParseManifest(path string, data []byte, nodeName string) (*corev1.Pod, error) {
	if len(data) >= MaxManifestSize {
		return nil, manifestErr(path, ErrTooLarge, "%d bytes: the kubelet refuses manifests of %d bytes (10 MiB) or more", len(data), MaxManifestSize)
	}
	pod, err := Decode(path, data)
	if err != nil {
		return nil, err
	}
	if pod.Name == "" {
		e := manifestErr(path, ErrInvalidPod, "invalid pod: name is needed for the pod")
		e.Field = "metadata.name"
		return nil, e
	}
	ApplyDefaults(pod, nodeName, path)
	if err := Validate(pod); err != nil {
		var me *ManifestError
		if errors.As(err, &me) {
			me.Path = path
			return nil, me
		}
		return nil, err
	}
	pod.Annotations[AnnotationConfigSource] = SourceFile
	// The kubelet's pods come out of a conversion from the internal type, which
	// leaves apiVersion and kind empty; do the same so both compare equal.
	pod.TypeMeta = metav1.TypeMeta{}
	return pod, nil
}

// loadFile returns the pod and a digest of the bytes it came from.
func loadFile(path, nodeName string) (*corev1.Pod, [32]byte, error) {
	data, err := readManifest(path)
	if err != nil {
		return nil, [32]byte{}, err
	}
	digest := sha256.Sum256(data)
	pod, err := ParseManifest(path, data, nodeName)
	return pod, digest, err
}

var errNotExist = fs.ErrNotExist

// errGone marks a file that vanished between listing and reading: a removal, not an error.
var errGone = errors.New("file is gone")

// readManifest reads a regular file of less than MaxManifestSize bytes. It opens
// non-blocking and checks the opened file, so a FIFO or device planted in the folder
// can never hang the reader.
func readManifest(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if _, lerr := os.Lstat(path); lerr == nil {
				return nil, manifestErr(path, ErrUnreadable, "dangling symlink: %v", err)
			}
			return nil, errGone
		}
		return nil, manifestErr(path, ErrUnreadable, "%v", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, manifestErr(path, ErrUnreadable, "%v", err)
	}
	if !st.Mode().IsRegular() {
		return nil, manifestErr(path, ErrUnreadable, "not a regular file (mode %v)", st.Mode())
	}
	if st.Size() >= MaxManifestSize {
		return nil, manifestErr(path, ErrTooLarge, "%d bytes: the kubelet refuses manifests of %d bytes (10 MiB) or more", st.Size(), MaxManifestSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxManifestSize))
	if err != nil {
		return nil, manifestErr(path, ErrUnreadable, "%v", err)
	}
	if len(data) >= MaxManifestSize {
		return nil, manifestErr(path, ErrTooLarge, "more than %d bytes (the file grew while being read)", MaxManifestSize-1)
	}
	return data, nil
}

// fileState is what the scanner knows about one path.
type fileState struct {
	// pod is the last version that loaded (nil if none ever did).
	pod *corev1.Pod
	// digest of the bytes pod came from, or of the broken bytes when err != nil.
	digest [32]byte
	// err is the current problem with the file, nil when the latest read loaded.
	err *ManifestError
	// reported is whether err has been sent as an event.
	reported bool
	// held: the error is fresh from an inotify event and not yet confirmed (the
	// writer may still be writing); the file keeps its last pod meanwhile.
	held bool
}

type scanner struct {
	cfg   Config
	files map[string]*fileState
	// seen remembers config.seen per UID, so a pod keeps its first-seen time across
	// rescans and is re-stamped only when its UID changes (a new manifest version).
	seen map[string]string
}

func newScanner(cfg Config) *scanner {
	return &scanner{cfg: cfg, files: map[string]*fileState{}, seen: map[string]string{}}
}

func (s *scanner) sortedPaths() []string {
	paths := make([]string, 0, len(s.files))
	for p := range s.files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths
}

// scanAll re-reads the whole folder. It returns an error only when the folder exists
// but cannot be listed; a missing folder empties the set like the kubelet does.
func (s *scanner) scanAll(ctx context.Context) error {
	start := s.cfg.Clock.Now()
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("list manifest folder %s: %w", s.cfg.Dir, err)
	}
	present := map[string]bool{}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		if s.cfg.Ignore(e.Name()) {
			continue
		}
		p := filepath.Join(s.cfg.Dir, e.Name())
		if s.scanOne(ctx, p) {
			present[p] = true
		}
	}
	for p := range s.files {
		if !present[p] {
			delete(s.files, p)
		}
	}
	s.cfg.Metrics.ObserveScan(s.cfg.Clock.Since(start), len(present))
	return nil
}

// scanOne re-reads one path and updates its state. It reports whether the path is a
// manifest candidate (false: gone, ignored, or a subfolder).
func (s *scanner) scanOne(ctx context.Context, path string) bool {
	log := logr.FromContextOrDiscard(ctx)
	if s.cfg.Ignore(filepath.Base(path)) {
		return false
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		log.V(4).Info("Skipping subfolder of the manifest folder: no recursion", "path", path)
		delete(s.files, path)
		return false
	}
	pod, digest, err := loadFile(path, s.cfg.NodeName)
	if errors.Is(err, errGone) {
		delete(s.files, path)
		return false
	}
	st := s.files[path]
	if st == nil {
		st = &fileState{}
		s.files[path] = st
	}
	if err != nil {
		var me *ManifestError
		if !errors.As(err, &me) {
			me = manifestErr(path, ErrUnreadable, "%v", err)
		}
		if st.err == nil || st.err.Error() != me.Error() || st.digest != digest {
			st.reported = false
		}
		st.err, st.digest = me, digest
		return true
	}
	if st.err != nil && !(errors.Is(st.err, ErrDuplicateName) && st.digest == digest) {
		st.err, st.reported = nil, false
	}
	if st.pod != nil && st.digest == digest {
		return true // unchanged: keep the pod (and its config.seen) as is
	}
	uid := string(pod.UID)
	seen, ok := s.seen[uid]
	if !ok {
		seen = s.cfg.Clock.Now().Format(SeenTimeFormat)
		s.seen[uid] = seen
	}
	pod.Annotations[AnnotationConfigSeen] = seen
	st.pod, st.digest = pod, digest
	return true
}

type entry struct {
	path string
	pod  *corev1.Pod
}

// effective is the set of pods to run: per file the current pod (or, under
// KeepLastGood, the last good one of a broken file), first file winning on a name
// clash. Duplicates get an ErrDuplicateName error on their file state.
func (s *scanner) effective() []entry {
	var out []entry
	names := map[string]string{}
	for _, p := range s.sortedPaths() {
		st := s.files[p]
		if st.pod == nil || (st.err != nil && !st.held && s.cfg.OnBroken == DropBroken && !errors.Is(st.err, ErrDuplicateName)) {
			continue
		}
		key := st.pod.Namespace + "/" + st.pod.Name
		if first, dup := names[key]; dup {
			if st.err == nil {
				st.err = manifestErr(p, ErrDuplicateName, "pod %s is already defined by %s, which comes first in sorted order and wins", key, first)
				st.reported = false
			}
			continue
		}
		if st.err != nil && errors.Is(st.err, ErrDuplicateName) {
			st.err = nil // the clash went away
		}
		names[key] = p
		out = append(out, entry{path: p, pod: st.pod})
	}
	s.pruneSeen(out)
	return out
}

func (s *scanner) pruneSeen(live []entry) {
	if len(s.seen) <= 2*len(live)+16 {
		return
	}
	keep := map[string]bool{}
	for _, st := range s.files {
		if st.pod != nil {
			keep[string(st.pod.UID)] = true
		}
	}
	for uid := range s.seen {
		if !keep[uid] {
			delete(s.seen, uid)
		}
	}
}
