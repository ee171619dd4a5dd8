package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	authorizationcel "k8s.io/apiserver/pkg/authorization/cel"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
)

// testCA signs client certificates for the x509 tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) client(t *testing.T, cn string, groups ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn, Organization: groups},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (ca *testCA) write(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(p, ca.pem, 0o600))
	return p
}

// startReal starts a kubelet server with the authenticator and authorizer built from
// cfg (client for the webhooks) on a loopback port and returns its https URL.
func startReal(t *testing.T, f *serverFixture, cfg *kubeletv1beta1.KubeletConfiguration, client kubernetes.Interface) string {
	t.Helper()
	cfg.Address, cfg.Port = "127.0.0.1", 0
	sc := f.server.cfg
	sc.Config, sc.auth, sc.Client = cfg, nil, nil
	if client != nil {
		sc.Client = client
	}
	s, err := newKubeletServer(sc)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	addr, err := s.Start(ctx)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return "https://" + addr.String()
}

func get(t *testing.T, url string, cert *tls.Certificate, token string) (int, string) {
	t.Helper()
	tc := insecureTLS()
	if cert != nil {
		tc.Certificates = []tls.Certificate{*cert}
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	req, err := http.NewRequest("GET", url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestServerX509AndAnonymous(t *testing.T) {
	f := newServerFixture(t, nil)
	ca := newTestCA(t, "cluster-ca")
	other := newTestCA(t, "other-ca")
	cfg := f.cfg.DeepCopy()
	cfg.Authentication.X509.ClientCAFile = ca.write(t)
	cfg.Authentication.Webhook.Enabled = ptr.To(false)
	cfg.Authorization.Mode = kubeletv1beta1.KubeletAuthorizationModeAlwaysAllow
	url := startReal(t, f, cfg, nil)

	good := ca.client(t, "kube-apiserver-kubelet-client", "system:masters")
	code, body := get(t, url+"/healthz", &good, "")
	assert.Equal(t, http.StatusOK, code, body)
	code, body = get(t, url+"/healthz", nil, "")
	assert.Equal(t, http.StatusUnauthorized, code, "no client certificate")
	assert.Equal(t, "Unauthorized", body)
	bad := other.client(t, "kube-apiserver-kubelet-client", "system:masters")
	code, _ = get(t, url+"/healthz", &bad, "")
	assert.Equal(t, http.StatusUnauthorized, code, "a certificate from another CA")
	code, _ = get(t, url+"/healthz", nil, "some-token")
	assert.Equal(t, http.StatusUnauthorized, code, "a token with the webhook off")

	// anonymous.enabled: the request reaches the authorizer as system:anonymous.
	cfg2 := f.cfg.DeepCopy()
	cfg2.Authentication.Anonymous.Enabled = ptr.To(true)
	cfg2.Authentication.Webhook.Enabled = ptr.To(false)
	api := newReviewAPI(t, nil, func(*authorizationv1.SubjectAccessReview) bool { return false })
	url2 := startReal(t, f, cfg2, api.client(t))
	code, body = get(t, url2+"/pods", nil, "")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Equal(t, "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[pods proxy])\n", body)
	_, got := api.counts()
	require.Len(t, got, 2)
	assert.Equal(t, []string{"system:unauthenticated"}, got[0].Spec.Groups)
}

// reviewAPI is a stand-in API server answering TokenReviews and
// SubjectAccessReviews (the webhooks call the REST client directly), recording them.
type reviewAPI struct {
	mu      sync.Mutex
	tokens  map[string]authenticationv1.UserInfo
	allow   func(*authorizationv1.SubjectAccessReview) bool
	reviews int
	sars    []*authorizationv1.SubjectAccessReview
	srv     *httptest.Server
}

func newReviewAPI(t *testing.T, tokens map[string]authenticationv1.UserInfo, allow func(*authorizationv1.SubjectAccessReview) bool) *reviewAPI {
	a := &reviewAPI{tokens: tokens, allow: allow}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/apis/authentication.k8s.io/v1/tokenreviews":
			var tr authenticationv1.TokenReview
			_ = json.NewDecoder(r.Body).Decode(&tr)
			a.reviews++
			if u, ok := a.tokens[tr.Spec.Token]; ok {
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: u}
			}
			_ = json.NewEncoder(w).Encode(&tr)
		case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			var sar authorizationv1.SubjectAccessReview
			_ = json.NewDecoder(r.Body).Decode(&sar)
			a.sars = append(a.sars, sar.DeepCopy())
			sar.Status.Allowed = a.allow(&sar)
			_ = json.NewEncoder(w).Encode(&sar)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *reviewAPI) client(t *testing.T) kubernetes.Interface {
	c, err := kubernetes.NewForConfig(&rest.Config{Host: a.srv.URL})
	require.NoError(t, err)
	return c
}

func (a *reviewAPI) counts() (int, []*authorizationv1.SubjectAccessReview) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reviews, append([]*authorizationv1.SubjectAccessReview(nil), a.sars...)
}

func TestServerWebhooks(t *testing.T) {
	f := newServerFixture(t, nil)
	// alice may read logs only (nodes/log); bob nodes/proxy.
	api := newReviewAPI(t, map[string]authenticationv1.UserInfo{
		"alice-token": {Username: "alice", Groups: []string{"devs"}},
		"bob-token":   {Username: "bob"},
	}, func(sar *authorizationv1.SubjectAccessReview) bool {
		ra := sar.Spec.ResourceAttributes
		switch sar.Spec.User {
		case "alice":
			return ra.Subresource == "log"
		case "bob":
			return ra.Subresource == "proxy"
		}
		return false
	})
	cs := api.client(t)
	cfg := f.cfg.DeepCopy()
	url := startReal(t, f, cfg, cs)

	code, _ := get(t, url+"/pods", nil, "")
	assert.Equal(t, http.StatusUnauthorized, code, "anonymous is off by default")
	code, _ = get(t, url+"/pods", nil, "unknown-token")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, body := get(t, url+"/pods", nil, "alice-token")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Equal(t, "Forbidden (user=alice, verb=get, resource=nodes, subresource(s)=[pods proxy])\n", body)
	code, _ = get(t, url+"/logs/", nil, "alice-token")
	assert.Equal(t, http.StatusNotFound, code, "alice passes nodes/log; the kubelet serves no /logs/ (system logs)")
	code, body = get(t, url+"/pods", nil, "bob-token")
	assert.Equal(t, http.StatusOK, code, body)

	before, seen := api.counts()
	require.NotEmpty(t, seen)
	ra := seen[0].Spec.ResourceAttributes
	require.NotNil(t, ra)
	assert.Equal(t, "alice", seen[0].Spec.User)
	assert.Equal(t, []string{"devs", "system:authenticated"}, seen[0].Spec.Groups)
	assert.Equal(t, authorizationv1.ResourceAttributes{Verb: "get", Version: "v1", Resource: "nodes", Subresource: "pods", Name: testNodeName}, *ra)

	// Answers are cached: the same requests again make no new reviews.
	get(t, url+"/pods", nil, "alice-token")
	get(t, url+"/pods", nil, "bob-token")
	after, seenAfter := api.counts()
	assert.Equal(t, before, after, "token reviews cached for cacheTTL")
	assert.Equal(t, len(seen), len(seenAfter), "decisions cached for cacheAuthorizedTTL / cacheUnauthorizedTTL")
}

func TestServerAuthConfigErrors(t *testing.T) {
	cfg, _, err := loadConfig("")
	require.NoError(t, err)
	_, err = buildAuth(nil, cfg)
	assert.EqualError(t, err, "no client provided, cannot use webhook authentication")
	cfg.Authentication.Webhook.Enabled = ptr.To(false)
	_, err = buildAuth(nil, cfg)
	assert.EqualError(t, err, "no authentication method configured", "no client CA, no webhook and no anonymous")
	cfg.Authentication.Anonymous.Enabled = ptr.To(true)
	_, err = buildAuth(nil, cfg)
	assert.EqualError(t, err, "no client provided, cannot use webhook authorization")
	cfg.Authorization.Mode = kubeletv1beta1.KubeletAuthorizationModeAlwaysAllow
	_, err = buildAuth(nil, cfg)
	assert.NoError(t, err, "standalone with both webhooks off")
	cfg.Authentication.X509.ClientCAFile = "/does/not/exist.crt"
	_, err = buildAuth(nil, cfg)
	assert.Error(t, err)
	cfg.Authentication.X509.ClientCAFile = ""
	cfg.Authorization.Mode = "RBAC"
	_, err = buildAuth(nil, cfg)
	assert.EqualError(t, err, "unknown authorization mode RBAC")
	cfg.Authorization.Mode = ""
	_, err = buildAuth(nil, cfg)
	assert.EqualError(t, err, "no authorization mode specified")
}

func TestNoMatchConditionsCompilesNothing(t *testing.T) {
	_, err := noMatchConditions{}.CompileCELExpression(&authorizationcel.SubjectAccessReviewMatchCondition{Expression: "request.user == 'x'"})
	require.Error(t, err)
	assert.True(t, errors.Is(err, errNoMatchConditions))
	assert.Contains(t, err.Error(), `"request.user == 'x'"`, "the error names the expression")
}
