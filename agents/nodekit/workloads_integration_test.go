package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/agents/nodekit/internal/cluster"
	"github.com/nodekit-dev/nodekit/internal/testenv"
)

// webScript is each web pod's command: it says where it serves (read back by kubectl
// logs), then serves its pod and node name on :8080 with busybox httpd.
const webScript = `mkdir -p /www && echo "$POD_NAME on $NODE_NAME" > /www/index.html && echo "serving $POD_NAME on $NODE_NAME" && exec httpd -f -p 8080 -h /www`

// TestUpWorkloads runs what a user does first on a three-node `nodekit up` cluster:
// a Deployment spread by the scheduler over every node, a Service answering from
// every node's pods by ClusterIP and by DNS name, kubectl logs and exec. Then the
// seed's two stories with real pods: a kube-proxy killed while a pod is replaced
// blackholes the new pod while every pod reads Running; a kubelet killed leaves its
// node Unknown while its pod keeps serving.
func TestUpWorkloads(t *testing.T) {
	peers, images, _ := upEnv(t)
	kubelet := agentBinary(t, "kubelet")
	kubeProxy := agentBinary(t, "kube-proxy")
	corednsTar := os.Getenv("NODEKIT_COREDNS_IMAGE_TAR")
	if corednsTar == "" {
		testenv.Unavailable(t, "NODEKIT_COREDNS_IMAGE_TAR is unset: export NODEKIT_COREDNS_IMAGE_TAR=$(hack/build-coredns.sh)")
	}
	kubectlBin := filepath.Join(peers, "kubectl")
	name := "w" + strconv.Itoa(os.Getpid()%100000)
	stateDir := filepath.Join(t.TempDir(), "state")
	env := []string{"NODEKIT_PEERS_DIR=" + peers, "NODEKIT_IMAGES_DIR=" + images}
	begin := time.Now()
	out, stderr, code := nodekit(t, env, "up", "--detach", "--name", name, "--state-dir", stateDir, "--api-port", strconv.Itoa(freePort(t)),
		"--nodes", "3", "--node-monitor-grace-period", "20s", "--kubelet-binary", kubelet, "--kube-proxy-binary", kubeProxy,
		"--coredns-image-tar", corednsTar)
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(stateDir, cluster.StateFile)); err == nil {
			_, e, _ := nodekit(t, nil, "down", "--state-dir", stateDir)
			t.Logf("cleanup down: %s", e)
		}
	})
	require.Equal(t, 0, code, "up: %s\n%s", out, stderr)
	upTook := time.Since(begin)
	kubeconfig := filepath.Join(stateDir, "kubeconfig")
	kubectl := func(args ...string) (string, error) {
		b, err := exec.Command(kubectlBin, append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
		return string(b), err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	client := kubernetes.NewForConfigOrDie(rc)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	st, err := cluster.LoadState(stateDir)
	require.NoError(t, err)
	require.Len(t, st.Nodes, 3)
	busybox := busyboxImage(t, images)

	// A first pod, timed from the start of `up` as a user would.
	client1 := clientPod("client", busybox, "node-1")
	_, err = client.CoreV1().Pods("default").Create(ctx, client1, metav1.CreateOptions{})
	require.NoError(t, err)
	waitRunning(ctx, t, client, "client")
	t.Logf("up --nodes 3 to all Ready %s; to a first pod Running %s", upTook.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))

	// A Deployment the scheduler must spread one pod per node.
	labels := map[string]string{"app": "web"}
	_, err = client.AppsV1().Deployments("default").Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](3),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
					}},
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers: []corev1.Container{{
						Name: "web", Image: busybox, Command: []string{"sh", "-c", webScript},
						Env: []corev1.EnvVar{
							{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
							{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
						},
						Ports:          []corev1.ContainerPort{{ContainerPort: 8080}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
					}},
				},
			},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	svc, err := client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	var pods []corev1.Pod
	assert.Eventually(t, func() bool {
		l, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil || len(l.Items) != 3 {
			return false
		}
		for _, p := range l.Items {
			if !podIsReady(&p) {
				return false
			}
		}
		pods = l.Items
		return true
	}, 90*time.Second, 250*time.Millisecond, "three web pods Ready")
	if t.Failed() {
		out, _ := kubectl("get", "pods", "-A", "-o", "wide")
		t.Logf("pods:\n%s", out)
		out, _ = kubectl("describe", "pods", "-l", "app=web")
		t.Logf("describe:\n%s", out)
		t.FailNow()
	}
	nodes := map[string]bool{}
	for _, p := range pods {
		nodes[p.Spec.NodeName] = true
	}
	assert.Len(t, nodes, 3, "the scheduler spreads one web pod per node")

	// From another pod, the Service answers by ClusterIP and by name, from every node's pod.
	fetch := func(target string) (string, error) {
		return kubectl("exec", "client", "--", "timeout", "3", "wget", "-q", "-O", "-", target)
	}
	seen := map[string]bool{}
	require.Eventually(t, func() bool {
		out, err := fetch("http://" + svc.Spec.ClusterIP + "/")
		if err == nil {
			_, node, _ := strings.Cut(strings.TrimSpace(out), " on ")
			seen[node] = true
		}
		return len(seen) == 3
	}, 60*time.Second, 50*time.Millisecond, "requests to the ClusterIP from node-1 must reach the pods on all three nodes (seen %v)", seen)
	// CoreDNS may still be starting: it answers once its pods are Ready.
	var byName string
	ok := assert.Eventually(t, func() bool {
		byName, err = fetch("http://web.default.svc.cluster.local/")
		return err == nil
	}, 60*time.Second, 500*time.Millisecond, "the Service by its DNS name")
	if !ok {
		ns, _ := kubectl("exec", "client", "--", "nslookup", "web.default.svc.cluster.local")
		pods, _ := kubectl("get", "pods", "-n", "kube-system", "-o", "wide")
		t.Fatalf("by DNS name: %s\nnslookup: %s\n%s", byName, ns, pods)
	}
	assert.Regexp(t, `^web-\S+ on node-\d\n$`, byName)

	// kubectl logs and exec through the kubelets' servers.
	web := pods[0]
	out, err = kubectl("logs", web.Name)
	require.NoError(t, err, out)
	assert.Equal(t, "serving "+web.Name+" on "+web.Spec.NodeName+"\n", out)
	out, err = kubectl("exec", web.Name, "--", "cat", "/www/index.html")
	require.NoError(t, err, out)
	assert.Equal(t, web.Name+" on "+web.Spec.NodeName+"\n", out)
	cmd := exec.Command(kubectlBin, "--kubeconfig", kubeconfig, "exec", "client", "--", "sh", "-c", "exit 3")
	_, err = cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr)
	assert.Equal(t, 3, exitErr.ExitCode(), "kubectl exec passes the command's exit code")

	// Story: kube-proxy on node-1 dies, then a pod is replaced. node-1's rules still aim at
	// the old pod; the new one gets nothing from node-1, while every pod reads Running.
	kp := processOf(st, "kube-proxy", "node-1")
	require.NoError(t, syscall.Kill(kp.PID, syscall.SIGKILL))
	require.Eventually(t, func() bool { return !kp.Alive() }, 10*time.Second, 50*time.Millisecond)
	var victim corev1.Pod
	for _, p := range pods {
		if p.Spec.NodeName != "node-1" {
			victim = p
			break
		}
	}
	require.NoError(t, client.CoreV1().Pods("default").Delete(ctx, victim.Name, metav1.DeleteOptions{}))
	var replacement corev1.Pod
	require.Eventually(t, func() bool {
		l, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false
		}
		ready := 0
		for _, p := range l.Items {
			if p.DeletionTimestamp != nil {
				return false
			}
			if p.Name != victim.Name && podIsReady(&p) {
				ready++
				if p.Status.PodIP != victim.Status.PodIP && !containsPod(pods, p.Name) {
					replacement = p
				}
			}
		}
		return ready == 3 && replacement.Name != ""
	}, 90*time.Second, 250*time.Millisecond, "the Deployment replaces the deleted pod")
	failed, answered := 0, map[string]bool{}
	for range 30 {
		out, err := fetch("http://" + svc.Spec.ClusterIP + "/")
		if err != nil {
			failed++
			continue
		}
		answered[strings.Fields(out)[0]] = true
	}
	t.Logf("kube-proxy dead on node-1, %s replaced by %s: %d of 30 requests failed, answered by %v", victim.Name, replacement.Name, failed, answered)
	assert.Positive(t, failed, "requests node-1's stale rules send to the deleted pod's IP must fail")
	assert.False(t, answered[replacement.Name], "the replacement pod gets no traffic through node-1's stale rules")
	out, code = nodekit2(t, "explain", "service", "default/web", "--node", "node-1", "--state-dir", stateDir)
	t.Logf("explain service default/web --node node-1:\n%s", out)
	assert.Equal(t, exitUnhealthy, code)
	assert.Contains(t, out, "KubeProxyDown")
	assert.Contains(t, out, victim.Status.PodIP)
	_, stderr, code = nodekit(t, nil, "restart", "kube-proxy", "--node", "node-1", "--state-dir", stateDir)
	require.Equal(t, 0, code, stderr)
	require.Eventually(t, func() bool {
		out, err := fetch("http://" + svc.Spec.ClusterIP + "/")
		return err == nil && strings.HasPrefix(out, replacement.Name+" ")
	}, 60*time.Second, 50*time.Millisecond, "kube-proxy restarted: the replacement pod must get traffic from node-1")

	// Story: node-3's kubelet dies. The node goes Unknown; its pod keeps serving.
	st, err = cluster.LoadState(stateDir)
	require.NoError(t, err)
	var onNode3 corev1.Pod
	l, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	require.NoError(t, err)
	for _, p := range l.Items {
		if p.Spec.NodeName == "node-3" {
			onNode3 = p
		}
	}
	require.NotEmpty(t, onNode3.Name, "a web pod on node-3")
	kl := processOf(st, "kubelet", "node-3")
	require.NoError(t, syscall.Kill(kl.PID, syscall.SIGKILL))
	require.Eventually(t, func() bool { return readyCondition(ctx, client, "node-3").Status == corev1.ConditionUnknown },
		60*time.Second, 250*time.Millisecond, "node-3 Unknown after the 20s grace period")
	out, err = fetch(fmt.Sprintf("http://%s:8080/", onNode3.Status.PodIP))
	require.NoError(t, err, "the pod on the silent node must still serve: %s", out)
	assert.Equal(t, onNode3.Name+" on node-3\n", out)
	out, code = nodekit2(t, "explain", "node", "node-3", "--state-dir", stateDir)
	t.Logf("explain node node-3:\n%s", out)
	assert.Equal(t, exitUnhealthy, code)
	assert.Contains(t, out, "node/node-3: KubeletSilent (NOT healthy)")

	_, stderr, code = nodekit(t, nil, "down", "--state-dir", stateDir)
	require.Equal(t, 0, code, stderr)
	assert.Empty(t, netnsWithPrefix(t, "nk-"+name+"-"))
	for _, n := range st.Nodes {
		require.NotEmpty(t, n.CgroupRoot, "each node's kubelet has a cgroupRoot of its own")
		for _, dir := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup"} {
			_, err := os.Stat(filepath.Join(dir, n.CgroupRoot))
			assert.True(t, os.IsNotExist(err), "down removes %s under %s: %v", n.CgroupRoot, dir, err)
		}
	}
}

func clientPod(name, image, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers:                    []corev1.Container{{Name: name, Image: image, Command: []string{"sleep", "3600"}}},
		},
	}
}

func waitRunning(ctx context.Context, t *testing.T, client kubernetes.Interface, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		p, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	}, 60*time.Second, 50*time.Millisecond, "pod %s Running", name)
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func containsPod(pods []corev1.Pod, name string) bool {
	for _, p := range pods {
		if p.Name == name {
			return true
		}
	}
	return false
}

// busyboxImage is the busybox image's name from the images folder's images.tsv.
func busyboxImage(t *testing.T, images string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(images, "images.tsv"))
	require.NoError(t, err)
	for line := range strings.Lines(string(b)) {
		if f := strings.Split(strings.TrimSpace(line), "\t"); len(f) == 3 && f[0] == "busybox" {
			return f[1]
		}
	}
	t.Fatalf("%s/images.tsv names no busybox image", images)
	return ""
}
