// Command bare does internal/floor's work without client-go's clientset and
// without k8s.io/apiserver: client-go's REST client over a scheme of only the four
// API groups it uses (core, coordination, authentication, authorization), client
// certificates verified with crypto/x509, and TokenReview and SubjectAccessReview
// posted by hand. The pod start benchmark runs it beside floor to show how much of a
// kubelet's memory is the clientset and k8s.io/apiserver rather than the work itself.
//
// It is a measuring tool, not a design nodekit follows: the kubelet's port checks
// requests through k8s.io/apiserver's delegating authenticator and authorizer, the
// same code as upstream's (caches, retries, anonymous and x509 handling), and its
// libraries take client-go's kubernetes.Interface.
package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/agents/kubelet/internal/floor/idle"
)

// newScheme holds the four API groups bare reads and writes, and nothing else.
func newScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, coordinationv1.AddToScheme, authnv1.AddToScheme, authzv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	return scheme, nil
}

func client(base *rest.Config, scheme *runtime.Scheme, gv schema.GroupVersion) (*rest.RESTClient, error) {
	c := rest.CopyConfig(base)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	if gv.Group == "" {
		c.APIPath = "/api"
	}
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	c.ContentType = "application/vnd.kubernetes.protobuf"
	return rest.RESTClientFor(c)
}

func main() { idle.Main("bare", run) }

func run(ctx context.Context, o idle.Options) error {
	kubeconfig, node, clientCA := o.Kubeconfig, o.Node, o.ClientCA
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	scheme, err := newScheme()
	if err != nil {
		return err
	}
	core, err := client(rc, scheme, corev1.SchemeGroupVersion)
	if err != nil {
		return err
	}
	coord, err := client(rc, scheme, coordinationv1.SchemeGroupVersion)
	if err != nil {
		return err
	}
	authn, err := client(rc, scheme, authnv1.SchemeGroupVersion)
	if err != nil {
		return err
	}
	authz, err := client(rc, scheme, authzv1.SchemeGroupVersion)
	if err != nil {
		return err
	}
	if err := idle.Runtime(ctx, o.Endpoint, nil); err != nil {
		return err
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "nodekit.dev/floor", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110")}}}
	if err := core.Post().Resource("nodes").Body(n).Do(ctx).Error(); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("register node %s: %w", node, err)
	}
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: node + ".", Namespace: "default"}, InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node},
		Reason: "Starting", Message: "Starting bare.", Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "kubelet", Host: node},
		FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1}
	if err := core.Post().Namespace("default").Resource("events").Body(ev).Do(ctx).Error(); err != nil {
		klog.ErrorS(err, "Unable to write event")
	}
	for _, lw := range []struct {
		res string
		sel fields.Selector
		obj runtime.Object
	}{{"nodes", fields.OneTermEqualSelector("metadata.name", node), &corev1.Node{}}, {"pods", fields.OneTermEqualSelector("spec.nodeName", node), &corev1.Pod{}}} {
		inf := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(core, lw.res, "", lw.sel), lw.obj, 0, cache.Indexers{})
		go inf.RunWithContext(ctx)
	}
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		now := metav1.NewMicroTime(time.Now())
		l := &coordinationv1.Lease{}
		err := coord.Get().Namespace(corev1.NamespaceNodeLease).Resource("leases").Name(node).Do(ctx).Into(l)
		if apierrors.IsNotFound(err) {
			l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now}}
			err = coord.Post().Namespace(corev1.NamespaceNodeLease).Resource("leases").Body(l).Do(ctx).Error()
		} else if err == nil {
			l.Spec.RenewTime = &now
			err = coord.Put().Namespace(corev1.NamespaceNodeLease).Resource("leases").Name(node).Body(l).Do(ctx).Error()
		}
		if err != nil {
			klog.ErrorS(err, "lease")
		}
	}, 10*time.Second)
	pool := x509.NewCertPool()
	if clientCA != "" {
		b, err := os.ReadFile(clientCA)
		if err != nil {
			return err
		}
		if !pool.AppendCertsFromPEM(b) {
			return fmt.Errorf("%s: no certificate", clientCA)
		}
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var user string
		var groups []string
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			opts := x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
			if _, err := r.TLS.PeerCertificates[0].Verify(opts); err == nil {
				user, groups = r.TLS.PeerCertificates[0].Subject.CommonName, r.TLS.PeerCertificates[0].Subject.Organization
			}
		}
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); user == "" && ok {
			tr := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: tok}}
			if err := authn.Post().Resource("tokenreviews").Body(tr).Do(r.Context()).Into(tr); err == nil && tr.Status.Authenticated {
				user, groups = tr.Status.User.Username, tr.Status.User.Groups
			}
		}
		if user == "" {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: user, Groups: groups,
			ResourceAttributes: &authzv1.ResourceAttributes{Verb: "get", Resource: "nodes", Subresource: "metrics", Name: node}}}
		if err := authz.Post().Resource("subjectaccessreviews").Body(sar).Do(r.Context()).Into(sar); err != nil || !sar.Status.Allowed {
			http.Error(w, "Forbidden", http.StatusForbidden)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return idle.Serve(ctx, node, o.Port, h)
}
