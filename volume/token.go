package volume

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
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
	tokens map[string]*authenticationv1.TokenRequest
}

func newTokenCache(c clock.Clock) *tokenCache {
	return &tokenCache{
		clock:  c,
		jitter: func() time.Duration { return time.Duration(rand.Float64()*maxJitter.Seconds()) * time.Second },
		tokens: map[string]*authenticationv1.TokenRequest{},
	}
}

func tokenKey(namespace, name string, req *authenticationv1.TokenRequest) string {
	var exp int64
	if req.Spec.ExpirationSeconds != nil {
		exp = *req.Spec.ExpirationSeconds
	}
	var uid types.UID
	if req.Spec.BoundObjectRef != nil {
		uid = req.Spec.BoundObjectRef.UID
	}
	return fmt.Sprintf("%q/%q/%#v/%d/%s", namespace, name, req.Spec.Audiences, exp, uid)
}

// get returns a valid token, from the cache while it needs no refresh. When a
// refresh fails but the cached token has not expired, the cached one is used, as
// upstream does, so a short API outage does not break running pods.
func (c *tokenCache) get(ctx context.Context, src Sources, namespace, name string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	key := tokenKey(namespace, name, req)
	c.mu.Lock()
	cached := c.tokens[key]
	c.mu.Unlock()
	if cached != nil && !c.needsRefresh(cached) {
		return cached, nil
	}
	fresh, err := src.ServiceAccountToken(ctx, namespace, name, req.DeepCopy())
	if err != nil {
		if cached != nil && c.clock.Now().Before(cached.Status.ExpirationTimestamp.Time) {
			logr.FromContextOrDiscard(ctx).Info("Refreshing a service account token failed, using the cached one until it expires",
				"serviceAccount", namespace+"/"+name, "expires", cached.Status.ExpirationTimestamp.Time, "err", err)
			return cached, nil
		}
		return nil, err
	}
	if fresh == nil || fresh.Status.Token == "" {
		return nil, fmt.Errorf("the API server returned no token for service account %s/%s", namespace, name)
	}
	if fresh.Spec.ExpirationSeconds == nil {
		fresh.Spec.ExpirationSeconds = req.Spec.ExpirationSeconds
	}
	c.mu.Lock()
	c.tokens[key] = fresh
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
	for k := range c.tokens {
		if strings.HasSuffix(k, "/"+string(uid)) {
			delete(c.tokens, k)
		}
	}
}
