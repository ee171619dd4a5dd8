package podenv

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ClientsetSource reads straight from the API server through cs: every call is a
// request. Agents with many pods put informer caches in front instead (the
// kubelet watches the objects its pods use); this is for small agents and tests.
func ClientsetSource(cs kubernetes.Interface) Source { return clientsetSource{cs} }

type clientsetSource struct{ cs kubernetes.Interface }

func (c clientsetSource) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	return c.cs.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (c clientsetSource) Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	return c.cs.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (c clientsetSource) Services(ctx context.Context, namespace string) ([]*corev1.Service, error) {
	list, err := c.cs.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]*corev1.Service, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out, nil
}
