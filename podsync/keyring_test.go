package podsync_test

import (
	"context"
	"encoding/base64"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/podsync"
	"github.com/nodekit-dev/nodekit/podsync/podsynctest"
)

func dockerJSONSecret(name, cfg string) corev1.Secret {
	return corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(cfg)}}
}

func users(auths []*runtimeapi.AuthConfig) []string {
	var out []string
	for _, a := range auths {
		out = append(out, a.Username+":"+a.Password)
	}
	return out
}

func TestPullSecretsKeyring(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))
	k, err := podsync.PullSecretsKeyring([]corev1.Secret{
		dockerJSONSecret("one", `{"auths": {
			"registry.example.com": {"username": "bob", "password": "pw"},
			"https://registry.example.com/team/": {"auth": "`+b64+`"},
			"*.corp.example": {"username": "corp", "password": "c"},
			"https://index.docker.io/v1/": {"username": "hub", "password": "h"},
			"127.0.0.1:5000": {"username": "local", "password": "l"}}}`),
		{ObjectMeta: metav1.ObjectMeta{Name: "legacy"}, Type: corev1.SecretTypeDockercfg,
			Data: map[string][]byte{corev1.DockerConfigKey: []byte(`{"quay.io": {"username": "q", "password": "qq"}}`)}},
		{ObjectMeta: metav1.ObjectMeta{Name: "opaque"}, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"x": []byte("y")}},
	})
	require.NoError(t, err)
	tests := map[string][]string{
		"registry.example.com/team/app:1": {"alice:s3cret", "bob:pw"}, // most specific first
		"registry.example.com/other:1":    {"bob:pw"},
		"eu.corp.example/x:1":             {"corp:c"},
		"a.eu.corp.example/x:1":           nil, // a glob stands for one label
		"busybox":                         {"hub:h"},
		"docker.io/library/busybox:1.36":  {"hub:h"},
		"127.0.0.1:5000/nodekit/busybox":  {"local:l"},
		"127.0.0.1:5001/nodekit/busybox":  nil,
		"quay.io/prometheus/node:1":       {"q:qq"},
		"ghcr.io/x/y:1":                   nil,
	}
	for image, want := range tests {
		assert.Equal(t, want, users(k.Lookup(image)), image)
	}

	_, err = podsync.PullSecretsKeyring([]corev1.Secret{dockerJSONSecret("broken", `{"auths": `)})
	require.ErrorIs(t, err, podsync.ErrInvalidPullSecret)
	assert.ErrorContains(t, err, "default/broken")
	_, err = podsync.PullSecretsKeyring([]corev1.Secret{dockerJSONSecret("badauth", `{"auths": {"r.io": {"auth": "bm9jb2xvbg"}}}`)})
	assert.ErrorContains(t, err, "must be formatted as base64(username:password)")
}

// authRuntime accepts pulls only with one password.
type authRuntime struct {
	*podsynctest.Runtime
	want  string
	tried []string
}

func (r *authRuntime) PullImage(ctx context.Context, image string, auth *runtimeapi.AuthConfig, sb *runtimeapi.PodSandboxConfig) (string, error) {
	r.tried = append(r.tried, auth.GetUsername())
	if auth.GetPassword() != r.want {
		return "", status.Errorf(codes.Unknown, "pull %s as %q: 401 Unauthorized", image, auth.GetUsername())
	}
	r.AddImage(image)
	return podsynctest.ImageRef(image), nil
}

func TestSyncPodTriesEachCredential(t *testing.T) {
	k, err := podsync.PullSecretsKeyring([]corev1.Secret{dockerJSONSecret("s", `{"auths": {
		"registry.example.com/team": {"username": "first", "password": "wrong"},
		"registry.example.com": {"username": "second", "password": "right"}}}`)})
	require.NoError(t, err)
	rt := &authRuntime{Runtime: podsynctest.New(nil), want: "right"}
	events := &podsynctest.Recorder{}
	s, err := podsync.New(podsync.Config{Runtime: rt, Builder: &podsynctest.Builder{}, Credentials: k, Events: events})
	require.NoError(t, err)
	pod := newPod(func(p *corev1.Pod) { p.Spec.Containers[0].Image = "registry.example.com/team/app:1" })
	require.NoError(t, s.SyncPod(context.Background(), pod, nil).Error())
	assert.Equal(t, []string{"first", "second"}, rt.tried, "most specific credential first, then the next")

	// All credentials wrong: both errors are reported, as the kubelet aggregates them.
	rt = &authRuntime{Runtime: podsynctest.New(nil), want: "nobody"}
	s, err = podsync.New(podsync.Config{Runtime: rt, Builder: &podsynctest.Builder{}, Credentials: k, Clock: nil})
	require.NoError(t, err)
	res := s.SyncPod(context.Background(), pod, nil)
	require.ErrorIs(t, res.Error(), podsync.ErrImagePull)
	v, err := podsync.LoadView(context.Background(), rt, pod.UID, nil)
	require.NoError(t, err)
	msg := s.PodStatus(pod, v, podsync.StatusInput{Now: time.Now()}).ContainerStatuses[0].State.Waiting.Message
	assert.Equal(t, `[rpc error: code = Unknown desc = pull registry.example.com/team/app:1 as "first": 401 Unauthorized, rpc error: code = Unknown desc = pull registry.example.com/team/app:1 as "second": 401 Unauthorized]`, msg)
}
