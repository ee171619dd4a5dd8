package podenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/podenv"
)

// TestAgainstAPIServer computes a container's environment from real objects,
// read with the identity of the node the pod is bound to (the Node authorizer
// lets it read only what its pods reference), and the Services the API server
// allocated, including the `kubernetes` master service it maintains itself.
func TestAgainstAPIServer(t *testing.T) {
	testenv.RequireLong(t)
	cp := controlplane.Start(t, controlplane.Options{})
	admin := cp.AdminClient()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, nodeName = "shop", "node-env"
	cp.CreateNode(t, nodeName)
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// No serviceaccount controller here: make the default account it would.
	_, err = admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	api, err := admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "cart-api"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "headless"},
		Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"LEVEL": "debug"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"}, StringData: map[string]string{"password": "hunter2"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// kube-apiserver's own controller makes the `kubernetes` Service once it runs,
	// which can be a moment after /readyz on a loaded machine.
	var master *corev1.Service
	require.Eventually(t, func() bool {
		master, err = admin.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "the kubernetes Service")

	pod, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "cart-0", Labels: map[string]string{"app": "cart"}},
		Spec: corev1.PodSpec{
			NodeName:                     nodeName,
			AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{
				Name: "app", Image: "busybox",
				EnvFrom: []corev1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}},
				Env: []corev1.EnvVar{
					{Name: "PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "password"}}},
					{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
					{Name: "API", Value: "http://$(CART_API_SERVICE_HOST):$(CART_API_SERVICE_PORT_HTTP)"},
				},
			}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.NotNil(t, pod.Spec.EnableServiceLinks, "the API server defaults enableServiceLinks")
	require.Equal(t, "v1", pod.Spec.Containers[0].Env[1].ValueFrom.FieldRef.APIVersion, "and fieldRef apiVersion")

	b, err := podenv.New(podenv.Config{Source: podenv.ClientsetSource(cp.NodeClient(nodeName))})
	require.NoError(t, err)
	var env map[string]string
	// The Node authorizer learns of the pod's references through a watch.
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		kvs, err := b.Env(ctx, pod, &pod.Spec.Containers[0], []string{"10.244.0.5"}, []string{"127.0.0.1"})
		if err != nil {
			t.Logf("Env: %v", err)
			return false, nil
		}
		env = map[string]string{}
		for _, kv := range kvs {
			env[kv.Key] = string(kv.Value)
		}
		return true, nil
	}))
	ip := api.Spec.ClusterIP
	assert.Equal(t, "debug", env["CFG_LEVEL"])
	assert.Equal(t, "hunter2", env["PASSWORD"])
	assert.Equal(t, "cart", env["APP"])
	assert.Equal(t, "http://"+ip+":80", env["API"])
	assert.Equal(t, master.Spec.ClusterIP, env["KUBERNETES_SERVICE_HOST"])
	assert.Equal(t, "443", env["KUBERNETES_SERVICE_PORT"])
	assert.Equal(t, "443", env["KUBERNETES_SERVICE_PORT_HTTPS"])
	assert.Equal(t, "tcp://"+master.Spec.ClusterIP+":443", env["KUBERNETES_PORT"])
	assert.Equal(t, "udp://"+ip+":53", env["CART_API_PORT_53_UDP"])
	assert.Equal(t, "53", env["CART_API_SERVICE_PORT_DNS"])
	assert.NotContains(t, env, "HEADLESS_SERVICE_HOST")
	assert.Len(t, env, 4+8+13, "own variables, master service, cart-api")
}
