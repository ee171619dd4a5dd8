package volume

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// Token rotation as pkg/kubelet/token/token_manager.go does it.
const (
	// maxTTL: a token older than this is requested again whatever its expiry.
	maxTTL = 24 * time.Hour
	// maxJitter: refreshes start up to this much early, so pods started together
	// do not all ask at once.
	maxJitter = 10 * time.Second
	// refreshRemainPercent: the token is requested again once 80% of its TTL
	// passed, that is when 20% remains.
	refreshRemainPercent = 20
	// defaultExpirationSeconds is the API server's default for
	// serviceAccountToken.expirationSeconds.
	defaultExpirationSeconds = 3600
)

// tokenCache holds the tokens of projected volumes, keyed like the kubelet's:
// service account, audiences, expiration and the pod they are bound to.
type tokenCache struct {
	mu     sync.Mutex
	clock  clock.Clock
	jitter func() time.Duration
	tokens map[string]cachedToken
}

type cachedToken struct {
	tr  *authenticationv1.TokenRequest
	pod types.UID
}

func newTokenCache(c clock.Clock) *tokenCache {
	return &tokenCache{
		clock:  c,
		jitter: func() time.Duration { return time.Duration(rand.Float64()*maxJitter.Seconds()) * time.Second },
		tokens: map[string]cachedToken{},
	}
}

// tokenKey is the kubelet's keyFunc: safe to log, no token in it.
func tokenKey(namespace, name string, req *authenticationv1.TokenRequest) string {
	var exp int64
	if req.Spec.ExpirationSeconds != nil {
		exp = *req.Spec.ExpirationSeconds
	}
	var ref authenticationv1.BoundObjectReference
	if req.Spec.BoundObjectRef != nil {
		ref = *req.Spec.BoundObjectRef
	}
	return fmt.Sprintf("%q/%q/%#v/%#v/%#v/%q", name, namespace, req.Spec.Audiences, exp, ref, req.UID)
}

// get returns a valid token, from the cache while it needs no refresh. When a
// refresh fails but the cached token has not expired, the cached one is used, as
// upstream does, so a short API outage does not break running pods.
func (c *tokenCache) get(ctx context.Context, src Sources, namespace, name string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	key := tokenKey(namespace, name, req)
	c.mu.Lock()
	entry, ok := c.tokens[key]
	c.mu.Unlock()
	cached := entry.tr
	if ok && !c.needsRefresh(cached) {
		return cached, nil
	}
	fresh, err := src.ServiceAccountToken(ctx, namespace, name, req.DeepCopy())
	if err != nil {
		// The kubelet's messages for the three cases.
		switch {
		case !ok:
			return nil, fmt.Errorf("failed to fetch token: %w", err)
		case c.clock.Now().After(cached.Status.ExpirationTimestamp.Time):
			return nil, fmt.Errorf("token %s expired and refresh failed: %w", key, err)
		}
		logr.FromContextOrDiscard(ctx).Info("Couldn't update token, using the cached one until it expires",
			"cacheKey", key, "expires", cached.Status.ExpirationTimestamp.Time, "err", err)
		return cached, nil
	}
	if fresh == nil || fresh.Status.Token == "" {
		return nil, fmt.Errorf("the API server returned no token for service account %s/%s", namespace, name)
	}
	if fresh.Spec.ExpirationSeconds == nil {
		fresh.Spec.ExpirationSeconds = req.Spec.ExpirationSeconds
	}
	var pod types.UID
	if req.Spec.BoundObjectRef != nil {
		pod = req.Spec.BoundObjectRef.UID
	}
	c.mu.Lock()
	c.tokens[key] = cachedToken{tr: fresh, pod: pod}
	c.mu.Unlock()
	return fresh, nil
}

// needsRefresh is the kubelet's requiresRefresh: 80% of the TTL passed (less a
// jitter) or the token is older than 24 hours (less a jitter).
func (c *tokenCache) needsRefresh(tr *authenticationv1.TokenRequest) bool {
	if tr.Spec.ExpirationSeconds == nil {
		return false
	}
	now := c.clock.Now()
	exp := tr.Status.ExpirationTimestamp.Time
	ttl := time.Duration(*tr.Spec.ExpirationSeconds) * time.Second
	iat := exp.Add(-ttl)
	jitter := c.jitter()
	if now.After(iat.Add(maxTTL - jitter)) {
		return true
	}
	// Upstream computes the remaining 20% in whole seconds.
	rest := time.Duration(*tr.Spec.ExpirationSeconds*refreshRemainPercent/100) * time.Second
	return now.After(exp.Add(-rest - jitter))
}

// forget drops the tokens bound to a pod.
func (c *tokenCache) forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range c.tokens {
		if e.pod == uid {
			delete(c.tokens, k)
		}
	}
}
