// Command floor is the least a kubelet built on Kubernetes' client and server
// libraries does while it runs no pod. The pod start benchmark runs it beside the
// two kubelets to measure the memory any such kubelet starts from, so the agents'
// RSS can be read against it.
//
// It does what every kubelet must do at idle, each through the library nodekit's
// kubelet and the upstream kubelet use for it, and nothing else:
//
//   - client-go's clientset (protobuf, as the kubelet asks) to register its Node,
//     to watch the Node and the pods bound to it through informers, to renew its
//     Lease every 10 s and to post events through client-go's broadcaster;
//   - the CRI over gRPC: runtime Status every 10 s and, as the kubelet's PLEG
//     does, a relist of sandboxes and containers every second;
//   - an HTTPS port that authenticates every request (client certificates, then
//     TokenReview) and authorizes it (SubjectAccessReview) through
//     k8s.io/apiserver's delegating authenticator and authorizer, serving /metrics
//     from component-base's registry and /healthz;
//   - klog text logs.
//
// It is not a kubelet: it starts no pod and reports no status beyond its Node's
// registration. It lives under internal/ because it is a measuring tool.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	authorizationcel "k8s.io/apiserver/pkg/authorization/cel"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/agents/kubelet/internal/floor/idle"
)

var runningPods = metrics.NewGaugeVec(&metrics.GaugeOpts{
	Subsystem:      "kubelet",
	Name:           "running_pods",
	Help:           "Number of pods that have a running pod sandbox",
	StabilityLevel: metrics.ALPHA,
}, nil)

func main() { idle.Main("floor", run) }

func run(ctx context.Context, o idle.Options) error {
	rc, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", o.Kubeconfig, err)
	}
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.QPS, rc.Burst = 50, 100
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	legacyregistry.MustRegister(runningPods)
	if err := idle.Runtime(ctx, o.Endpoint, func(ready int) { runningPods.WithLabelValues().Set(float64(ready)) }); err != nil {
		return err
	}

	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: o.Node, Labels: map[string]string{"kubernetes.io/hostname": o.Node, "kubernetes.io/os": "linux"}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: "nodekit.dev/floor", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{
			corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi"),
		}},
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("register node %s: %w", o.Node, err)
	}
	klog.InfoS("Successfully registered node", "node", klog.KRef("", o.Node))

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartStructuredLogging(3)
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: o.Node})
	recorder.Event(&corev1.ObjectReference{Kind: "Node", Name: o.Node, UID: "floor"}, corev1.EventTypeNormal, "Starting", "Starting floor.")

	nodes := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "nodes", "",
		fields.OneTermEqualSelector("metadata.name", o.Node)), &corev1.Node{}, 0, cache.Indexers{})
	pods := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "pods", "",
		fields.OneTermEqualSelector("spec.nodeName", o.Node)), &corev1.Pod{}, 0, cache.Indexers{})
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) {}, UpdateFunc: func(any, any) {}, DeleteFunc: func(any) {}}); err != nil {
		return err
	}
	go nodes.RunWithContext(ctx)
	go pods.RunWithContext(ctx)

	go wait.UntilWithContext(ctx, func(ctx context.Context) { renewLease(ctx, client, o.Node) }, 10*time.Second)
	return serve(ctx, o, client)
}

// renewLease creates or renews the node's Lease in kube-node-lease, as the kubelet's
// heartbeat does.
func renewLease(ctx context.Context, client kubernetes.Interface, node string) {
	leases := client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
	} else if err == nil {
		l.Spec.RenewTime = &now
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	if err != nil {
		klog.ErrorS(err, "Failed to update lease", "node", klog.KRef("", node))
	}
}

// serve runs the HTTPS port behind the delegating authenticator and authorizer, as
// the kubelet's server does, until ctx ends.
func serve(ctx context.Context, o idle.Options, client kubernetes.Interface) error {
	authnConfig := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:               &apiserver.AnonymousAuthConfig{Enabled: false},
		CacheTTL:                2 * time.Minute,
		TokenAccessReviewClient: client.AuthenticationV1(),
		WebhookRetryBackoff:     &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5},
	}
	if o.ClientCA != "" {
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("client-ca-bundle", o.ClientCA)
		if err != nil {
			return err
		}
		go ca.Run(ctx, 1)
		authnConfig.ClientCertificateCAContentProvider = ca
	}
	authn, _, err := authnConfig.New()
	if err != nil {
		return err
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: client.AuthorizationV1(),
		AllowCacheTTL:             5 * time.Minute,
		DenyCacheTTL:              30 * time.Second,
		WebhookRetryBackoff:       authnConfig.WebhookRetryBackoff,
		// As nodekit's kubelet: the delegating authorizer has no match conditions,
		// so no CEL environment is built for them.
		Compiler: noCEL{},
	}.New()
	if err != nil {
		return err
	}
	metricsHandler := legacyregistry.HandlerWithReset()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.Handle("/metrics", metricsHandler)
	guarded := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, ok, err := authn.AuthenticateRequest(r)
		if err != nil || !ok {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		d, _, err := authz.Authorize(r.Context(), authorizer.AttributesRecord{
			User: resp.User, Verb: "get", Namespace: "", APIGroup: "", APIVersion: "v1",
			Resource: "nodes", Subresource: "metrics", Name: o.Node, ResourceRequest: true,
		})
		if err != nil || d != authorizer.DecisionAllow {
			http.Error(w, "Forbidden", http.StatusForbidden)
			return
		}
		mux.ServeHTTP(w, r)
	})
	return idle.Serve(ctx, o.Node, o.Port, guarded)
}

// noCEL compiles nothing: the delegating authorizer never has match conditions.
type noCEL struct{}

func (noCEL) CompileCELExpression(authorizationcel.ExpressionAccessor) (authorizationcel.CompilationResult, error) {
	return authorizationcel.CompilationResult{}, errors.New("floor: no match conditions")
}
