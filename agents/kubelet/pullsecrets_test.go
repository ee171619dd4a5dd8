package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/podenv"
	"github.com/nodekit-dev/nodekit/podsync"
	"github.com/nodekit-dev/nodekit/podsync/podsynctest"
)

// authRecorder is podsynctest's runtime remembering the credentials of each pull.
type authRecorder struct {
	*podsynctest.Runtime
	mu    sync.Mutex
	auths []*runtimeapi.AuthConfig
}

func (r *authRecorder) PullImage(ctx context.Context, image string, auth *runtimeapi.AuthConfig, sb *runtimeapi.PodSandboxConfig) (string, error) {
	r.mu.Lock()
	r.auths = append(r.auths, auth)
	r.mu.Unlock()
	return r.Runtime.PullImage(ctx, image, auth, sb)
}

type secretEvents struct {
	mu   sync.Mutex
	list []string
}

func (e *secretEvents) Eventf(_ *corev1.Pod, eventType, reason, format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, eventType+" "+reason+" "+strings.TrimSpace(fmt.Sprintf(format, args...)))
}

func dockerSecret(name, registry, user, pass string) *corev1.Secret {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"` + registry + `":{"auth":"` + auth + `"}}}`)},
	}
}

// TestPullSecretsReachPullImage: the pod's imagePullSecrets, read from the API,
// give PullImage the credentials of the image's registry; a missing secret is
// an event and the pull goes on with the others.
func TestPullSecretsReachPullImage(t *testing.T) {
	client := fake.NewClientset(
		dockerSecret("reg", "registry.example:5000", "alice", "s3cret"),
		dockerSecret("other", "quay.example", "bob", "x"),
	)
	events := &secretEvents{}
	rt := &authRecorder{Runtime: podsynctest.New(nil)}
	rt.SetPullable("registry.example:5000/team/app:1", true)
	s, err := podsync.New(podsync.Config{
		Runtime: rt, Builder: &podsynctest.Builder{},
		Credentials: &pullSecretCredentials{secrets: podenv.ClientsetSource(client), events: events},
	})
	require.NoError(t, err)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "team", UID: "u1"},
		Spec: corev1.PodSpec{
			RestartPolicy:    corev1.RestartPolicyAlways,
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "missing"}, {Name: ""}, {Name: "other"}, {Name: "reg"}},
			Containers:       []corev1.Container{{Name: "app", Image: "registry.example:5000/team/app:1", ImagePullPolicy: corev1.PullAlways}},
		},
	}
	view, err := podsync.LoadView(context.Background(), rt, pod.UID, nil)
	require.NoError(t, err)
	res := s.SyncPod(context.Background(), pod, view)
	require.NoError(t, res.Error())

	rt.mu.Lock()
	defer rt.mu.Unlock()
	require.Len(t, rt.auths, 1)
	assert.Equal(t, &runtimeapi.AuthConfig{Username: "alice", Password: "s3cret"}, rt.auths[0])
	assert.Equal(t, []string{"Warning FailedToRetrieveImagePullSecret Unable to retrieve some image pull secrets (missing); attempting to pull the image may not succeed."}, events.list)
}

func TestPullSecretsNoneOrAnonymous(t *testing.T) {
	p := &pullSecretCredentials{secrets: podenv.ClientsetSource(fake.NewClientset(dockerSecret("reg", "registry.example", "a", "b"))), events: &secretEvents{}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "team"}}
	got, err := p.ImageAuth(context.Background(), pod, "busybox")
	require.NoError(t, err)
	assert.Nil(t, got, "no pull secrets: anonymous")
	pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "reg"}}
	got, err = p.ImageAuth(context.Background(), pod, "docker.io/library/busybox")
	require.NoError(t, err)
	assert.Nil(t, got, "no entry for the image's registry: anonymous")

	bad := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: "team"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":`)}}
	p.secrets = podenv.ClientsetSource(fake.NewClientset(bad))
	pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "bad"}}
	_, err = p.ImageAuth(context.Background(), pod, "busybox")
	require.ErrorIs(t, err, podsync.ErrInvalidPullSecret)
	assert.Contains(t, err.Error(), "team/bad")
}
