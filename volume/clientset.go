package volume

import (
	"context"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ClientsetSources reads straight from the API server through cs: every call is a
// request. Agents with many pods put informer caches in front instead; this is
// for small agents and tests.
func ClientsetSources(cs kubernetes.Interface) Sources { return clientsetSources{cs} }

type clientsetSources struct{ cs kubernetes.Interface }

func (c clientsetSources) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	return c.cs.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (c clientsetSources) Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	return c.cs.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (c clientsetSources) ServiceAccountToken(ctx context.Context, namespace, name string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	return c.cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
}
