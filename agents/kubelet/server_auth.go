package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	authorizationcel "k8s.io/apiserver/pkg/authorization/cel"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
)

// The kubelet API's paths that the authorization attributes single out
// (pkg/kubelet/server/server.go and the apiserver's healthz, configz, statusz and
// flagz paths).
const (
	metricsPath         = "/metrics"
	resourceMetricsPath = "/metrics/resource"
	statsPath           = "/stats/"
	logsPath            = "/logs/"
	checkpointPath      = "/checkpoint/"
	allocatedPodsPath   = "/allocatedPods"
	podsPath            = "/pods"
	runningPodsPath     = "/runningpods/"
	healthzPath         = "/healthz"
	configzPath         = "/configz"
	statuszPath         = "/statusz"
	flagzPath           = "/flagz"
)

// webhookRetryBackoff is genericoptions.DefaultAuthWebhookRetryBackoff, which the
// kubelet gives both the TokenReview and the SubjectAccessReview webhooks.
func webhookRetryBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
}

// serverAuth is what the kubelet API's filter needs: who is asking (authn), whether
// they may (authz), and the client CA the TLS handshake asks certificates for.
type serverAuth struct {
	authn authenticator.Request
	authz authorizer.UnconditionalAuthorizer
	// clientCA is the x509 client CA (a no-op provider when none is configured).
	clientCA dynamiccertificates.CAContentProvider
	// run starts the watch of the client CA file (nil without one).
	run func(ctx context.Context)
}

// buildAuth builds the authenticator and authorizer from the KubeletConfiguration as
// the kubelet's BuildAuth does (cmd/kubelet/app/auth.go): client certificates
// verified against authentication.x509.clientCAFile, bearer tokens checked through
// TokenReview when authentication.webhook.enabled (answers cached for cacheTTL),
// anonymous requests as system:anonymous when authentication.anonymous.enabled, and
// authorization by SubjectAccessReview (mode Webhook, allowed answers cached for
// cacheAuthorizedTTL, denied ones for cacheUnauthorizedTTL) or AlwaysAllow. client
// is the kubelet's own API client; without one (standalone mode) the webhooks
// cannot be used and buildAuth fails with the kubelet's error.
func buildAuth(client kubernetes.Interface, c *kubeletv1beta1.KubeletConfiguration) (*serverAuth, error) {
	authn := c.Authentication
	var caFile *dynamiccertificates.DynamicFileCAContent
	var ca dynamiccertificates.CAContentProvider
	if authn.X509.ClientCAFile != "" {
		var err error
		caFile, err = dynamiccertificates.NewDynamicCAContentFromFile("client-ca-bundle", authn.X509.ClientCAFile)
		if err != nil {
			return nil, err
		}
		ca = caFile
	} else {
		// No client CA configured: a non-nil no-op CA provider, as upstream.
		ca = dynamiccertificates.NewUnionCAContentProvider()
	}
	authnConfig := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous: &apiserver.AnonymousAuthConfig{Enabled: authn.Anonymous.Enabled != nil && *authn.Anonymous.Enabled},
		CacheTTL:  authn.Webhook.CacheTTL.Duration,
	}
	if caFile != nil {
		// Only a real provider: a typed nil would make the factory verify against nothing.
		authnConfig.ClientCertificateCAContentProvider = caFile
	}
	if authn.Webhook.Enabled != nil && *authn.Webhook.Enabled {
		if client == nil {
			return nil, errors.New("no client provided, cannot use webhook authentication")
		}
		authnConfig.WebhookRetryBackoff = webhookRetryBackoff()
		authnConfig.TokenAccessReviewClient = client.AuthenticationV1()
	}
	a, _, err := authnConfig.New()
	if err != nil {
		return nil, err
	}
	z, err := buildAuthz(client, c.Authorization)
	if err != nil {
		return nil, err
	}
	out := &serverAuth{authn: a, authz: z, clientCA: ca}
	if caFile != nil {
		out.run = func(ctx context.Context) { caFile.Run(ctx, 1) }
	}
	return out, nil
}

// buildAuthz is the kubelet's BuildAuthz.
func buildAuthz(client kubernetes.Interface, authz kubeletv1beta1.KubeletAuthorization) (authorizer.UnconditionalAuthorizer, error) {
	switch authz.Mode {
	case kubeletv1beta1.KubeletAuthorizationModeAlwaysAllow:
		return authorizerfactory.NewAlwaysAllowAuthorizer(), nil
	case kubeletv1beta1.KubeletAuthorizationModeWebhook:
		if client == nil {
			return nil, errors.New("no client provided, cannot use webhook authorization")
		}
		return authorizerfactory.DelegatingAuthorizerConfig{
			SubjectAccessReviewClient: client.AuthorizationV1(),
			AllowCacheTTL:             authz.Webhook.CacheAuthorizedTTL.Duration,
			DenyCacheTTL:              authz.Webhook.CacheUnauthorizedTTL.Duration,
			WebhookRetryBackoff:       webhookRetryBackoff(),
			Compiler:                  noMatchConditions{},
		}.New()
	case "":
		return nil, fmt.Errorf("no authorization mode specified")
	default:
		return nil, fmt.Errorf("unknown authorization mode %s", authz.Mode)
	}
}

// noMatchConditions is the CEL compiler given to the delegating authorizer. That
// authorizer never has match conditions (only an authorization configuration file
// gives a webhook some, and the kubelet has none), so nothing is ever compiled;
// left nil, DelegatingAuthorizerConfig would build apiserver's default CEL
// environment at start all the same, which the upstream kubelet pays for in heap
// and in resident cel-go code (docs/benchmarks.md, run I).
type noMatchConditions struct{}

func (noMatchConditions) CompileCELExpression(e authorizationcel.ExpressionAccessor) (authorizationcel.CompilationResult, error) {
	return authorizationcel.CompilationResult{}, fmt.Errorf("kubelet authorization: match condition %q: %w", e.GetExpression(), errNoMatchConditions)
}

// errNoMatchConditions says the kubelet's authorizer was asked to compile a
// match condition, which it does not support.
var errNoMatchConditions = errors.New("the kubelet's webhook authorizer takes no match conditions")

func isSubpath(subpath, path string) bool {
	path = strings.TrimSuffix(path, "/")
	return subpath == path || (strings.HasPrefix(subpath, path) && subpath[len(path)] == '/')
}

// requestAttributes maps a request to the kubelet API onto authorization attributes,
// exactly as the kubelet's nodeAuthorizerAttributesGetter with KubeletFineGrainedAuthz
// (GA and locked on since 1.36): verb from the HTTP method (POST create, GET get, PUT
// update, PATCH patch, DELETE delete), resource nodes, name the node's name, and one
// attribute per subresource to try in order: /pods, /allocatedPods and /runningpods
// try "pods", /healthz "healthz", /configz "configz" first; then /stats "stats",
// /metrics "metrics", /logs "log", /checkpoint "checkpoint", /statusz "statusz",
// /flagz "configz", and everything else "proxy". The request is allowed when any
// attribute is.
func requestAttributes(nodeName string, u user.Info, r *http.Request) []authorizer.Attributes {
	verb := ""
	switch r.Method {
	case http.MethodPost:
		verb = "create"
	case http.MethodGet:
		verb = "get"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	}
	path := r.URL.Path
	var subresources []string
	switch {
	case isSubpath(path, allocatedPodsPath), isSubpath(path, podsPath):
		subresources = append(subresources, "pods")
	case isSubpath(path, healthzPath):
		subresources = append(subresources, "healthz")
	case isSubpath(path, configzPath):
		subresources = append(subresources, "configz")
	case isSubpath(path, runningPodsPath):
		subresources = append(subresources, "pods")
	}
	switch {
	case isSubpath(path, statsPath):
		subresources = append(subresources, "stats")
	case isSubpath(path, metricsPath):
		subresources = append(subresources, "metrics")
	case isSubpath(path, logsPath):
		// "log" to match the other log subresources (pods/log).
		subresources = append(subresources, "log")
	case isSubpath(path, checkpointPath):
		subresources = append(subresources, "checkpoint")
	case isSubpath(path, statuszPath):
		subresources = append(subresources, "statusz")
	case isSubpath(path, flagzPath):
		subresources = append(subresources, "configz")
	default:
		subresources = append(subresources, "proxy")
	}
	attrs := make([]authorizer.Attributes, 0, len(subresources))
	for _, sub := range subresources {
		attrs = append(attrs, authorizer.AttributesRecord{
			User: u, Verb: verb, APIVersion: "v1", Resource: "nodes", Subresource: sub,
			Name: nodeName, ResourceRequest: true, Path: path,
		})
	}
	klog.V(5).InfoS("Node request attributes", "user", u.GetName(), "verb", verb, "resource", "nodes", "subresource(s)", subresources)
	return attrs
}

// withAuth is the kubelet's auth filter (InstallAuthFilter): every request, whatever
// its path, is authenticated (401 "Unauthorized" when nobody is recognised) and then
// authorized against the node's attributes (403 naming user, verb, resource and the
// subresources tried; 500 when the authorizer itself fails).
func withAuth(nodeName string, a *serverAuth, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, ok, err := a.authn.AuthenticateRequest(r)
		if err != nil {
			klog.ErrorS(err, "Unable to authenticate the request due to an error")
			writeErrorString(w, http.StatusUnauthorized, "Unauthorized")
			return
		}
		if !ok {
			writeErrorString(w, http.StatusUnauthorized, "Unauthorized")
			return
		}
		attrs := requestAttributes(nodeName, info.User, r)
		allowed := false
		var subresources []string
		for _, attr := range attrs {
			subresources = append(subresources, attr.GetSubresource())
			decision, _, err := a.authz.Authorize(r.Context(), attr)
			if err != nil {
				klog.ErrorS(err, "Authorization error", "user", attr.GetUser().GetName(), "verb", attr.GetVerb(), "resource", attr.GetResource(), "subresource", attr.GetSubresource())
				writeErrorString(w, http.StatusInternalServerError, fmt.Sprintf("Authorization error (user=%s, verb=%s, resource=%s, subresource=%s)",
					attr.GetUser().GetName(), attr.GetVerb(), attr.GetResource(), attr.GetSubresource()))
				return
			}
			if decision == authorizer.DecisionAllow {
				allowed = true
				break
			}
		}
		if !allowed {
			// The attributes differ only by subresource: name the first one's fields.
			klog.V(2).InfoS("Forbidden", "user", attrs[0].GetUser().GetName(), "verb", attrs[0].GetVerb(), "resource", attrs[0].GetResource(), "subresource(s)", subresources)
			writeErrorString(w, http.StatusForbidden, fmt.Sprintf("Forbidden (user=%s, verb=%s, resource=%s, subresource(s)=%v)\n",
				attrs[0].GetUser().GetName(), attrs[0].GetVerb(), attrs[0].GetResource(), subresources))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// writeErrorString writes status and msg as go-restful's WriteErrorString does, which
// the kubelet's handlers use for their errors: the message as is, in plain text (the type
// net/http would sniff).
func writeErrorString(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg))
}
