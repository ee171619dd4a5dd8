package volume

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/go-logr/logr"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	lrucache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/discovery"
	certinformers "k8s.io/client-go/informers/certificates/v1"
	"k8s.io/client-go/kubernetes"
	certlisters "k8s.io/client-go/listers/certificates/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// TrustAnchors answers the clusterTrustBundle sources of projected volumes: the
// certificates of ClusterTrustBundles as concatenated PEM CERTIFICATE blocks.
// ClusterTrustBundles is the informer-backed implementation the kubelet uses.
type TrustAnchors interface {
	// TrustAnchorsByName returns the certificates of the ClusterTrustBundle
	// name. With allowMissing, a bundle that does not exist yields empty output
	// instead of an error.
	TrustAnchorsByName(ctx context.Context, name string, allowMissing bool) ([]byte, error)
	// TrustAnchorsBySigner merges the certificates of every ClusterTrustBundle of
	// signerName that selector matches (nil matches nothing, empty everything).
	// With allowMissing, no match yields empty output instead of an error.
	TrustAnchorsBySigner(ctx context.Context, signerName string, selector *metav1.LabelSelector, allowMissing bool) ([]byte, error)
}

// Defaults of ClusterTrustBundlesConfig, the kubelet's.
const (
	// DefaultTrustBundleCacheSize is twice the kubelet's default maxPods.
	DefaultTrustBundleCacheSize = 220
	// DefaultTrustBundleCacheTTL bounds how long a merged bundle is reused; any
	// change to a ClusterTrustBundle drops the entries it may be part of sooner.
	DefaultTrustBundleCacheTTL = 5 * time.Minute
	// DefaultTrustBundleSyncTimeout is how long the first lookup waits for the
	// informer's initial list.
	DefaultTrustBundleSyncTimeout = 10 * time.Second
)

// maxLabelSelectorLength caps the selector string used as a cache key, as upstream.
const maxLabelSelectorLength = 100 * 1024

// ErrTrustBundlesUnavailable: the ClusterTrustBundle lookup cannot answer (not
// running, the API is not served, or the informer has not synced).
var ErrTrustBundlesUnavailable = errors.New("ClusterTrustBundles unavailable")

// ClusterTrustBundlesConfig configures ClusterTrustBundles.
type ClusterTrustBundlesConfig struct {
	// Client reads certificates.k8s.io/v1 ClusterTrustBundles. Required.
	Client kubernetes.Interface
	// CacheSize is the number of merged bundles kept. Default
	// DefaultTrustBundleCacheSize.
	CacheSize int
	// CacheTTL is how long a merged bundle is kept. Default DefaultTrustBundleCacheTTL.
	CacheTTL time.Duration
	// SyncTimeout bounds the wait for the informer's first list. Default
	// DefaultTrustBundleSyncTimeout.
	SyncTimeout time.Duration
	// Clock ages the cache. Default the real clock.
	Clock clock.Clock
}

// ClusterTrustBundles is the kubelet's ClusterTrustBundle manager
// (pkg/kubelet/clustertrustbundle): the informer starts on the first lookup, so
// nodes whose pods never project a bundle do not watch them. A lookup merges the
// certificates of the matching bundles, drops duplicates and puts them in a
// random order, so that consumers do not come to depend on one; the result is
// cached (and so stable) until a ClusterTrustBundle of the same signer, or of the
// same name for signerless bundles, changes or CacheTTL passes.
//
// Lookups fail with ErrTrustBundlesUnavailable unless Run is running.
type ClusterTrustBundles struct {
	cfg        ClusterTrustBundlesConfig
	normalized *lrucache.LRUExpireCache
	shuffle    func([]string)

	mu      sync.Mutex
	runCtx  context.Context
	stopped bool
	// informerDone is closed when the informer, once started, has stopped.
	informerDone chan struct{}
	lister       certlisters.ClusterTrustBundleLister
	synced       cache.InformerSynced
}

var _ TrustAnchors = (*ClusterTrustBundles)(nil)

// NewClusterTrustBundles validates cfg and returns a ClusterTrustBundles; call Run.
func NewClusterTrustBundles(cfg ClusterTrustBundlesConfig) (*ClusterTrustBundles, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("%w: ClusterTrustBundlesConfig.Client is required", ErrInvalidConfig)
	}
	if cfg.CacheSize < 0 || cfg.CacheTTL < 0 || cfg.SyncTimeout < 0 {
		return nil, fmt.Errorf("%w: ClusterTrustBundlesConfig has a negative size or duration", ErrInvalidConfig)
	}
	if cfg.CacheSize == 0 {
		cfg.CacheSize = DefaultTrustBundleCacheSize
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = DefaultTrustBundleCacheTTL
	}
	if cfg.SyncTimeout == 0 {
		cfg.SyncTimeout = DefaultTrustBundleSyncTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &ClusterTrustBundles{
		cfg:        cfg,
		normalized: lrucache.NewLRUExpireCacheWithClock(cfg.CacheSize, cfg.Clock),
		shuffle: func(s []string) {
			rand.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
		},
	}, nil
}

// Run serves lookups until ctx ends, then stops the informer (if one was
// started) and returns nil. It may be called once.
func (c *ClusterTrustBundles) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.runCtx != nil {
		c.mu.Unlock()
		return errors.New("ClusterTrustBundles.Run called twice")
	}
	c.runCtx = ctx
	c.mu.Unlock()
	<-ctx.Done()
	c.mu.Lock()
	c.stopped = true
	done := c.informerDone
	c.mu.Unlock()
	if done != nil {
		<-done
	}
	return nil
}

// start makes the informer on first use and waits (up to SyncTimeout) for its
// first list. It holds mu throughout so concurrent first lookups start one.
func (c *ClusterTrustBundles) start(ctx context.Context) (certlisters.ClusterTrustBundleLister, cache.InformerSynced, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runCtx == nil || c.stopped {
		return nil, nil, fmt.Errorf("%w: not running", ErrTrustBundlesUnavailable)
	}
	if c.informerDone != nil {
		return c.lister, c.synced, nil
	}
	logger := logr.FromContextOrDiscard(ctx)
	gv := certificatesv1.SchemeGroupVersion.String()
	served, err := clusterTrustBundlesServed(ctx, c.cfg.Client, gv)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to determine whether the API server serves %s clustertrustbundles: %w", gv, err)
	}
	if !served {
		return nil, nil, fmt.Errorf("%w: the API server does not serve %s clustertrustbundles", ErrTrustBundlesUnavailable, gv)
	}
	// One informer, not a SharedInformerFactory (which links every API group's).
	inf := certinformers.NewClusterTrustBundleInformer(c.cfg.Client, 0, cache.Indexers{})
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.drop(obj) },
		UpdateFunc: func(_, obj any) { c.drop(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			c.drop(obj)
		},
	}); err != nil {
		return nil, nil, fmt.Errorf("registering the ClusterTrustBundle event handler: %w", err)
	}
	c.lister, c.synced = certlisters.NewClusterTrustBundleLister(inf.GetIndexer()), inf.HasSynced
	c.informerDone = make(chan struct{})
	go func(ctx context.Context, done chan<- struct{}) {
		defer close(done)
		inf.RunWithContext(ctx)
	}(c.runCtx, c.informerDone)
	logger.Info("Started ClusterTrustBundle informer", "apiGroup", gv)

	waitCtx, cancel := context.WithTimeout(ctx, c.cfg.SyncTimeout)
	defer cancel()
	stop := context.AfterFunc(c.runCtx, cancel)
	defer stop()
	if cache.WaitForCacheSync(waitCtx.Done(), c.synced) {
		logger.Info("ClusterTrustBundle informer synced")
	} else {
		logger.Info("ClusterTrustBundle informer not synced, continuing to attempt in background")
	}
	return c.lister, c.synced, nil
}

func clusterTrustBundlesServed(ctx context.Context, cs kubernetes.Interface, gv string) (bool, error) {
	list, err := discovery.ToDiscoveryInterfaceWithContext(cs.Discovery()).ServerResourcesForGroupVersionWithContext(ctx, gv)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if list != nil {
		for _, r := range list.APIResources {
			if r.Name == "clustertrustbundles" {
				return true, nil
			}
		}
	}
	return false, err
}

// trustBundleKey keys the merged bundles: a name, or a signer and selector.
// matchNothing tells a nil selector from an empty one, whose strings are both
// "" (upstream's key does not, so there the first of the two cached wins).
type trustBundleKey struct {
	name, signerName, selector string
	matchNothing               bool
}

// drop forgets the merged bundles obj may be part of: those of its signer, or
// those naming it when it has none (a signerless bundle is only found by name).
func (c *ClusterTrustBundles) drop(obj any) {
	ctb, ok := obj.(*certificatesv1.ClusterTrustBundle)
	if !ok {
		return
	}
	c.normalized.RemoveAll(func(k any) bool {
		key := k.(trustBundleKey)
		if ctb.Spec.SignerName != "" {
			return key.signerName == ctb.Spec.SignerName
		}
		return key.name == ctb.Name
	})
}

func (c *ClusterTrustBundles) ready(ctx context.Context) (certlisters.ClusterTrustBundleLister, error) {
	lister, synced, err := c.start(ctx)
	if err != nil {
		return nil, err
	}
	if !synced() {
		return nil, fmt.Errorf("%w: ClusterTrustBundle informer has not yet synced", ErrTrustBundlesUnavailable)
	}
	return lister, nil
}

// TrustAnchorsByName implements TrustAnchors.
func (c *ClusterTrustBundles) TrustAnchorsByName(ctx context.Context, name string, allowMissing bool) ([]byte, error) {
	lister, err := c.ready(ctx)
	if err != nil {
		return nil, err
	}
	key := trustBundleKey{name: name}
	if v, ok := c.normalized.Get(key); ok {
		return v.([]byte), nil
	}
	ctb, err := lister.Get(name)
	if apierrors.IsNotFound(err) && allowMissing {
		return []byte{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("while getting ClusterTrustBundle: %w", err)
	}
	out := c.merge([]*certificatesv1.ClusterTrustBundle{ctb})
	c.normalized.Add(key, out, c.cfg.CacheTTL)
	return out, nil
}

// TrustAnchorsBySigner implements TrustAnchors.
func (c *ClusterTrustBundles) TrustAnchorsBySigner(ctx context.Context, signerName string, selector *metav1.LabelSelector, allowMissing bool) ([]byte, error) {
	lister, err := c.ready(ctx)
	if err != nil {
		return nil, err
	}
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		return nil, fmt.Errorf("while parsing label selector: %w", err)
	}
	key := trustBundleKey{signerName: signerName, selector: sel.String(), matchNothing: selector == nil}
	if n := len(key.selector); n > maxLabelSelectorLength {
		return nil, fmt.Errorf("label selector length (%d) is larger than %d", n, maxLabelSelectorLength)
	}
	if v, ok := c.normalized.Get(key); ok {
		return v.([]byte), nil
	}
	all, err := lister.List(sel)
	if err != nil {
		return nil, fmt.Errorf("while listing ClusterTrustBundles matching label selector %v: %w", selector, err)
	}
	var matched []*certificatesv1.ClusterTrustBundle
	for _, ctb := range all {
		if ctb.Spec.SignerName == signerName {
			matched = append(matched, ctb)
		}
	}
	if len(matched) == 0 {
		if allowMissing {
			return []byte{}, nil
		}
		return nil, errors.New("combination of signerName and labelSelector matched zero ClusterTrustBundles")
	}
	out := c.merge(matched)
	c.normalized.Add(key, out, c.cfg.CacheTTL)
	return out, nil
}

// merge is upstream's normalization: every PEM block of every bundle, kept once
// (by its DER bytes), re-encoded as CERTIFICATE without headers, in random order.
func (c *ClusterTrustBundles) merge(ctbs []*certificatesv1.ClusterTrustBundle) []byte {
	seen := sets.New[string]()
	for _, ctb := range ctbs {
		rest := []byte(ctb.Spec.TrustBundle)
		for {
			var b *pem.Block
			b, rest = pem.Decode(rest)
			if b == nil {
				break
			}
			seen.Insert(string(b.Bytes))
		}
	}
	ders := sets.List(seen)
	c.shuffle(ders)
	out := []byte{}
	for _, der := range ders {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte(der)})...)
	}
	return out
}
