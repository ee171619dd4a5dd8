package main

import (
	"context"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/nodekit-dev/nodekit/podsync"
)

// Event reason for pull secrets the kubelet could not read.
const reasonFailedToRetrieveImagePullSecret = "FailedToRetrieveImagePullSecret"

// secretGetter reads one secret; podenv.Source (the API or nothing, standalone)
// satisfies it.
type secretGetter interface {
	Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
}

// pullSecretCredentials is podsync's Credentials as the kubelet resolves them: the
// pod's spec.imagePullSecrets (the ServiceAccount admission plugin has already
// copied the service account's into the spec; the kubelet never reads the service
// account), read from the API, turned into a docker keyring, and the entries
// matching the image tried in order.
//
// The agent calls refresh once per pod sync, as the kubelet's SyncPod calls
// getPullSecretsForPod whether or not an image is pulled: a secret that cannot be
// read is logged and reported by a FailedToRetrieveImagePullSecret event, and the
// pull goes on without it. ImageAuth then uses the secrets of that sync.
type pullSecretCredentials struct {
	secrets secretGetter
	events  podEvents

	mu    sync.Mutex
	byPod map[types.UID][]corev1.Secret
}

// refresh reads the pod's pull secrets for this sync.
func (p *pullSecretCredentials) refresh(ctx context.Context, pod *corev1.Pod) {
	secrets := p.read(ctx, pod)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byPod == nil {
		p.byPod = map[types.UID][]corev1.Secret{}
	}
	p.byPod[pod.UID] = secrets
}

// forget drops a pod that left the node.
func (p *pullSecretCredentials) forget(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byPod, uid)
}

func (p *pullSecretCredentials) read(ctx context.Context, pod *corev1.Pod) []corev1.Secret {
	if len(pod.Spec.ImagePullSecrets) == 0 || p.secrets == nil {
		return nil
	}
	var secrets []corev1.Secret
	var failed []string
	for _, ref := range pod.Spec.ImagePullSecrets {
		if ref.Name == "" {
			// The API accepted empty names once; the kubelet skips them quietly.
			continue
		}
		s, err := p.secrets.Secret(ctx, pod.Namespace, ref.Name)
		if err != nil {
			klog.InfoS("Unable to retrieve pull secret, the image pull may not succeed.", "pod", klog.KObj(pod),
				"secret", klog.KRef(pod.Namespace, ref.Name), "err", err)
			failed = append(failed, ref.Name)
			continue
		}
		secrets = append(secrets, *s)
	}
	if len(failed) > 0 && p.events != nil {
		p.events.Eventf(pod, corev1.EventTypeWarning, reasonFailedToRetrieveImagePullSecret,
			"Unable to retrieve some image pull secrets (%s); attempting to pull the image may not succeed.", strings.Join(failed, ", "))
	}
	return secrets
}

func (p *pullSecretCredentials) ImageAuth(ctx context.Context, pod *corev1.Pod, image string) ([]*runtimeapi.AuthConfig, error) {
	if len(pod.Spec.ImagePullSecrets) == 0 {
		return nil, nil
	}
	p.mu.Lock()
	secrets, ok := p.byPod[pod.UID]
	p.mu.Unlock()
	if !ok {
		secrets = p.read(ctx, pod)
	}
	// A secret whose docker config does not parse fails the pull, naming it.
	k, err := podsync.PullSecretsKeyring(secrets)
	if err != nil {
		return nil, err
	}
	return k.Lookup(image), nil
}
