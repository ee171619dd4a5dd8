package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

func (n *testNode) events(t *testing.T, name string) []corev1.Event {
	t.Helper()
	list, err := n.admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	require.NoError(t, err)
	return list.Items
}

func hasEvent(events []corev1.Event, reason, msgPart string) bool {
	for _, e := range events {
		if e.Reason == reason && strings.Contains(e.Message, msgPart) {
			return true
		}
	}
	return false
}

func (n *testNode) exec(t *testing.T, pod *corev1.Pod, cmd ...string) (string, int) {
	t.Helper()
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, stderr, code, err := n.runtime.ExecSync(context.Background(), id, cmd, 10*time.Second)
	require.NoError(t, err, "exec %v: %s", cmd, stderr)
	return string(out), code
}

// TestKubeletWorkloads runs workloads as a cluster would schedule them onto a nodekit
// node: a Deployment through the real scheduler, probes, a Service's EndpointSlice,
// graceful deletion with preStop, configMap and service-account token volumes, and
// broken pods that must not disturb the others.
func TestKubeletWorkloads(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	cp := controlplane.Start(t, controlplane.Options{
		ControllerManager: true, Scheduler: true,
		Controllers: []string{"node-lifecycle-controller", "endpointslice-controller", "serviceaccount-controller",
			"root-ca-certificate-publisher-controller", "deployment-controller", "replicaset-controller"},
	})
	n := startNode(t, cp, "nk-node-w", true)
	n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
	image := n.ctd.BusyboxImage()
	ctx := context.Background()
	running := func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }

	t.Run("a 3-replica Deployment becomes Available through the scheduler", func(t *testing.T) {
		labels := map[string]string{"app": "web3"}
		dep := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "web3", Namespace: "default"},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr(int32(3)),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec:       busyboxPod("", image, corev1.RestartPolicyAlways, "sleep 3600").Spec,
				},
			},
		}
		_, err := n.admin.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{})
		require.NoError(t, err)
		eventually(t, 90*time.Second, "Deployment web3 Available with 3 replicas", func() (bool, string) {
			d, err := n.admin.AppsV1().Deployments("default").Get(ctx, "web3", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return d.Status.AvailableReplicas == 3, fmt.Sprintf("%+v", d.Status)
		})
		out := kubectl(t, cp, "get", "deployment", "web3", "--no-headers")
		assert.Regexp(t, `^web3\s+3/3\s+3\s+3\s`, out)
		pods, err := n.admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web3"})
		require.NoError(t, err)
		for _, p := range pods.Items {
			assert.Equal(t, n.name, p.Spec.NodeName, "bound by kube-scheduler to the nodekit node")
		}
	})

	t.Run("a failing liveness probe restarts the container with an Unhealthy event", func(t *testing.T) {
		p := busyboxPod("live", image, corev1.RestartPolicyAlways, "touch /tmp/healthy; sleep 3; rm /tmp/healthy; sleep 3600")
		p.Spec.Containers[0].LivenessProbe = &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/healthy"}}},
			PeriodSeconds:    1,
			FailureThreshold: 1,
		}
		n.createPod(t, p)
		got := n.waitPod(t, "live", 60*time.Second, "restarted by its liveness probe", func(p *corev1.Pod) bool {
			return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1
		})
		assert.NotNil(t, got.Status.ContainerStatuses[0].LastTerminationState.Terminated)
		ev := n.events(t, "live")
		assert.True(t, hasEvent(ev, "Unhealthy", "Liveness probe failed"), "events: %+v", ev)
		assert.True(t, hasEvent(ev, "Killing", "failed liveness probe, will be restarted"), "events: %+v", ev)
	})

	t.Run("readiness gates the pod's EndpointSlice entry", func(t *testing.T) {
		p := busyboxPod("ready", image, corev1.RestartPolicyAlways, "sleep 4; touch /tmp/ready; sleep 3600")
		p.Labels = map[string]string{"app": "ready"}
		p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/ready"}}},
			PeriodSeconds: 1,
		}
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "ready", Namespace: "default"},
			Spec:       corev1.ServiceSpec{Selector: p.Labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}
		_, err := n.admin.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		require.NoError(t, err)
		n.createPod(t, p)
		endpoint := func() (*discoveryv1.Endpoint, string) {
			list, err := n.admin.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=ready"})
			if err != nil {
				return nil, err.Error()
			}
			for _, s := range list.Items {
				for i := range s.Endpoints {
					return &s.Endpoints[i], fmt.Sprintf("%+v", s.Endpoints)
				}
			}
			return nil, "no endpoint yet"
		}
		eventually(t, 30*time.Second, "an unready endpoint while the readiness probe fails", func() (bool, string) {
			ep, state := endpoint()
			return ep != nil && ep.Conditions.Ready != nil && !*ep.Conditions.Ready, state
		})
		eventually(t, 30*time.Second, "the endpoint ready once the probe passes", func() (bool, string) {
			ep, state := endpoint()
			return ep != nil && ep.Conditions.Ready != nil && *ep.Conditions.Ready, state
		})
		got, err := n.admin.CoreV1().Pods("default").Get(ctx, "ready", metav1.GetOptions{})
		require.NoError(t, err)
		assert.True(t, podReady(got))
	})

	t.Run("graceful delete runs preStop and ends with the pod gone", func(t *testing.T) {
		hostDir := filepath.Join(n.dir, "prestop")
		require.NoError(t, os.MkdirAll(hostDir, 0o777))
		p := busyboxPod("graceful", image, corev1.RestartPolicyAlways, "trap 'exit 0' TERM; sleep 3600 & wait")
		p.Spec.TerminationGracePeriodSeconds = ptr(int64(20))
		p.Spec.Volumes = []corev1.Volume{{Name: "out", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostDir}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "out", MountPath: "/out"}}
		p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
			Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "sleep 2; echo stopped > /out/prestop"}},
		}}
		created := n.createPod(t, p)
		n.waitPod(t, "graceful", 60*time.Second, "Running", running)
		start := time.Now()
		require.NoError(t, n.admin.CoreV1().Pods("default").Delete(ctx, "graceful", metav1.DeleteOptions{}))
		eventually(t, 40*time.Second, "pod graceful gone from the API", func() (bool, string) {
			_, err := n.admin.CoreV1().Pods("default").Get(ctx, "graceful", metav1.GetOptions{})
			return err != nil, fmt.Sprint(err)
		})
		took := time.Since(start)
		t.Logf("graceful delete took %s", took.Round(100*time.Millisecond))
		assert.GreaterOrEqual(t, took, 2*time.Second, "the preStop hook's 2s ran before the pod went")
		assert.Less(t, took, 20*time.Second, "well within the grace period")
		b, err := os.ReadFile(filepath.Join(hostDir, "prestop"))
		require.NoError(t, err, "preStop wrote its file")
		assert.Equal(t, "stopped\n", string(b))
		eventually(t, 20*time.Second, "containers removed after the final delete", func() (bool, string) {
			cs := n.runtimeContainers(t, created.UID)
			return len(cs) == 0, fmt.Sprintf("%d containers left", len(cs))
		})
	})

	t.Run("a configMap update reaches the mounted file", func(t *testing.T) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "default"}, Data: map[string]string{"key": "one"}}
		_, err := n.admin.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{})
		require.NoError(t, err)
		p := busyboxPod("cfg", image, corev1.RestartPolicyAlways, "sleep 3600")
		p.Spec.Volumes = []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"},
		}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cfg", MountPath: "/cfg"}}
		n.createPod(t, p)
		got := n.waitPod(t, "cfg", 60*time.Second, "Running", running)
		out, code := n.exec(t, got, "cat", "/cfg/key")
		assert.Equal(t, 0, code)
		assert.Equal(t, "one", out)
		cm.Data["key"] = "two"
		_, err = n.admin.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{})
		require.NoError(t, err)
		start := time.Now()
		eventually(t, 60*time.Second, "the new value in the container", func() (bool, string) {
			out, _ := n.exec(t, got, "cat", "/cfg/key")
			return out == "two", out
		})
		t.Logf("configMap update visible in the container after %s", time.Since(start).Round(100*time.Millisecond))
	})

	t.Run("a projected service-account token authenticates from inside the pod", func(t *testing.T) {
		p := busyboxPod("token", image, corev1.RestartPolicyAlways, "sleep 3600")
		p.Spec.AutomountServiceAccountToken = nil // the ServiceAccount admission plugin adds kube-api-access-*
		n.createPod(t, p)
		got := n.waitPod(t, "token", 60*time.Second, "Running", running)
		token, code := n.exec(t, got, "cat", "/var/run/secrets/kubernetes.io/serviceaccount/token")
		require.Equal(t, 0, code)
		ns, _ := n.exec(t, got, "cat", "/var/run/secrets/kubernetes.io/serviceaccount/namespace")
		assert.Equal(t, "default", ns)
		ca, _ := n.exec(t, got, "cat", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
		assert.Contains(t, ca, "BEGIN CERTIFICATE")
		cfg := &rest.Config{Host: cp.URL(), BearerToken: strings.TrimSpace(token), TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
		client, err := kubernetes.NewForConfig(cfg)
		require.NoError(t, err)
		review, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		require.NoError(t, err)
		assert.Equal(t, "system:serviceaccount:default:default", review.Status.UserInfo.Username)
		assert.Equal(t, authenticationv1.ExtraValue{"token"}, review.Status.UserInfo.Extra["authentication.kubernetes.io/pod-name"])
	})

	t.Run("bad input gets a clear event and status; other pods keep running", func(t *testing.T) {
		unsupported := busyboxPod("bad-volume", image, corev1.RestartPolicyAlways, "sleep 3600")
		unsupported.Spec.Volumes = []corev1.Volume{{Name: "nfs", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "10.0.0.1", Path: "/x"}}}}
		unsupported.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "nfs", MountPath: "/nfs"}}
		n.createPod(t, unsupported)

		missingCM := busyboxPod("bad-configmap", image, corev1.RestartPolicyAlways, "sleep 3600")
		missingCM.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{
			ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "missing"}, Key: "k"},
		}}}
		n.createPod(t, missingCM)

		badKey := busyboxPod("bad-env", image, corev1.RestartPolicyAlways, "sleep 3600")
		badKey.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{
			ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "nope"},
		}}}
		n.createPod(t, badKey)

		noImage := busyboxPod("bad-image", "nodekit.test/does-not-exist:1", corev1.RestartPolicyAlways, "sleep 3600")
		n.createPod(t, noImage)

		waiting := func(reason string) func(*corev1.Pod) bool {
			return func(p *corev1.Pod) bool {
				return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
					p.Status.ContainerStatuses[0].State.Waiting.Reason == reason
			}
		}
		got := n.waitPod(t, "bad-configmap", 60*time.Second, "CreateContainerConfigError", waiting("CreateContainerConfigError"))
		assert.Equal(t, `configmap "missing" not found`, got.Status.ContainerStatuses[0].State.Waiting.Message)
		got = n.waitPod(t, "bad-env", 60*time.Second, "CreateContainerConfigError", waiting("CreateContainerConfigError"))
		assert.Equal(t, "couldn't find key nope in ConfigMap default/cfg", got.Status.ContainerStatuses[0].State.Waiting.Message)
		n.waitPod(t, "bad-image", 90*time.Second, "ErrImagePull or ImagePullBackOff", func(p *corev1.Pod) bool {
			return waiting("ErrImagePull")(p) || waiting("ImagePullBackOff")(p)
		})
		eventually(t, 60*time.Second, "a FailedMount event naming the unsupported volume", func() (bool, string) {
			ev := n.events(t, "bad-volume")
			return hasEvent(ev, "FailedMount", `"nfs"`), fmt.Sprintf("%+v", ev)
		})
		assert.True(t, hasEvent(n.events(t, "bad-image"), "Failed", "nodekit.test/does-not-exist:1"))
		// The rest of the node is unaffected.
		for _, name := range []string{"cfg", "token", "ready"} {
			p, err := n.admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, corev1.PodRunning, p.Status.Phase, name)
			assert.Equal(t, int32(0), p.Status.ContainerStatuses[0].RestartCount, name)
		}
	})
}

func ptr[T any](v T) *T { return &v }
